"""What a start checks before it writes anything: the models resolve, the broker answers.

A start that fails here leaves the run directory as it was (a corrected config then starts
the run, instead of being refused as "run exists"), and says why in one line.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.messages import BrokerLoginRefused, BrokerUnavailable, connect
from agentrl.trainer import check_hub_model, resolve_model

from ..config.schema import RunConfig

__all__ = ["PROBE_TIMEOUT", "broker_problem", "check_models"]

PROBE_TIMEOUT = 5.0
"""Seconds a start waits for the broker to answer before it gives up (one line, exit 2)."""


def check_models(cfg: RunConfig) -> None:
    """Resolve the policy model and every pool's own model (converting once, cached);
    raises `agentrl.trainer.ModelError` (e.g. ModelNotFound) for the first that cannot be.
    A hub name must be in the local cache or confirmed by the hub (`check_hub_model`)."""
    for spec in [cfg.model, *(pool.model for pool in cfg.pools.values() if pool.model)]:
        if not Path(resolve_model(spec)).is_dir():  # a hub name, downloaded at load
            check_hub_model(spec)


def broker_problem(broker: str, name: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why this start cannot use ``broker`` (a refused login, or nothing answering within
    ``timeout`` seconds), in one line; None when it let us in (and always for memory://)."""
    if broker.startswith("memory://"):
        return None
    try:
        connect(broker, name=name, connect_timeout=timeout).close()
    except BrokerLoginRefused as exc:
        return str(exc)
    except BrokerUnavailable as exc:
        return (
            f"{exc}: is RabbitMQ running there? (or use --broker memory:// for a one-process run)"
        )
    return None

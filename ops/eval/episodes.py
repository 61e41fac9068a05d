"""The eval's episodes: a sampler and a rollout actor on a fresh in-process broker.

`run_episodes` publishes the requests and reads the trajectories back; when an
actor stops before the last one, its `EvalError` names the actor and the
exception that stopped it (with its notes: the rollout adds the episode, task
and index it was running) instead of pointing at a log the user may not see.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from agentrl.actors import (
    EpisodeLimits,
    RolloutActor,
    SamplerActor,
    SamplerEngine,
    TopologySpec,
    declare,
)
from agentrl.environments import ChatFormat, Environment
from agentrl.messages import (
    CheckpointQuery,
    CheckpointReady,
    Delivery,
    EpisodeRequest,
    Trajectory,
    connect,
    decode,
    encode,
)
from agentrl.messages._memory import reset_memory_broker
from agentrl.trainer import load_tokenizer

__all__ = ["EvalError", "run_episodes"]

_POOL = "eval"


class EvalError(Exception):
    """Raised when the evaluation cannot run (bad arguments) or an actor stopped mid-way."""


def run_episodes(
    weights: Path,
    environments: dict[str, Environment],
    requests: list[EpisodeRequest],
    *,
    limits: EpisodeLimits,
    engine_factory: Callable[[], SamplerEngine],
    concurrency: int,
    seed: int,
    on_progress: Callable[[int, int], None] | None,
) -> list[Trajectory]:
    """Publish `requests` to a sampler + rollout pair on a fresh broker; their trajectories."""
    broker_name = f"eval-{uuid.uuid4().hex[:8]}"
    broker = f"memory://{broker_name}"
    spec = TopologySpec(run="eval", pools=(_POOL,), trajectory_capacity=len(requests))
    transport = connect(broker, name="eval-client")
    names = declare(transport, spec)
    failures: dict[str, BaseException] = {}  # actor -> what stopped it
    received: dict[str, Trajectory] = {}  # by episode_id: a redelivery is counted once
    lock = threading.Lock()
    all_in = threading.Event()

    def on_trajectory(delivery: Delivery) -> None:
        traj = decode(delivery.body, expect=Trajectory).payload
        with lock:
            received[traj.episode_id] = traj
            if len(received) == len(requests):
                all_in.set()
        delivery.ack()

    def on_query(delivery: Delivery) -> None:
        # The sampler's start-up question to the controller: the weights it has are the latest.
        decode(delivery.body, expect=CheckpointQuery)
        ready = CheckpointReady(version=0, uri=str(weights), digest="", created_at=time.time())
        transport.reply(delivery, encode(ready, run=spec.run))
        delivery.ack()

    refs = []
    try:
        transport.consume(names.control_rpc, on_query, prefetch=1)
        transport.consume(names.trajectories, on_trajectory, prefetch=concurrency)
        refs.append(
            _recording(SamplerActor, "sampler", failures).start(
                broker=broker,
                topology=spec,
                pool=_POOL,
                every=1,
                engine_factory=engine_factory,
                sampler_id="eval-sampler",
                prefetch=2 * concurrency,
            )
        )
        refs.append(
            _recording(RolloutActor, "rollout", failures).start(
                broker=broker,
                topology=spec,
                environments=environments,
                chat_format=ChatFormat(load_tokenizer(weights)),
                pool_weights={_POOL: 1.0},
                limits=limits,
                concurrency=concurrency,
                rollout_id="eval-rollout",
                seed=seed,
                # a task that fails most of its attempts ends the evaluation, said in one line
                on_fatal=lambda line: failures.setdefault("rollout", RuntimeError(line)),
                failure_window=10,
            )
        )
        sent = [transport.publish("", names.episodes, encode(r, run=spec.run)) for r in requests]
        for future in sent:
            future.result()
        reported = -1
        while not all_in.wait(timeout=0.5):
            with lock:
                done = len(received)
            if on_progress is not None and done != reported:
                on_progress(done, len(requests))
                reported = done
            if not all(ref.is_alive() for ref in refs):
                why = "; ".join(f"the {a} actor: {_chain(e)}" for a, e in failures.items())
                raise EvalError(
                    f"stopped after {done} of {len(requests)} episodes: "
                    f"{why or 'an actor stopped without an exception'}"
                )
        if on_progress is not None:
            on_progress(len(requests), len(requests))
    finally:
        for ref in reversed(refs):  # rollout first: no new generate requests
            if ref.is_alive():
                ref.stop(block=True, timeout=60)
        transport.close()
        reset_memory_broker(broker_name)
    return list(received.values())


def _recording(cls: type, name: str, failures: dict[str, BaseException]) -> type:
    """``cls`` that writes the exception that stops it into ``failures[name]``."""

    class Recording(cls):
        def on_failure(self, exc_type, exc_value, traceback) -> None:
            failures[name] = exc_value
            super().on_failure(exc_type, exc_value, traceback)

    Recording.__name__ = cls.__name__
    return Recording


def _chain(exc: BaseException) -> str:
    """An exception, its notes and its causes, on one line (outermost first)."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 5:
        notes = "".join(f" ({note})" for note in getattr(seen, "__notes__", ()))
        parts.append(f"{type(seen).__name__}: {seen}{notes}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)

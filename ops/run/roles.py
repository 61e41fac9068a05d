"""The roles of a run, and each role's actor arguments built from the run's config
(builder functions: the actors never see the config object).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from agentrl.actors import (
    EpisodeLimits,
    SamplerEngine,
    TaskEntry,
    TopologySpec,
)
from agentrl.actors._checkpoint import missing_rows
from agentrl.actors._env_registry import RegistryTimes
from agentrl.actors._ledger import LEDGER_DIR
from agentrl.actors._trace_store import TRACE_FILE, TraceWriter
from agentrl.environments import ChatFormat, make_task
from agentrl.messages import CheckpointReady
from agentrl.trainer import LearnerBackend, resolve_model

from ..config.schema import RunConfig
from ..report.tensorboard import EventWriter
from .disk import PARAM_BYTES, DiskCheck
from .engines import torch_pool_engine, vllm_pool_engine
from .progress import EpisodeTally

log = structlog.get_logger(__name__)

__all__ = [
    "DEFAULT_ROLES",
    "ROLES",
    "controller_args",
    "learner_args",
    "rollout_args",
    "sampler_args",
]

ROLES = ("controller", "rollout", "sampler", "learner", "env", "serve")
DEFAULT_ROLES = ("controller", "rollout", "sampler", "learner", "env")
"""What a start runs unless ``--roles`` says otherwise: ``serve`` (the OpenAI-compatible
endpoint, `agentrl.ops.serve`) only when asked for."""


def learner_args(
    cfg: RunConfig,
    spec: TopologySpec,
    weights: Path,
    version: int,
    tokenizer,
    *,
    make_backend: Callable[[Path, int], LearnerBackend],
    first_version: int,
    keep_metrics: Callable[[dict[str, float]], None],
    done: threading.Event,
    node: str,
    on_fatal: Callable[[str], None],
) -> dict:
    """The `LearnerActor`'s arguments: its metrics go to ``metrics.jsonl``, TensorBoard and
    `keep_metrics` (the progress line's latest), the best and worst episode of each update
    to ``samples.jsonl``."""
    ln = cfg.learner
    metrics_path = cfg.run_dir / "metrics.jsonl"
    events = EventWriter(cfg.run_dir / "tensorboard")

    def on_metrics(values: dict[str, float], now: float | None = None) -> None:
        now = time.time() if now is None else now
        keep_metrics(values)
        with metrics_path.open("a") as fh:
            fh.write(json.dumps({"time": now, **values}) + "\n")
        events.add_scalars(int(values.get("version", 0)), values, wall_time=now)

    for row in missing_rows(cfg.run_dir / "checkpoints", metrics_path):
        log.info("metrics row recovered from its checkpoint", version=row.get("version"))
        on_metrics({k: v for k, v in row.items() if k != "time"}, row.get("time"))

    samples_path = cfg.run_dir / "samples.jsonl"

    def on_batch(version: int, batch: list) -> None:
        """Keep the best and the worst episode of each update, decoded, for reading."""
        ranked = sorted(batch, key=lambda t: t.reward)
        with samples_path.open("a") as fh:
            for t in {id(x): x for x in (ranked[-1], ranked[0])}.values():
                record = {
                    "version": version,
                    "task": t.task,
                    "index": t.index,
                    "status": t.status,
                    "reward": t.reward,
                    "text": tokenizer.decode(t.token_ids),
                }
                fh.write(json.dumps(record) + "\n")

    return dict(
        broker=cfg.broker,
        topology=spec,
        backend_factory=functools.partial(make_backend, weights, version),
        checkpoint_dir=cfg.run_dir / "checkpoints",
        start_version=version,
        group_size=cfg.rollout.group_size,
        groups_per_batch=cfg.rollout.groups_per_batch,
        hard_staleness=cfg.staleness.hard,
        max_token_lag=cfg.staleness.max_token_lag,
        task_normalize=ln.task_normalize,
        task_center=ln.task_center,
        drop_flat_groups=ln.drop_flat_groups,
        group_timeout=cfg.staleness.group_timeout,
        prefetch=cfg.episodes_per_batch * (cfg.staleness.max + 2),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        max_steps=cfg.max_steps,
        first_version=first_version,
        ledger_dir=cfg.run_dir / LEDGER_DIR,
        on_metrics=on_metrics,
        on_batch=on_batch,
        done=done,
        keep_checkpoints=ln.keep_checkpoints,
        node=node,
        disk_problem=DiskCheck(
            cfg.run_dir / "checkpoints",
            model_dir=resolve_model(cfg.model),
            state_dir=cfg.run_dir / "learner_state",
            param_bytes=PARAM_BYTES[ln.dtype],
        ).problem,
        on_fatal=on_fatal,
        trace=functools.partial(
            TraceWriter, cfg.run_dir / TRACE_FILE, tokenizer=str(resolve_model(cfg.model))
        ),
    )


def sampler_args(
    cfg: RunConfig,
    spec: TopologySpec,
    weights: Path,
    version: int,
    *,
    node: str,
    make_engine: Callable[[Path, int, int], SamplerEngine] | None,
) -> Iterator[tuple[str, dict]]:
    """Each sampler of each pool: its actor name and its `SamplerActor`'s arguments.

    `make_engine` replaces every pool's engine (its ``engine``: torch or vllm)."""
    for pool, pc in cfg.pools.items():
        pool_weights = resolve_model(pc.model) if pc.model else weights
        device = pc.device or cfg.learner.device
        pool_engine = make_engine or (
            functools.partial(vllm_pool_engine, cfg, device=device)
            if pc.engine == "vllm"
            else functools.partial(
                torch_pool_engine,
                cfg,
                prefix_cache_tokens=pc.prefix_cache_tokens,
                device=device,
            )
        )
        for i in range(pc.replicas):
            yield (
                f"sampler-{pool}-{i}",
                dict(
                    broker=cfg.broker,
                    topology=spec,
                    pool=pool,
                    every=pc.every,
                    engine_factory=functools.partial(
                        pool_engine, pool_weights, version, pc.max_batch
                    ),
                    sampler_id=f"sampler-{node}-{pool}-{i}",
                    node=node,
                    prefetch=2 * pc.max_batch,
                ),
            )


def controller_args(
    cfg: RunConfig,
    spec: TopologySpec,
    initial: CheckpointReady,
    *,
    first_version: int,
    untrained_gone: bool,
) -> dict:
    """The `ControllerActor`'s arguments: the task catalogue, the batch and staleness
    sizes, the environment registry's times."""
    return dict(
        broker=cfg.broker,
        topology=spec,
        tasks={
            name: TaskEntry(
                weight=t.weight,
                num_instances=make_task(t.factory(name), **t.options).num_instances,
                schedule=tuple((v, w) for v, w in t.schedule) if t.schedule else None,
            )
            for name, t in cfg.tasks.items()
        },
        group_size=cfg.rollout.group_size,
        episodes_per_batch=cfg.episodes_per_batch,
        max_staleness=cfg.staleness.max,
        initial=initial,
        seed=cfg.seed,
        env_times=RegistryTimes(
            cfg.env_registry.unresponsive_after,
            cfg.env_registry.dead_after,
            cfg.env_registry.orphan_grace,
            cfg.env_registry.idle_limit,
        ),
        reconcile_interval=cfg.env_registry.reconcile_interval,
        ledger_dir=cfg.run_dir / LEDGER_DIR,
        first_version=first_version,
        untrained_gone=untrained_gone,
    )


def rollout_args(
    cfg: RunConfig,
    spec: TopologySpec,
    tokenizer,
    i: int,
    *,
    node: str,
    tally: EpisodeTally,
    on_fatal=None,
) -> dict:
    """Rollout worker `i`'s `RolloutActor` arguments: the local tasks' environments, the
    episode limits; its episodes are counted in `tally` (the progress line)."""
    r = cfg.rollout
    return dict(
        broker=cfg.broker,
        topology=spec,
        environments={
            n: make_task(t.factory(n), **t.options) for n, t in cfg.tasks.items() if not t.remote
        },
        remote_tasks=[n for n, t in cfg.tasks.items() if t.remote],
        chat_format=ChatFormat(tokenizer),
        pool_weights={p: pc.weight for p, pc in cfg.pools.items()},
        limits=EpisodeLimits(
            max_turns=r.max_turns,
            max_tokens=r.max_tokens,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            penalty=r.penalty,
            generate_timeout=r.generate_timeout,
        ),
        concurrency=r.concurrency,
        rollout_id=f"rollout-{node}-{i}",
        on_episode=tally.add,
        on_running=tally.running,
        on_fatal=on_fatal,
        env_timeout=r.task_timeout,
        failure_window=r.failure_window,
        node=node,
        seed=cfg.seed + i,
    )

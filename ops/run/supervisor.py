"""Build the actors of a run from its config, start them, watch them, stop them.

Builder functions turn the config into plain constructor arguments; actors
never see the config object.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pykka
import structlog
import torch
import yaml

from agentrl.actors import (
    ControllerActor,
    EpisodeLimits,
    LearnerActor,
    RolloutActor,
    SamplerActor,
    SamplerEngine,
    TaskEntry,
    TopologySpec,
    TorchEngine,
    declare,
    decode_or_dead_letter,
    subscribe,
)
from agentrl.actors._checkpoint import missing_rows
from agentrl.actors._env_registry import RegistryTimes
from agentrl.actors._ledger import LEDGER_DIR
from agentrl.actors._trace_store import TRACE_FILE, TraceWriter
from agentrl.actors.engines.vllm.engine import VLLMEngine
from agentrl.environments import ChatFormat, make_task
from agentrl.environments._containers import ENV_WORKER_IMAGE, EnvWorkerContainers
from agentrl.environments._worker import EnvWorker
from agentrl.messages import (
    BrokerRefused,
    CheckpointReady,
    ControlCommand,
    Delivery,
    Topology,
    Transport,
    Unroutable,
    connect,
    encode,
)
from agentrl.trainer import (
    LearnerBackend,
    LoraSpec,
    TorchLearner,
    checkpoint_digest,
    load_tokenizer,
    resolve_model,
)

from ..config.load import RunConfig
from ..report.tensorboard import EventWriter
from ..sft.warm_start import kl_reference, read_warm_start
from .disk import DiskCheck
from .interrupt import Interrupts
from .node import FATAL_EXIT
from .preflight import check_models
from .progress import EpisodeTally, Progress, format_summary
from .run_lock import LOCK_WAIT, RunLock, RunLocked, hold_run_lock, take_learner_lock

log = structlog.get_logger(__name__)

__all__ = [
    "DEFAULT_ROLES",
    "ROLES",
    "RunLocked",
    "Supervisor",
    "latest_checkpoint",
    "take_learner_lock",
    "torch_engine",
]

ROLES = ("controller", "rollout", "sampler", "learner", "env", "serve")
DEFAULT_ROLES = ("controller", "rollout", "sampler", "learner", "env")
"""What a start runs unless ``--roles`` says otherwise: ``serve`` (the OpenAI-compatible
endpoint, `agentrl.ops.serve`) only when asked for."""


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (one with a DIGEST file) under `ckpt_dir`."""
    found = [
        (int(p.name[1:]), p)
        for p in ckpt_dir.glob("v[0-9]*")
        if p.is_dir() and (p / "DIGEST").exists()
    ]
    return max(found) if found else None


def torch_engine(
    weights: Path,
    version: int,
    max_batch: int,
    *,
    dtype: str,
    seed: int,
    prefix_cache_tokens: int = 16384,
    device: str = "cpu",
) -> SamplerEngine:
    """The torch sampler engine on `weights` and `device`, its generations labelled `version`.

    The signature (after the keywords are bound) is the `make_engine` of
    `Supervisor` and of `evaluate`.
    """
    return TorchEngine(
        weights,
        device=device,
        max_batch=max_batch,
        dtype=dtype,
        seed=seed,
        version=version,
        prefix_cache_tokens=prefix_cache_tokens,
    )


class Supervisor:
    """Runs the roles of one node in this process until done, interrupted or broken."""

    def __init__(
        self,
        cfg: RunConfig,
        roles: tuple[str, ...] = DEFAULT_ROLES,
        *,
        make_engine: Callable[[Path, int, int], SamplerEngine] | None = None,
        make_backend: Callable[[Path, int], LearnerBackend] | None = None,
        node: str | None = None,
        fresh: bool | None = None,
        run_lock: RunLock | None = None,
    ) -> None:
        """Run `roles` of `cfg` on this node.

        `make_engine(weights, version, max_batch)` and `make_backend(weights, version)`
        replace every pool's engine (its `engine`: torch or vllm) and the torch learner (the
        scheduling benchmark plugs in simulated ones). `fresh`: this is the first start of
        the run, so a learner here first deletes an earlier same-named run's queues (default:
        no earlier start left its config in the run directory). `run_lock`: the run
        directory's lock, already taken by the caller (else `run` takes it for a learner).
        """
        unknown = set(roles) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; known: {', '.join(ROLES)}")
        self.cfg = cfg
        self.roles = roles
        self.node = node or socket.gethostname()
        self._make_engine = make_engine
        self._make_backend = make_backend or (
            self._megatron_backend if cfg.learner.backend == "megatron" else self._torch_backend
        )
        self._backend: LearnerBackend | None = None  # the megatron one, closed in stop()
        self.done = threading.Event()
        self._refs: list[tuple[str, pykka.ActorRef]] = []
        self._workers: list[EnvWorker] = []
        self.server = None
        """The endpoint (`agentrl.ops.serve.ServeServer`) when this node has the serve role."""
        self._containers: EnvWorkerContainers | None = None
        self._metrics_lock = threading.Lock()
        self.last_metrics: dict[str, float] = {}
        self._start_version = 0
        self.stop_failed = False
        """An actor did not stop within its timeout (logged; `run` then returns 1)."""
        self._lock: Transport | None = None
        self._run_lock = run_lock
        self.fatal: str | None = None
        """Why the learner stopped the run when it could not go on (a full disk), in words."""
        self.fresh = earlier_start(cfg.run_dir) is None if fresh is None else fresh

    # --- entry point -------------------------------------------------------------------

    def run(self, progress_every: float = 10.0, install_signals: bool = True) -> int:
        """Start, watch until done, stop; the exit status (FATAL_EXIT when the learner
        stopped the run for good, e.g. a full disk). Raises ModelError (a model that cannot
        be resolved) or RunLocked (the run is live elsewhere) before anything is written."""
        cfg = self.cfg
        check_models(cfg)  # before anything is written: a wrong model leaves no run behind
        failed = False
        try:
            if "learner" in self.roles and self._run_lock is None:
                self._run_lock = hold_run_lock(cfg.run_dir, cfg.run)
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            _write_config(cfg.run_dir, yaml.safe_dump(_redacted(cfg), sort_keys=False))
            if install_signals:
                waits = (
                    "the learner to finish its update and write its checkpoint"
                    if ("learner" in self.roles)
                    else "the actors to finish their current step"
                )
                Interrupts(self.done, waits).install()
            self._start()
            failed = self._watch(progress_every)
        finally:
            self.stop()
        if self.fatal:
            return FATAL_EXIT
        return 1 if failed or self.stop_failed else 0

    def _start(self) -> None:
        cfg = self.cfg
        model_dir = resolve_model(cfg.model)
        ckpt_dir = cfg.run_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        latest = latest_checkpoint(ckpt_dir)
        version, weights = latest if latest else (0, model_dir)
        initial = CheckpointReady(
            version=version,
            uri=str(weights),
            digest=checkpoint_digest(weights) if latest else "",
            created_at=time.time(),
        )
        spec = TopologySpec(
            run=cfg.run,
            pools=tuple(cfg.pools),
            trajectory_capacity=cfg.episodes_per_batch * (cfg.staleness.max + 2),
        )
        tokenizer = load_tokenizer(model_dir)
        threads = self._torch_threads()
        torch.set_num_threads(threads)
        log.info(
            "starting",
            torch_threads=threads,
            run=cfg.run,
            roles=list(self.roles),
            version=version,
            model=str(weights),
        )
        # before anything declares the run's queues: a broker without its episodes queue
        # (an in-process broker in a new process) holds none of the episodes issued earlier
        episodes_gone = "controller" in self.roles and not queue_exists(
            cfg.broker, Topology(cfg.run).episodes, cfg.run
        )
        if "learner" in self.roles:  # before anything touches the run's queues or checkpoints
            self._lock = take_learner_lock(cfg.broker, cfg.run, self.node, wait=LOCK_WAIT)
        if self.fresh and "learner" in self.roles:
            clear_leftovers(cfg.broker, cfg.run)
        tally = EpisodeTally()  # this node's finished episodes, for the progress line
        self._start_version = version
        if "env" in self.roles and any(t.container for t in cfg.tasks.values()):
            # before any rollout: its first episodes find the workers serving
            self._containers = EnvWorkerContainers(  # removes a crashed run's leftovers
                cfg.run, cfg.broker, node=self.node, log_dir=cfg.run_dir / "logs"
            )
            for name, t in cfg.tasks.items():
                if t.container:
                    self._containers.start(
                        name,
                        workers=t.workers,
                        capacity=t.capacity,
                        options=t.options,
                        image=t.image or ENV_WORKER_IMAGE,
                    )
        if "learner" in self.roles:
            self._spawn(
                "learner", LearnerActor, **self._learner_args(spec, weights, version, tokenizer)
            )
        if "sampler" in self.roles:
            for pool, pc in cfg.pools.items():
                pool_weights = resolve_model(pc.model) if pc.model else weights
                device = pc.device or cfg.learner.device
                make_engine = self._make_engine or (
                    functools.partial(self._vllm_engine, device=device)
                    if pc.engine == "vllm"
                    else functools.partial(
                        self._torch_engine,
                        prefix_cache_tokens=pc.prefix_cache_tokens,
                        device=device,
                    )
                )
                for i in range(pc.replicas):
                    self._spawn(
                        f"sampler-{pool}-{i}",
                        SamplerActor,
                        broker=cfg.broker,
                        topology=spec,
                        pool=pool,
                        every=pc.every,
                        engine_factory=functools.partial(
                            make_engine, pool_weights, version, pc.max_batch
                        ),
                        sampler_id=f"sampler-{self.node}-{pool}-{i}",
                        node=self.node,
                        prefetch=2 * pc.max_batch,
                    )
        if "controller" in self.roles:
            self._spawn(
                "controller",
                ControllerActor,
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
                first_version=self._first_version(),
                untrained_gone=episodes_gone,
            )
        if "rollout" in self.roles:
            r = cfg.rollout
            for i in range(r.workers):
                self._spawn(
                    f"rollout-{i}",
                    RolloutActor,
                    broker=cfg.broker,
                    topology=spec,
                    environments={
                        n: make_task(t.factory(n), **t.options)
                        for n, t in cfg.tasks.items()
                        if not t.remote
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
                    rollout_id=f"rollout-{self.node}-{i}",
                    on_episode=tally.add,
                    on_running=tally.running,
                    node=self.node,
                    seed=cfg.seed + i,
                )
        status = connect(cfg.broker, name=f"{cfg.run}-{self.node}-status")
        declare(status, spec)  # the control exchange may not exist yet (idempotent)
        if "env" in self.roles:
            for name, t in cfg.tasks.items():
                if not t.remote or t.container:
                    continue
                for i in range(t.workers):
                    self._workers.append(
                        EnvWorker(
                            make_task(t.factory(name), **t.options),
                            broker=cfg.broker,
                            run=cfg.run,
                            task=name,
                            capacity=t.capacity,
                            worker_id=f"{self.node}-{name}-{i}",
                        )
                    )
        if "serve" in self.roles:  # imported here: FastAPI and uvicorn only where it runs
            from ..serve import KEY_FILE, ServeServer, ServeService, resolve_api_key

            key, source = resolve_api_key(cfg.serve.api_key, cfg.run_dir)
            service = ServeService(
                cfg, tokenizer, version=version, node=self.node, on_episode=tally.add
            )
            tally.count_open(service.book.open_count)  # served episodes are in flight too
            self.server = ServeServer(
                service,
                cfg.serve.host,
                cfg.serve.port,
                api_key=key,
                max_body_bytes=cfg.serve.max_body_bytes,
                max_concurrent=cfg.serve.max_concurrent,
            )
            where = str(cfg.run_dir / KEY_FILE) if source == "generated" else None
            log.info("endpoint API key", source=source, file=where)
        self._progress = Progress(
            status,
            Topology(cfg.run),
            tuple(cfg.pools),
            tally=tally,
            start_version=version,
            batch_episodes=cfg.episodes_per_batch,
        )
        subscribe(status, Topology(cfg.run).control, self._on_command, routing_key="command.#")

    def _learner_args(self, spec, weights: Path, version: int, tokenizer) -> dict:
        cfg, ln = self.cfg, self.cfg.learner
        metrics_path = cfg.run_dir / "metrics.jsonl"
        events = EventWriter(cfg.run_dir / "tensorboard")

        def on_metrics(values: dict[str, float], now: float | None = None) -> None:
            now = time.time() if now is None else now
            with self._metrics_lock:
                self.last_metrics = dict(values)
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
            backend_factory=functools.partial(self._make_backend, weights, version),
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
            first_version=self._first_version(),
            ledger_dir=cfg.run_dir / LEDGER_DIR,
            on_metrics=on_metrics,
            on_batch=on_batch,
            done=self.done,
            keep_checkpoints=ln.keep_checkpoints,
            node=self.node,
            disk_problem=DiskCheck(
                cfg.run_dir / "checkpoints",
                model_dir=resolve_model(cfg.model),
                state_dir=cfg.run_dir / "learner_state",
            ).problem,
            on_fatal=self._fatal,
            trace=functools.partial(
                TraceWriter, cfg.run_dir / TRACE_FILE, tokenizer=str(resolve_model(cfg.model))
            ),
        )

    def _fatal(self, reason: str) -> None:
        """The learner stopped the run for good (actor thread): said once more at the end."""
        self.fatal = reason

    def _first_version(self) -> int:
        """The version RL began at: the warm start's, or 0."""
        warm = read_warm_start(self.cfg.run_dir)
        return warm.version if warm else 0

    def _torch_threads(self) -> int:
        return self.cfg.torch_threads or node_torch_threads(self.cfg, self.roles)

    def _on_command(self, delivery: Delivery) -> None:
        """A ControlCommand on the control exchange (I/O thread): shutdown drains this node."""
        msg = decode_or_dead_letter(delivery, ControlCommand)
        if msg is None:
            return
        delivery.ack()
        if msg.payload.command == "shutdown":
            log.info("shutdown requested", node=self.node, reason=msg.payload.reason)
            self.done.set()

    def _torch_backend(self, weights: Path, version: int) -> LearnerBackend:
        cfg, ln = self.cfg, self.cfg.learner
        return TorchLearner(
            weights,
            lr=ln.lr,
            weight_decay=ln.weight_decay,
            grad_clip=ln.grad_clip,
            temperature=cfg.rollout.temperature,
            clip_low=ln.clip_low,
            clip_high=ln.clip_high,
            dual_clip=ln.dual_clip,
            kl_coef=ln.kl_coef,
            is_cap=ln.is_cap,
            warmup_steps=ln.warmup_steps,
            micro_batch_tokens=ln.micro_batch_tokens,
            gradient_checkpointing=ln.gradient_checkpointing,
            autocast=ln.autocast,
            share_prefix=ln.share_prefix,
            device=ln.device,
            dtype=ln.dtype,
            seed=cfg.seed,
            version=version,
            reference_dir=kl_reference(cfg.run_dir, resolve_model(cfg.model)),
            state_dir=cfg.run_dir / "learner_state",  # AdamW state, for an exact resume
            lora=None if ln.lora is None else LoraSpec(**asdict(ln.lora)),
        )

    def _megatron_backend(self, weights: Path, version: int) -> LearnerBackend:
        """MegatronLearner: rank 0 here, the other TP x PP x DP ranks as worker processes."""
        from agentrl.trainer.megatron import MegatronLearner

        cfg, ln = self.cfg, self.cfg.learner
        self._backend = MegatronLearner(
            weights,
            tp=ln.megatron.tp,
            pp=ln.megatron.pp,
            dp=ln.megatron.dp,
            lr=ln.lr,
            weight_decay=ln.weight_decay,
            grad_clip=ln.grad_clip,
            temperature=cfg.rollout.temperature,
            clip_low=ln.clip_low,
            clip_high=ln.clip_high,
            dual_clip=ln.dual_clip,
            kl_coef=ln.kl_coef,
            is_cap=ln.is_cap,
            warmup_steps=ln.warmup_steps,
            micro_batch_tokens=ln.micro_batch_tokens,
            dtype=ln.dtype,
            seed=cfg.seed,
            version=version,
            reference_dir=kl_reference(cfg.run_dir, resolve_model(cfg.model)),
            state_dir=cfg.run_dir / "learner_state",
            state_every=ln.megatron.state_every,
            keep_states=ln.megatron.keep_states,
            threads=self._torch_threads(),
            device=ln.device,
        )
        return self._backend

    def _torch_engine(
        self, weights: Path, version: int, max_batch: int, *, prefix_cache_tokens: int, device: str
    ) -> SamplerEngine:
        return torch_engine(
            weights,
            version,
            max_batch,
            device=device,
            dtype=self.cfg.learner.engine_dtype,
            seed=self.cfg.seed,
            prefix_cache_tokens=prefix_cache_tokens,
        )

    def _vllm_engine(
        self, weights: Path, version: int, max_batch: int, *, device: str
    ) -> SamplerEngine:
        ln = self.cfg.learner  # the learner's dtype (docs/engines.md)
        return VLLMEngine(
            weights,
            device=device,
            dtype=ln.engine_dtype,
            max_batch=max_batch,
            seed=self.cfg.seed,
            version=version,
        )

    def _stop_workers(self) -> None:
        while self._workers:
            self._workers.pop().close()
        if self._containers is not None:
            self._containers, containers = None, self._containers
            containers.close()

    def _spawn(self, name: str, cls, **kwargs) -> None:
        ref = cls.start(**kwargs)
        self._refs.append((name, ref))

    # --- watching ----------------------------------------------------------------------

    def _watch(self, progress_every: float) -> bool:
        """Wait for done; return True when an actor died."""
        next_progress = time.monotonic() + progress_every
        while not self.done.wait(timeout=0.5):
            dead = [name for name, ref in self._refs if not ref.is_alive()]
            if dead:
                log.error("actor stopped unexpectedly; shutting down", actors=dead)
                return True
            if time.monotonic() >= next_progress:
                next_progress += progress_every
                with self._metrics_lock:
                    metrics = dict(self.last_metrics)
                self._progress.print_line(metrics)
        return False

    def stop(self) -> None:
        """Stop every actor: controller first (no new work), learner last."""
        order = {"controller": 0, "rollout": 1, "sampler": 2, "learner": 3}
        for name, ref in sorted(self._refs, key=lambda nr: order[nr[0].split("-")[0]]):
            timeout = LEARNER_STOP_TIMEOUT if name == "learner" else STOP_TIMEOUT
            try:
                if ref.is_alive():
                    ref.stop(block=True, timeout=timeout)
            except pykka.Timeout:  # say so and go on stopping the rest: never a traceback
                self.stop_failed = True
                log.error("actor did not stop in time", actor=name, seconds=timeout)
            log.debug("stopped", actor=name)
            if name.startswith("rollout"):
                self._stop_workers()  # after the rollouts that use them
        self._refs.clear()
        self._stop_workers()
        if self.server is not None:
            self.server, server = None, self.server
            server.close()
        if self._backend is not None:  # after the learner actor: no step is running
            self._backend, backend = None, self._backend
            backend.close()
        progress = getattr(self, "_progress", None)
        if progress is not None:
            tally = progress.tally.snapshot()
            if tally:  # this node ran episodes: say what they did
                with self._metrics_lock:
                    last = int(self.last_metrics.get("version", self._start_version))
                last = max(last, progress.tally.version or 0)  # announced, on any node
                summary = format_summary(self.cfg.run, tally, self._start_version, last)
                print(summary, file=sys.stderr, flush=True)
            progress.close()
            self._progress = None
        if self._lock is not None:  # last: the learner has stopped
            self._lock, lock = None, self._lock
            lock.close()
        if self._run_lock is not None:
            self._run_lock, run_lock = None, self._run_lock
            run_lock.close()
        if self.fatal:  # the last line: why the run stopped
            print(f"agentrl-supervisor: {self.fatal}", file=sys.stderr, flush=True)


def queue_exists(broker: str, queue: str, run: str) -> bool:
    """Whether ``queue`` is on ``broker`` (RabbitMQ keeps a run's queues across its
    processes; an in-process broker starts empty in each)."""
    transport = connect(broker, name=f"{run}-probe")
    try:
        transport.queue_depth(queue)
    except BrokerRefused:  # 404: no such queue
        return False
    finally:
        transport.close()
    return True


def clear_leftovers(broker: str, run: str) -> None:
    """Delete the episodes and trajectories queues an earlier run of the same name left
    (on RabbitMQ queues outlive their run; their messages belong to weights that no longer
    exist). For the first start of a run, by the node that holds its learner, before its
    roles start: a node of the run started before it would lose its consumers, so start
    the learner's node first when a run name is reused."""
    names = Topology(run)
    transport = connect(broker, name=f"{run}-setup")
    try:
        for queue in (names.episodes, names.trajectories):
            try:
                depth = transport.queue_depth(queue)
            except BrokerRefused:  # 404: no such queue, nothing left over
                continue
            if depth:
                log.warning("fresh run: leftover messages discarded", queue=queue, count=depth)
            transport.delete_queue(queue)
    finally:
        transport.close()


def earlier_start(run_dir: Path) -> str | None:
    """What an earlier start of this run left (its config, newest checkpoint), or None for a
    run never started (a directory with only a warm start, ``agentrl sft``, counts as new)."""
    if not (run_dir / "config.yaml").exists():
        return None
    latest = latest_checkpoint(run_dir / "checkpoints")
    newest = f"newest checkpoint v{latest[0]}" if latest else "no checkpoint yet"
    return f"{run_dir}, {newest}"


def _write_config(run_dir: Path, text: str) -> None:
    """``config.yaml``; a resumed run with another config keeps the earlier one as
    ``config.<n>.yaml`` (n = 1, 2, ... in order), so no config of the run is lost."""
    path = run_dir / "config.yaml"
    if path.exists() and path.read_text() != text:
        n = 1
        while (run_dir / f"config.{n}.yaml").exists():
            n += 1
        path.rename(run_dir / f"config.{n}.yaml")
        log.warning("resumed with another config; the earlier one kept", kept=f"config.{n}.yaml")
    path.write_text(text)


STOP_TIMEOUT = 60.0
"""Seconds an actor gets to stop."""
LEARNER_STOP_TIMEOUT = 1800.0
"""Seconds the learner gets: a stop waits for the update it is in (minutes on a CPU: one
SmolLM2 update of 16 two-thousand-token episodes took 250-370 s on 2 cores), which then
writes its checkpoint."""


def node_torch_threads(cfg: RunConfig, roles: tuple[str, ...]) -> int:
    """Intra-op threads per compute process: this node's cores / (engines + learner ranks).

    torch's default (every core in every process) oversubscribes the cores as soon
    as an engine and the learner share a node, and each then runs several times slower.
    """
    engines = sum(p.replicas for p in cfg.pools.values()) if "sampler" in roles else 0
    ln = cfg.learner
    learners = ln.megatron.world if ln.backend == "megatron" else 1
    compute = engines + (learners if "learner" in roles else 0)
    return max(1, (os.cpu_count() or 1) // max(compute, 1))


def stop_run(broker: str, run: str, reason: str) -> bool:
    """Ask every node of ``run`` to drain and exit; False when no node was listening."""
    transport = connect(broker, name=f"{run}-stop")
    try:
        body = encode(ControlCommand(command="shutdown", reason=reason), run=run)
        try:
            transport.publish(Topology(run).control, "command.shutdown", body).result(30)
        except Unroutable:
            return False
        return True
    finally:
        transport.close()


def _redacted(cfg: RunConfig) -> dict:
    data = asdict(cfg)
    if "@" in data["broker"]:
        scheme, rest = data["broker"].split("://", 1)
        data["broker"] = f"{scheme}://***@{rest.split('@', 1)[1]}"
    return data

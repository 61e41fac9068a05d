"""Build the actors of a run from its config, start them, watch them, stop them.

Builder functions (`roles.py`, `engines.py`) turn the config into plain constructor
arguments; actors never see the config object.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pykka
import structlog
import torch
import yaml

from agentrl.actors import (
    ControllerActor,
    LearnerActor,
    RolloutActor,
    SamplerActor,
    SamplerEngine,
    TopologySpec,
    declare,
    decode_or_dead_letter,
    subscribe,
)
from agentrl.environments import make_task
from agentrl.environments._containers import ENV_WORKER_IMAGE, EnvWorkerContainers
from agentrl.environments._worker import EnvWorker
from agentrl.messages import (
    CheckpointReady,
    ControlCommand,
    Delivery,
    Topology,
    Transport,
    connect,
)
from agentrl.trainer import LearnerBackend, checkpoint_digest, load_tokenizer, resolve_model

from ..config.schema import RunConfig
from ..sft.warm_start import read_warm_start
from .engines import megatron_backend, node_torch_threads, torch_backend
from .interrupt import CONSOLE_ROLE_ENV, LEARNER_STOP_TIMEOUT, Interrupts, stop_actor
from .node import FATAL_EXIT
from .preflight import check_models
from .progress import EpisodeTally, Progress, format_summary
from .queues import clear_leftovers, queue_exists
from .roles import DEFAULT_ROLES, ROLES, controller_args, learner_args, rollout_args, sampler_args
from .run_dir import earlier_start, latest_checkpoint, redacted_config, write_config
from .run_lock import LOCK_WAIT, RunLock, hold_run_lock, take_learner_lock

log = structlog.get_logger(__name__)

__all__ = ["LEARNER_STOP_TIMEOUT", "STOP_TIMEOUT", "Supervisor"]


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
            self._megatron_backend
            if cfg.learner.backend == "megatron"
            else functools.partial(torch_backend, cfg)
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
            write_config(cfg.run_dir, yaml.safe_dump(redacted_config(cfg), sort_keys=False))
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
            for name, args in sampler_args(
                cfg, spec, weights, version, node=self.node, make_engine=self._make_engine
            ):
                self._spawn(name, SamplerActor, **args)
        if "controller" in self.roles:
            self._spawn(
                "controller",
                ControllerActor,
                **controller_args(
                    cfg,
                    spec,
                    initial,
                    first_version=self._first_version(),
                    untrained_gone=episodes_gone,
                ),
            )
        if "rollout" in self.roles:
            for i in range(cfg.rollout.workers):
                self._spawn(
                    f"rollout-{i}",
                    RolloutActor,
                    **rollout_args(
                        cfg, spec, tokenizer, i, node=self.node, tally=tally, on_fatal=self._fatal
                    ),
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
        return learner_args(
            self.cfg,
            spec,
            weights,
            version,
            tokenizer,
            make_backend=self._make_backend,
            first_version=self._first_version(),
            keep_metrics=self._keep_metrics,
            done=self.done,
            node=self.node,
            on_fatal=self._fatal,
        )

    def _keep_metrics(self, values: dict[str, float]) -> None:
        """The learner's latest metrics, for the progress line (actor thread)."""
        with self._metrics_lock:
            self.last_metrics = dict(values)

    def _megatron_backend(self, weights: Path, version: int) -> LearnerBackend:
        """The megatron learner, kept to be closed in `stop` after the learner actor."""
        self._backend = megatron_backend(self.cfg, weights, version, threads=self._torch_threads())
        return self._backend

    def _fatal(self, reason: str) -> None:
        """An actor stopped the run for good (its thread): said once more at the end."""
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

    @property
    def prints_progress(self) -> bool:
        """Whether this process prints the progress line: always on its own, and under a
        node supervisor only as the node's console role (`CONSOLE_ROLE_ENV`)."""
        console = os.environ.get(CONSOLE_ROLE_ENV)
        return console is None or console in self.roles

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
                if self.prints_progress:
                    self._progress.print_line(metrics)
        return False

    def stop(self) -> None:
        """Stop every actor: controller first (no new work), learner last."""
        order = {"controller": 0, "rollout": 1, "sampler": 2, "learner": 3}
        for name, ref in sorted(self._refs, key=lambda nr: order[nr[0].split("-")[0]]):
            timeout = LEARNER_STOP_TIMEOUT if name == "learner" else STOP_TIMEOUT
            try:
                if ref.is_alive():
                    stop_actor(name, ref, timeout)
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


STOP_TIMEOUT = 60.0
"""Seconds an actor gets to stop."""

"""One node's roles as supervised child processes: restart with back-off, drain on SIGTERM.

`NodeSupervisor` starts every role of this node in its own process
(``agentrl-supervisor start ... --roles ROLE --in-process``), so a crashing
role takes nothing else down, and watches them:

- a role that dies (non-zero exit or killed by a signal) is restarted after a
  back-off that doubles from ``backoff_initial`` up to ``backoff_max`` seconds
  (reset once the role has stayed up for ``stable_after`` seconds); every
  restart is logged with the exit status and the count;
- a role that exits 0 has finished: roles exit cleanly only when the run ends
  (the learner reached ``max_steps`` and broadcast shutdown, or
  `agentrl-supervisor stop`), so the node then drains its other roles too; this
  also stops a role that was being restarted when the broadcast went out and so
  never heard it;
- a role dies with its node: it gets SIGTERM (and drains) when the node process dies,
  even by SIGKILL (`die_with_node`, Linux's parent-death signal), so no role of a dead
  node keeps training unsupervised;
- SIGTERM or SIGINT to the node forwards SIGTERM to every role, which drains
  (stops taking work, hands back in-flight messages, exits); roles still
  running after ``stop_timeout`` seconds (by default the learner's own stop limit, and
  a margin) are killed. The node says so once on the console, and every
  `STILL_WAITING` s of the wait; a second SIGINT or SIGTERM forwards a second SIGTERM,
  which aborts every role at once (the update in progress is lost), and the node exits
  `ABORT_EXIT`.

- a role that exits with ``FATAL_EXIT`` (2) met an error a restart cannot fix (the
  broker refused the login, a bad config): it is not restarted, the node drains its
  other roles and exits 2.

The node exits when all its roles have exited: 0 if every role finished
cleanly (exit 0, or ended by the drain's SIGTERM), 2 after a fatal role exit, 1
otherwise. Which process runs which role is written to
``<run_dir>/nodes/<node>.json`` (and updated on every restart) for operators and tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from .interrupt import (
    ABORT_EXIT,
    CONSOLE_ROLE_ENV,
    LEARNER_STOP_TIMEOUT,
    NODE_PID_ENV,
    STILL_WAITING,
    say,
)

log = structlog.get_logger(__name__)

__all__ = ["FATAL_EXIT", "NODE_PID_ENV", "NodeSupervisor", "die_with_node"]


FATAL_EXIT = 2
"""Exit code of a role (and of the node) that no restart can fix: refused login, bad config."""


NODE_STOP_TIMEOUT = LEARNER_STOP_TIMEOUT + 60.0
"""Seconds a node's drain waits for its roles before it kills them: the learner's own stop
limit (it finishes its update and writes its checkpoint), and a margin for its exit."""


@dataclass
class _Role:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started: float = 0.0
    restarts: int = 0
    delay: float = 0.0
    restart_at: float | None = None
    exit_code: int | None = None
    history: list[int] = field(default_factory=list)


class NodeSupervisor:
    """Runs each role of a node in a child process and keeps it running (see module doc)."""

    def __init__(
        self,
        roles: dict[str, list[str]],
        *,
        node: str,
        state_file: Path,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        stable_after: float = 60.0,
        stop_timeout: float = NODE_STOP_TIMEOUT,
        env: dict[str, str] | None = None,
        affinity: dict[str, list[int]] | None = None,
    ) -> None:
        """``roles`` maps each role to the argv of its child process; ``affinity`` a role
        to the CPU cores its process (every start of it) is pinned to."""
        if not roles:
            raise ValueError("a node needs at least one role")
        self.node = node
        self._roles = {name: _Role(name, list(argv)) for name, argv in roles.items()}
        self._state_file = state_file
        self._backoff = (backoff_initial, backoff_max)
        self._stable_after = stable_after
        self._stop_timeout = stop_timeout
        self._env = env
        self._affinity = dict(affinity or {})
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self.fatal: str | None = None
        """The role that exited with FATAL_EXIT, if one did."""
        self.signals = 0
        """SIGINT/SIGTERM received: the first drains, the second aborts every role."""
        self.console_role = next(
            (r for r in ("learner", "controller") if r in self._roles), next(iter(self._roles))
        )
        """The role whose process prints the node's progress line (`CONSOLE_ROLE_ENV`)."""

    def run(self, *, install_signals: bool = True) -> int:
        """Start every role and supervise them until all have exited."""
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.on_signal)
        for role in self._roles.values():
            self._start(role)
        try:
            while True:
                self._reap()
                if self.stopping.is_set():
                    break
                live = [r for r in self._roles.values() if r.process or r.restart_at is not None]
                if not live:
                    break
                self._restart_due()
                self._wake.wait(0.2)
                self._wake.clear()
        finally:
            self._drain()
        # SIGTERM comes from the drain: a role still starting up (no handler yet) dies of it
        failed = [r.name for r in self._roles.values() if r.exit_code not in (0, -signal.SIGTERM)]
        log.info("node stopped", node=self.node, failed_roles=failed)
        if self.fatal:
            return FATAL_EXIT
        if self.signals > 1:
            return ABORT_EXIT
        return 1 if failed else 0

    def stop(self) -> None:
        """Ask every role to drain and exit (safe from a signal handler)."""
        self.stopping.set()
        self._wake.set()

    def on_signal(self, signum: int, frame: object = None) -> None:
        """SIGINT/SIGTERM to the node: the first drains every role, the second aborts them."""
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            say(
                f"{name}: stopping; waiting for this node's roles to drain (the learner "
                "finishes its update and writes its checkpoint; Ctrl-C again to abort now: "
                "the update in progress is lost)"
            )
            self.stop()
            return
        say(f"{name} again: aborting every role; --resume continues from the newest checkpoint")
        for role in list(self._roles.values()):
            process = role.process
            if process is not None:  # a role's second signal: its own abort, at once
                _signal(process, signal.SIGTERM)

    def pids(self) -> dict[str, int | None]:
        return {n: (r.process.pid if r.process else None) for n, r in self._roles.items()}

    # --- internals -----------------------------------------------------------------

    def _start(self, role: _Role) -> None:
        env = {
            **(os.environ if self._env is None else self._env),
            NODE_PID_ENV: str(os.getpid()),
            CONSOLE_ROLE_ENV: self.console_role,
        }
        role.process = subprocess.Popen(role.argv, env=env, start_new_session=True)
        if role.name in self._affinity:  # before it starts threads: they inherit the mask
            os.sched_setaffinity(role.process.pid, self._affinity[role.name])
        role.started = time.monotonic()
        role.restart_at = None
        role.exit_code = None
        log.info("role started", node=self.node, child=role.name, pid=role.process.pid)
        self._write_state()

    def _reap(self) -> None:
        for role in self._roles.values():
            if role.process is None:
                continue
            code = role.process.poll()
            if code is None:
                continue
            role.process = None
            role.exit_code = code
            role.history.append(code)
            if code == FATAL_EXIT:  # also during a drain: e.g. the learner's full disk
                log.error("role cannot go on; draining this node", node=self.node, child=role.name)
                self.fatal = role.name
                self.stopping.set()
            elif code == 0 or self.stopping.is_set():
                log.info("role finished", node=self.node, child=role.name, exit_code=code)
                if code == 0 and not self.stopping.is_set():
                    log.info("the run has ended; draining this node", node=self.node)
                    self.stopping.set()
            else:
                self._schedule_restart(role, code)
            self._write_state()

    def _schedule_restart(self, role: _Role, code: int) -> None:
        first, cap = self._backoff
        up = time.monotonic() - role.started
        role.delay = (
            first if up >= self._stable_after or role.delay == 0 else min(cap, role.delay * 2)
        )
        role.restart_at = time.monotonic() + role.delay
        role.restarts += 1
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        say(
            f"{role.name} stopped ({how}); restarting it in {role.delay:g} s "
            f"(restart {role.restarts}; its log: logs/{self.node}/)"
        )
        log.warning(
            "role died; restarting",
            node=self.node,
            child=role.name,
            status=how,
            restarts=role.restarts,
            delay_s=role.delay,
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for role in self._roles.values():
            if role.restart_at is not None and now >= role.restart_at:
                self._start(role)

    def _drain(self) -> None:
        """SIGTERM every live role, wait up to stop_timeout, then kill what is left."""
        running = [r for r in self._roles.values() if r.process is not None]
        for role in running:
            log.info("draining role", node=self.node, child=role.name, pid=role.process.pid)
            _signal(role.process, signal.SIGTERM)
        start = time.monotonic()
        deadline = start + self._stop_timeout
        for role in running:
            while True:
                left = deadline - time.monotonic()
                try:
                    role.process.wait(timeout=max(0.0, min(STILL_WAITING, left)))
                    break
                except subprocess.TimeoutExpired:
                    if left > STILL_WAITING:
                        waiting = sorted(r.name for r in running if r.process.poll() is None)
                        say(
                            f"stopping: still waiting for {', '.join(waiting)} "
                            f"({time.monotonic() - start:.0f} s so far, at most "
                            f"{self._stop_timeout:.0f} s; Ctrl-C again to abort)"
                        )
                        continue
                    log.error("role did not drain in time; killed", node=self.node, child=role.name)
                    say(f"{role.name} did not stop in {self._stop_timeout:.0f} s: killed")
                    _signal(role.process, signal.SIGKILL)
                    role.process.wait()
                    break
            role.exit_code = role.process.returncode
            role.history.append(role.exit_code)
            role.process = None
            if role.exit_code == FATAL_EXIT:  # it stopped the run for good while draining
                self.fatal = self.fatal or role.name
        for role in self._roles.values():
            role.restart_at = None
        self._write_state()

    def _write_state(self) -> None:
        state = {
            "node": self.node,
            "pid": os.getpid(),
            "updated": time.time(),
            "stopping": self.stopping.is_set(),
            "roles": {
                r.name: {
                    "pid": r.process.pid if r.process else None,
                    "alive": r.process is not None,
                    "restarts": r.restarts,
                    "exit_codes": r.history[-10:],
                }
                for r in self._roles.values()
            },
        }
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self._state_file)


def die_with_node() -> None:
    """In a role started by a node supervisor: be sent SIGTERM (a drain) when the node
    process dies, however it dies (SIGKILL included), so no role trains on unsupervised.
    Linux's parent-death signal; a node already gone by now ends this process at once."""
    node = os.environ.get(NODE_PID_ENV)
    if not node:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("no parent-death signal", errno=ctypes.get_errno())
    if os.getppid() != int(node):  # the node died before the signal was armed
        log.error("node supervisor gone; exiting", node_pid=int(node))
        os._exit(1)


def _signal(process: subprocess.Popen, sig: int) -> None:
    """Signal a role's whole process group (its own session), if it still exists."""
    with contextlib.suppress(ProcessLookupError):  # already gone: nothing to signal
        os.killpg(process.pid, sig)


def role_argv(argv: Sequence[str], role: str, node: str, torch_threads: int) -> list[str]:
    """The child command for ``role``: this command line with ``--roles role --in-process
    --resume``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--roles", "--node", "--torch-threads"):
            skip = True
            continue
        if arg.startswith(("--roles=", "--node=", "--torch-threads=")) or arg in (
            "--in-process",
            "--resume",
        ):
            continue
        out.append(arg)
    return [
        sys.executable,
        "-m",
        "agentrl.ops.cli.agentrl_supervisor",
        *out,
        "--roles",
        role,
        "--node",
        node,
        "--torch-threads",
        str(torch_threads),
        "--in-process",
        "--resume",  # the node decided whether the run may start; a restarted role resumes
    ]

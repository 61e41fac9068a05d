"""Ctrl-C and SIGTERM for a run's process: the first drains, a second aborts; a stop that
waits for an actor says so on the console (`stop_actor`).

The first SIGINT or SIGTERM is acknowledged at once with a line that says what the stop
waits for (the learner finishes the update it is in and writes its checkpoint, which can
take minutes on a CPU), and sets the run's ``done``. A second one ends the process at
once: the update in progress is lost (its checkpoint is written to a temporary directory
and renamed, so nothing half-written is left), and ``--resume`` continues from the
newest checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import pykka
import structlog

log = structlog.get_logger(__name__)

NODE_PID_ENV = "AGENTRL_NODE_PID"
"""Set in every role's environment: the pid of the node supervisor that started it."""

CONSOLE_ROLE_ENV = "AGENTRL_CONSOLE_ROLE"
"""Set by a node supervisor in every role's environment: the one role of the node that
prints the progress line (the learner where the node has it, else the controller, else
its first role); the others keep theirs to their logs."""

__all__ = [
    "ABORT_EXIT",
    "CONSOLE_ROLE_ENV",
    "LEARNER_STOP_TIMEOUT",
    "NODE_PID_ENV",
    "STILL_WAITING",
    "Interrupts",
    "say",
    "stop_actor",
]

ABORT_EXIT = 130
"""Exit status of a run aborted by a second signal (128 + SIGINT)."""


class Interrupts:
    """The signal handler of a run: drain on the first signal, abort on the second."""

    def __init__(
        self,
        done: threading.Event,
        waits_for: str,
        *,
        abort: Callable[[int], None] = os._exit,
    ) -> None:
        """``waits_for``: what a drain waits for, in words (the acknowledgement line).
        ``abort(status)``: how a second signal ends the process (tests pass a fake)."""
        self._done = done
        self._waits_for = waits_for
        self._abort = abort
        self.count = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self)

    def __call__(self, signum: int, frame: object = None) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            say(
                f"{name}: stopping; waiting for {self._waits_for} "
                "(Ctrl-C again to abort now: the update in progress is lost)"
            )
            self._done.set()
            return
        say(f"{name} again: aborted; --resume continues from the newest checkpoint")
        self._abort(ABORT_EXIT)


def say(line: str) -> None:
    """One line of the supervisor on the console (stderr). In a role that a node supervisor
    started (``AGENTRL_NODE_PID`` set), the line goes to the role's log instead: the node
    says the stop once for all its roles (`agentrl.ops.run.node`)."""
    if os.environ.get(NODE_PID_ENV):
        log.info("stop", said=line)
        return
    print(f"agentrl-supervisor: {line}", file=sys.stderr, flush=True)


def stop_actor(name: str, ref: pykka.ActorRef, timeout: float) -> None:
    """Stop one actor, waiting up to ``timeout`` s for the message it is in (the learner's
    update can take minutes on a CPU); every `STILL_WAITING` s of waiting is said on the
    console, so a stop is never silent. Raises pykka.Timeout past ``timeout``."""
    future = ref.stop(block=False)
    start = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            raise pykka.Timeout(f"{name} did not stop in {timeout:.0f} s")
        try:
            future.get(timeout=min(STILL_WAITING, left))
            return
        except pykka.Timeout:
            waited = time.monotonic() - start
            if waited < timeout:
                say(
                    f"stopping: still waiting for the {name} ({waited:.0f} s so far, "
                    f"at most {timeout:.0f} s; Ctrl-C again to abort)"
                )


LEARNER_STOP_TIMEOUT = 1800.0
"""Seconds the learner gets to stop: a stop waits for the update it is in (minutes on a
CPU: one SmolLM2 update of 16 two-thousand-token episodes took 250-370 s on 2 cores),
which then writes its checkpoint. A node waits this long, and a margin, for its roles."""

STILL_WAITING = 30.0
"""Seconds between the console lines of a stop that waits for an actor."""

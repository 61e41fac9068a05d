"""Ctrl-C and SIGTERM for a run's process: the first drains, a second aborts.

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
from collections.abc import Callable

__all__ = ["ABORT_EXIT", "Interrupts", "say"]

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
    """One line of the supervisor on the console (stderr)."""
    print(f"agentrl-supervisor: {line}", file=sys.stderr, flush=True)

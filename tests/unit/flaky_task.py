"""A calculator task whose own code breaks on a schedule: raises, blocks, bad rewards."""

from __future__ import annotations

import itertools
import threading

from agentrl.environments import Step
from agentrl.environments.tasks.calculator.task import CalculatorTask

RELEASE = threading.Event()
"""Set at a test's end: frees the calls the schedule blocked (their threads were abandoned)."""


class FlakyCalculator:
    """The calculator, but call ``n`` (``start`` and ``interact`` counted together) raises a
    RuntimeError when ``n % raise_every == raise_at`` and blocks until `RELEASE` when
    ``n % block_every == block_at``; ``reward`` replaces every finishing step's reward."""

    def __init__(
        self,
        *,
        raise_every: int = 0,
        raise_at: int = 0,
        block_every: int = 0,
        block_at: int = 0,
        reward: object = None,
        levels: tuple[int, ...] = (1,),
        num_instances: int = 10_000,
    ) -> None:
        self.inner = CalculatorTask(levels=list(levels), num_instances=num_instances)
        self._calls = itertools.count()
        self._lock = threading.Lock()
        self._raise = (raise_every, raise_at)
        self._block = (block_every, block_at)
        self._reward = reward

    @property
    def tools(self):
        return self.inner.tools

    @property
    def num_instances(self):
        return self.inner.num_instances

    def problem(self, index):  # what the calculator's scripted oracle reads
        return self.inner.problem(index)

    def _maybe_break(self) -> None:
        with self._lock:
            n = next(self._calls)
        every, at = self._block
        if every and n % every == at:
            RELEASE.wait()
        every, at = self._raise
        if every and n % every == at:
            raise RuntimeError(f"flaky call {n}")

    def start(self, index):
        self._maybe_break()
        return self.inner.start(index)

    def interact(self, session, message):
        self._maybe_break()
        step = self.inner.interact(session, message)
        if step.finish and self._reward is not None:
            return Step.end(step.status, self._reward, step.metrics, step.messages)
        return step

    def cancel(self, session):
        self.inner.cancel(session)

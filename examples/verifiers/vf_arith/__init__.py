"""vf_arith: a verifiers 0.4.0 taskset that runs offline (no data download, no model
server): arithmetic questions answered in ``\\boxed{}``, scored by a ``@vf.reward``.

With ``calculator: true`` the taskset serves a ``vf.Toolset`` (tools ``calculator_add``,
``calculator_multiply``) whose calls are counted in the rollout's state, reported by a
``@vf.metric`` and capped by a ``@vf.stop``: a single-turn environment without it, a tool
environment with it. ``agentrl eval`` and ``agentrl-env check`` play it as
``verifiers:vf_arith`` with this folder's parent on PYTHONPATH (docs/tasks.md
"verifiers")."""

from __future__ import annotations

import random
from collections.abc import Iterator

import verifiers.v1 as vf
from verifiers.v1.utils.score import extract_boxed_answer

__all__ = ["ArithTaskset"]

MAX_CALCULATOR_CALLS = 6
"""The rollout stops (``@vf.stop calculator_spent``) once the calculator was called this often."""


class ArithConfig(vf.TasksetConfig):
    count: int = 500
    """How many questions the taskset holds."""
    max_operand: int = 20
    """Operands are drawn from 1..max_operand."""
    seed: int = 0
    """The questions' random seed."""
    calculator: bool = False
    """Serve the calculator toolset (a tool environment)."""


class ArithData(vf.TaskData):
    answer: str
    """The expected answer, an integer as text."""


class ArithState(vf.State):
    calculator_calls: int = 0
    """Calls of the calculator's tools in this rollout."""


class CalculatorConfig(vf.ToolsetConfig):
    pass


class Calculator(vf.Toolset[CalculatorConfig, ArithState]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.state.calculator_calls += 1
        return a + b

    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        self.state.calculator_calls += 1
        return a * b


class ArithTask(vf.Task[ArithData, ArithState, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        """1.0 when the last reply's boxed answer is the expected integer."""
        return float(extract_boxed_answer(trace.last_reply).strip() == self.data.answer)

    @vf.metric
    async def calculator_calls(self, trace: vf.Trace) -> float:
        return float(trace.state.calculator_calls)

    @vf.stop
    async def calculator_spent(self, trace: vf.Trace) -> bool:
        return trace.state.calculator_calls >= MAX_CALCULATOR_CALLS


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(self.config.seed)
        how = (
            "Use the calculator tools if you like. "
            if self.config.calculator
            else "Think step by step. "
        )
        for i in range(self.config.count):
            a, b, c = (rng.randint(1, self.config.max_operand) for _ in range(3))
            yield ArithTask(
                ArithData(
                    name=f"arith-{i}",
                    prompt=f"What is {a} * {b} + {c}? {how}Give the final answer in \\boxed{{}}.",
                    answer=str(a * b + c),
                ),
                self.config.task,
            )

    @classmethod
    def toolsets(cls, config: ArithConfig) -> list[vf.Toolset]:
        return [Calculator(CalculatorConfig())] if config.calculator else []

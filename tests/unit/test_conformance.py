"""The protocol contract (`_conformance`) and the random agent: built-ins pass, and each
kind of broken task is reported under its rule."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from agentrl.environments import SessionClosed, Start, Status, Step
from agentrl.environments._conformance import conformance, tool_schema_problems
from agentrl.environments._random_agent import random_turn, schema_value
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.messages import ChatMessage
from agentrl.ops.cli import agentrl_env as cli_env

_TOOL = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit.",
        "parameters": {
            "type": "object",
            "properties": {"value": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["value"],
        },
    },
}


class _Good:
    """A minimal conforming task: submit(value) ends the episode, reward value == index."""

    tools = [_TOOL]
    num_instances = 10

    def __init__(self) -> None:
        self.closed: set[int] = set()
        self.ids = itertools.count()

    def start(self, index: int) -> Start:
        if not 0 <= index < self.num_instances:
            raise IndexError(index)
        return Start({"index": index, "id": next(self.ids)}, [ChatMessage("user", f"say {index}")])

    def interact(self, session: dict, message: ChatMessage) -> Step:
        if session["id"] in self.closed:
            raise SessionClosed("ended")
        self.closed.add(session["id"])
        calls = [c for c in message.tool_calls if c.name == "submit"]
        if not calls:
            return Step.end(Status.AGENT_INVALID_ACTION, 0.0, {})
        value = json.loads(calls[0].arguments).get("value")
        return Step.end(Status.COMPLETED, float(value == session["index"]), {"env/success": 1.0})

    def cancel(self, session: dict) -> None:
        self.closed.add(session["id"])


def _rules(env) -> set[str]:
    return {v.rule for v in conformance("fake", env=env, episodes=10).violations}


def test_a_conforming_task_and_the_builtin_calculator_have_no_violations():
    assert _rules(_Good()) == set()
    report = conformance("calculator", {"levels": [1]})
    assert report.violations == [] and report.episodes == 20
    assert report.successes == 0  # a random agent never computes a two-digit sum


class _BadTools(_Good):
    tools = [{"name": "submit", "parameters": {}}, {**_TOOL}, {**_TOOL}]


class _RewardTooBig(_Good):
    def interact(self, session, message):
        super().interact(session, message)
        return Step.end(Status.COMPLETED, 2.0, {})


class _NeverEnds(_Good):
    def interact(self, session, message):
        return Step([], Status.RUNNING, 0.0, False)


class _Raises(_Good):
    def interact(self, session, message):
        if not message.tool_calls:
            raise ValueError("no call")
        return super().interact(session, message)


class _RandomStart(_Good):
    def start(self, index):
        if not 0 <= index < self.num_instances:
            raise IndexError(index)
        return Start(
            {"index": index, "id": next(self.ids)}, [ChatMessage("user", str(random.random()))]
        )


class _FinishMismatch(_Good):
    def interact(self, session, message):
        return Step([], Status.COMPLETED, 1.0, False)


class _NoIndexError(_Good):
    def start(self, index):
        return Start({"index": index, "id": next(self.ids)}, [ChatMessage("user", "hi")])


class _StepAfterEnd(_Good):
    def interact(self, session, message):
        return Step.end(Status.COMPLETED, 0.0, {})


@pytest.mark.parametrize(
    ("env", "rule"),
    [
        (_BadTools(), "tools"),
        (_RewardTooBig(), "reward"),
        (_NeverEnds(), "ends"),
        (_Raises(), "step"),
        (_RandomStart(), "deterministic"),
        (_FinishMismatch(), "step"),
        (_NoIndexError(), "start"),
        (_StepAfterEnd(), "closed"),
    ],
)
def test_each_broken_rule_is_reported(env, rule):
    assert rule in _rules(env)


def test_tool_schema_problems_name_the_tool():
    bad = {**_TOOL, "function": {**_TOOL["function"], "parameters": {"type": "object",
           "properties": {}, "required": ["value"]}}}  # fmt: skip
    assert tool_schema_problems([bad]) == [
        "tool 'submit': required ['value'] not among its properties"
    ]


def test_schema_values_validate_and_every_kind_of_turn_is_played():
    rng = random.Random(0)
    schema = _TOOL["function"]["parameters"]
    for _ in range(50):
        value = schema_value(schema, rng)["value"]
        assert isinstance(value, int) and 0 <= value <= 9
    assert schema_value({"enum": ["a", "b"]}, rng) in ("a", "b")
    items = schema_value({"type": "array", "items": {"type": "boolean"}, "minItems": 2}, rng)
    assert len(items) >= 2 and all(isinstance(i, bool) for i in items)
    kinds = {random_turn([_TOOL], rng, n)[0] for n in range(200)}
    assert kinds == {"call", "text", "malformed", "unknown_tool", "wrong_arguments"}


def test_the_split_rule_sees_a_test_split_equal_to_train(monkeypatch):
    class SameSplits(CalculatorTask):
        def __init__(self, split: str = "train", **options):
            super().__init__(split="all" if split in ("train", "test") else split, **options)

    from agentrl.environments import register_task

    register_task("same_splits_test", SameSplits, replace=True)
    rules = {v.rule for v in conformance("same_splits_test", episodes=2).violations}
    assert rules == {"split"}


def test_cli_random_agent_exits_1_on_violations_and_0_when_clean(capsys, monkeypatch):
    from agentrl.environments import register_task

    register_task("never_ends_test", _NeverEnds, replace=True)
    assert cli_env.main(["check", "--task", "never_ends_test", "--agent", "random"]) == 1
    out = capsys.readouterr().out
    assert "ends: instance" in out and "no end after 64 random turns" in out
    register_task("good_test", _Good, replace=True)
    assert cli_env.main(["check", "--task", "good_test", "--agent", "random"]) == 0
    # no scripted oracle: said on one line, exit 2
    assert cli_env.main(["check", "--task", "good_test", "--agent", "oracle"]) == 2
    assert "has no oracle agent" in capsys.readouterr().err

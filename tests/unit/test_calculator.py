"""The calculator's train/test split and its answer to a content-only message."""

from __future__ import annotations

import pytest

from agentrl.environments import make_task
from agentrl.environments._protocol import Status
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.messages import ChatMessage


@pytest.mark.parametrize("level", [1, 2, 3])
def test_test_problems_never_equal_training_problems(level):
    train = CalculatorTask(levels=[level], split="train", num_instances=2000)
    test = CalculatorTask(levels=[level], split="test", num_instances=500)
    train_exprs = {train.problem(i).expression for i in range(2000)}
    test_exprs = {test.problem(i).expression for i in range(500)}
    assert not train_exprs & test_exprs
    assert len(test_exprs) > 400  # hundreds of distinct held-out problems


def test_split_is_deterministic_and_seeded():
    a, b = CalculatorTask(split="test", seed=4), CalculatorTask(split="test", seed=4)
    assert [a.problem(i) for i in range(30)] == [b.problem(i) for i in range(30)]
    other = CalculatorTask(split="test", seed=5)
    assert [a.problem(i) for i in range(30)] != [other.problem(i) for i in range(30)]


def test_all_split_and_bad_split():
    assert CalculatorTask(split="all").problem(0).level == 1
    with pytest.raises(ValueError, match="split"):
        make_task("calculator", split="dev")


def test_content_only_message_ends_the_episode_without_a_crash():
    """A malformed call reaches the env as content with no tool calls (the rollout's protocol)."""
    env = CalculatorTask(split="test")
    start = env.start(0)
    text = '<tool_call>{"name": "calculate", "arguments": {"expression": </tool_call>'
    step = env.interact(start.session, ChatMessage(role="assistant", content=text))
    assert step.finish and step.status == Status.AGENT_INVALID_ACTION and step.reward == 0.0

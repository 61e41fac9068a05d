"""Oracle demos in the prompt (environments/_demo.py), for any task with an oracle."""

from __future__ import annotations

import pytest

from agentrl.environments import TaskOptionsError, make_task, parse_assistant
from agentrl.environments._demo import DemoPrompt


@pytest.mark.parametrize("task", ["db", "kg", "alfworld", "webshop"])
def test_the_demo_is_the_oracle_on_the_next_instance_in_the_tools_call_format(task):
    plain, demoed = make_task(task), make_task(task, demo=2)
    assert isinstance(demoed, DemoPrompt) and demoed.tools == plain.tools
    own, shown = plain.start(3), demoed.start(3)
    other = plain.start(4)  # the demo instance
    # system first, the episode's own opening last, the demo in between
    assert shown.messages[0] == own.messages[0] and shown.messages[0].role == "system"
    assert shown.messages[-len(own.messages) + 1 :] == own.messages[1:]
    demo = shown.messages[1 : len(shown.messages) - len(own.messages) + 1]
    assert demo[0] == other.messages[1]  # the demo instance's question
    calls = [m for m in demo if m.role == "assistant"]
    assert 1 <= len(calls) <= 2
    for message in calls:
        parsed = parse_assistant(message.content)  # the model reads back what it was shown
        assert len(parsed.tool_calls) == 1
        assert parsed.tool_calls[0].name in {t["function"]["name"] for t in plain.tools}
    for env, start in ((plain, own), (plain, other), (demoed, shown)):
        env.cancel(start.session)


def test_demos_are_made_once_per_instance_and_episodes_still_play():
    env = make_task("kg", demo=True)
    first = env.start(0)
    made = dict(env._demos)
    second = env.start(0)
    assert env._demos == made and second.messages == first.messages
    # the wrapped session is the task's own: the oracle of instance 0 solves it
    from agentrl.environments._check import check

    assert check("kg", env, "oracle").success_rate == 1.0
    env.cancel(first.session)
    env.cancel(second.session)


def test_bad_demo_options_are_refused():
    with pytest.raises(TaskOptionsError, match="demo must be"):
        make_task("db", demo="yes")
    with pytest.raises(TaskOptionsError, match="demo must be"):
        make_task("db", demo=-1)
    assert not isinstance(make_task("db", demo=False), DemoPrompt)
    # a task with its own demo option keeps it
    assert not isinstance(make_task("calculator", demo=True), DemoPrompt)

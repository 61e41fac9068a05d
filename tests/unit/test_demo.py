"""Oracle demos in the prompt (environments/_demo.py), for any task with an oracle."""

from __future__ import annotations

import pytest

from agentrl.environments import TaskOptionsError, make_task, parse_assistant
from agentrl.environments._demo import DemoPrompt


def _split(own, shown, other):
    """``shown`` as (shared opening, demo, the episode's own opening): messages the demo
    instance ``other`` opens with as the episode does (a fixed example) come once, first."""
    n = 1  # the system message
    while n < len(own.messages) - 1 and own.messages[n] == other.messages[n]:
        n += 1
    tail = len(own.messages) - n
    assert shown.messages[:n] == own.messages[:n]
    assert shown.messages[-tail:] == own.messages[n:]
    return shown.messages[:n], shown.messages[n:-tail], other.messages[n]


@pytest.mark.parametrize("task", ["db", "kg", "alfworld", "webshop"])
def test_the_demo_is_the_oracle_on_the_next_instance_in_the_tools_call_format(task):
    plain, demoed = make_task(task), make_task(task, demo=2)
    assert isinstance(demoed, DemoPrompt) and demoed.tools == plain.tools
    own, shown = plain.start(3), demoed.start(3)
    other = plain.start(4)  # the demo instance
    # system first, the episode's own opening last, the demo in between
    assert shown.messages[0] == own.messages[0] and shown.messages[0].role == "system"
    _, demo, question = _split(own, shown, other)
    assert demo[0] == question  # the demo instance's question
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


def test_a_fixed_example_every_instance_opens_with_is_shown_once():
    """kg opens with AgentBench's one-shot (system, 14 example messages, question): with a
    demo the example comes once, then the demo's question and calls, then the question."""
    plain, demoed = make_task("kg"), make_task("kg", demo=2)
    own, shown, other = plain.start(3), demoed.start(3), plain.start(4)
    shared, demo, _ = _split(own, shown, other)
    assert len(shared) == 15 and shown.messages[:15] == own.messages[:15]
    assert [m.role for m in demo] == ["user", "assistant", "tool", "assistant", "tool"]
    assert shown.messages[-1] == own.messages[-1] and len(shown.messages) == 15 + 5 + 1
    for env, start in ((plain, own), (plain, other), (demoed, shown)):
        env.cancel(start.session)


def test_bad_demo_options_are_refused():
    with pytest.raises(TaskOptionsError, match="demo must be"):
        make_task("db", demo="yes")
    with pytest.raises(TaskOptionsError, match="demo must be"):
        make_task("db", demo=-1)
    assert not isinstance(make_task("db", demo=False), DemoPrompt)
    # a task with its own demo option keeps it
    assert not isinstance(make_task("calculator", demo=True), DemoPrompt)


@pytest.mark.parametrize("task", ["db", "kg", "alfworld", "webshop"])
def test_with_several_levels_the_demo_is_an_instance_of_the_same_level(task):
    options = {"levels": [0, 1]}
    plain, demoed = make_task(task, **options), make_task(task, demo=2, **options)
    assert demoed.levels == (0, 1)
    for index in (0, 1):
        own, shown = plain.start(index), demoed.start(index)
        same_level = plain.start(index + 2)  # index + len(levels): the same level again
        _, demo, question = _split(own, shown, same_level)
        assert demo[0] == question
        for env, start in ((plain, own), (plain, same_level), (demoed, shown)):
            env.cancel(start.session)

"""Red team, os task: an agent that changes what the example reads earns nothing.

Attack class: the expected answer computed on the machine the agent changed. Items
whose check has a null entry compare the answer with the output of the item's example;
run after the episode, that output is the agent's to choose (empty ``/root/docs``, then
answer ``0``). Each built-in item of that form is played: the state changed, the example
run on the changed machine, its output given as the answer. It must earn 0 (the judge
compares with the example's output taken before the first action), while that output
is not the expected one (so the attack would pass a judge that runs the example late).
"""

from __future__ import annotations

import pytest

from agentrl.environments import make_task
from tests.security.hostile import needs_bwrap, play, say

pytestmark = needs_bwrap

CHANGE_THE_STATE = (
    # what the built-in items' examples read: files emptied or rewritten, one member
    # more in a group, three processes more
    "rm -rf /root/docs/* /root/app.log; "
    "printf '#!/bin/sh\\necho pwned\\n' > /opt/tools/hello.sh; "
    "useradd -G devs mallory; "
    "for i in 1 2 3; do worker 1000 >/dev/null 2>&1 & done; true"
)


def _null_items(env) -> list[int]:
    return [i for i in range(env.num_instances) if None in env.item(i).check]


def _example_now(session, item) -> str:
    """The example's output as a judge, on the machine as it is now."""
    result = session.sandbox.judge(item.example.judge_argv(), 30)
    assert result.exit_code == 0, result
    return result.output.strip()


@pytest.fixture(scope="module")
def env():
    return make_task("os", split="all", sandbox="bwrap")


def test_every_built_in_item_of_that_form_is_played(env):
    assert len(_null_items(env)) >= 5


@pytest.mark.parametrize("index", range(13))
def test_changing_the_state_and_answering_what_the_example_then_prints_earns_nothing(env, index):
    if index not in _null_items(env):
        pytest.skip("no null check entry")
    item = env.item(index)
    session = env.start(index).session
    truth = _example_now(session, item)
    step = env.interact(session, say("bash_action", script=CHANGE_THE_STATE))
    assert not step.finish, step
    changed = _example_now(session, item)  # a late judge would accept this answer
    assert changed != truth, (truth, changed)
    step = env.interact(session, say("answer_action", answer=changed))
    assert step.finish and step.reward == 0.0, step


@pytest.mark.parametrize("index", range(13))
def test_the_answer_to_the_state_the_agent_was_given_is_rewarded(env, index):
    if index not in _null_items(env):
        pytest.skip("no null check entry")
    first = env.start(index).session
    try:
        truth = _example_now(first, env.item(index))
    finally:
        env.cancel(first)
    step = play(env, index, [CHANGE_THE_STATE], ending=say("answer_action", answer=truth))
    assert step.reward == 1.0, step

"""The os task's generated levels (`tasks.os.levels`): split, determinism, oracle."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments.tasks.os.items import content_key
from agentrl.environments.tasks.os.levels import make_level
from agentrl.environments.tasks.os.tools import QUESTION
from agentrl.environments.tasks.toolkit.split import check_disjoint
from agentrl.messages import ChatMessage, ToolCall

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="os sessions here use the bwrap sandbox: needs bubblewrap and root",
)


def _keys(env) -> list[str]:
    return [content_key(env.item(i)) for i in range(env.num_instances)]


def _questions(env) -> list[tuple[str, str]]:
    """The split key of `tasks.os.levels`: question and expected answer, without the other files."""
    return [(env.item(i).description, env.item(i).match.answer) for i in range(env.num_instances)]


def _say(name: str, **arguments) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c", name, json.dumps(arguments))])


@pytest.mark.parametrize("level", [0, 1])
def test_generated_levels_are_disjoint_distinct_and_deterministic(level):
    train = make_task("os", levels=[level], split="train", generated=400, sandbox="bwrap")
    test = make_task("os", levels=[level], split="test", generated=400, sandbox="bwrap")
    check_disjoint(_keys(train), _keys(test), "os")
    # disjoint by question and answer too: no test question repeats a training one
    check_disjoint(map(repr, _questions(train)), map(repr, _questions(test)), "os")
    train_keys = _keys(train)
    assert len(set(train_keys)) > 300 and len(set(_keys(test))) > 300  # hundreds per split
    again = make_task("os", levels=[level], split="train", generated=400, sandbox="bwrap")
    assert _keys(again)[:50] == train_keys[:50]
    other_seed = make_task("os", levels=[level], split="train", seed=1, generated=400)
    assert _keys(other_seed)[:50] != train_keys[:50]
    assert {train.item(i).level for i in range(20)} == {level}


@pytest.mark.parametrize("level", [0, 1])
def test_no_generated_answer_is_the_random_agents_zero(level):
    import random

    answers = {make_level(level, random.Random(n))[0].match.answer for n in range(2000)}
    assert "0" not in answers and "" not in answers
    assert all("\n" not in a and a == a.strip() for a in answers)  # one line, stripped


def test_level_one_counts_lines_and_files():
    env = make_task("os", levels=[1], generated=200, sandbox="bwrap")
    questions = [env.item(i).description for i in range(env.num_instances)]
    assert sum("How many lines" in q for q in questions) > 50
    assert sum("How many files" in q for q in questions) > 50


@needs_bwrap
@pytest.mark.parametrize("level", [0, 1])
def test_oracle_solves_every_generated_level_and_random_never(level):
    env = make_task("os", levels=[level], generated=16, sandbox="bwrap")
    assert check("os", env, "oracle").success_rate == 1.0
    assert check("os", env, "random").success_rate == 0.0
    assert check("os", env, "teacher").success_rate == 1.0
    demo = make_task("os", levels=[level], generated=6, sandbox="bwrap", demo=True)
    assert check("os", demo, "oracle").success_rate == 1.0


@needs_bwrap
def test_what_the_model_is_shown_is_the_example_as_written(smollm_tokenizer):
    """SFT data and demos play the teacher: the item's own command, none of the oracle's
    output marks or byte escapes (which a warm start would otherwise teach)."""
    from agentrl.actors import EpisodeLimits
    from agentrl.environments import ChatFormat
    from agentrl.ops.sft.data import oracle_trajectory

    env = make_task("os", levels=[0, 1], generated=8, sandbox="bwrap")
    limits = EpisodeLimits(max_turns=8, max_tokens=2048, max_new_tokens=96)
    fmt = ChatFormat(smollm_tokenizer)
    for index in (0, 1):
        traj = oracle_trajectory("os", env, index, fmt, smollm_tokenizer, limits)
        mask = zip(traj.token_ids, traj.loss_mask, strict=True)
        said = smollm_tokenizer.decode([t for t, m in mask if m])
        assert env.item(index).example.code in said
        assert "AGENTRL" not in said and "\\x" not in said and "eval" not in said
    demo = make_task("os", levels=[0], generated=4, sandbox="bwrap", demo=True)
    shown = " ".join(m.content for m in demo.start(0).messages)
    assert "AGENTRL" not in shown and "\\x" not in shown


@needs_bwrap
def test_level_zero_is_one_cat_then_the_answer_within_four_turns():
    env = make_task("os", levels=[0], generated=10, sandbox="bwrap")
    item = env.item(3)
    start = env.start(3)
    question = start.messages[-1].content
    path = item.example.code.split()[-1]
    assert path in question and item.match.answer not in question
    step = env.interact(start.session, _say("bash_action", script=f"cat {path}"))
    assert item.match.answer in step.messages[0].content
    step = env.interact(start.session, _say("answer_action", answer=item.match.answer + "\n"))
    assert step.reward == 1.0 and step.metrics["env/level"] == 0.0
    # any other answer scores 0
    start = env.start(3)
    step = env.interact(start.session, _say("answer_action", answer=item.match.answer + "x"))
    assert step.reward == 0.0
    # a level-0 session ends after four turns without an answer
    session = env.start(4).session
    steps = [env.interact(session, _say("bash_action", script="ls")) for _ in range(4)]
    assert [s.finish for s in steps] == [False, False, False, True]
    assert steps[-1].status.value == "task_limit_reached"


def test_levels_cycle_with_the_index_and_the_full_level_uses_each_item_once():
    env = make_task("os", levels=[0, 2], split="all", sandbox="bwrap")
    items = [make_task("os", split="all", sandbox="bwrap").item(i) for i in range(13)]
    assert env.num_instances == 2 * len(items)
    assert [env.item(i).level for i in range(4)] == [0, 2, 0, 2]
    assert [env.item(2 * k + 1) for k in range(len(items))] == items
    with pytest.raises(ValueError, match="levels"):
        make_task("os", levels=[5])
    with pytest.raises(ValueError, match="generated"):
        make_task("os", levels=[0], generated=0)


@needs_bwrap
def test_with_both_levels_the_demo_is_an_instance_of_the_same_level():
    plain = make_task("os", levels=[0, 1], generated=4, sandbox="bwrap")
    demoed = make_task("os", levels=[0, 1], generated=4, sandbox="bwrap", demo=2)
    assert demoed.levels == (0, 1)
    for index in (0, 1):
        shown = demoed.start(index)
        # system, demo question, call, reply, call, question: the demo plays index + 2
        assert shown.messages[1].content == QUESTION.format(
            description=plain.item(index + 2).description
        )
        assert shown.messages[-1].content == QUESTION.format(
            description=plain.item(index).description
        )
        demoed.cancel(shown.session)

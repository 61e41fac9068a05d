"""The db task's train/test split and its generated levels (`tasks.db.levels`)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments.tasks.db.items import content_key, load_items
from agentrl.environments.tasks.toolkit.split import check_disjoint
from agentrl.messages import ChatMessage, ToolCall

AGENTBENCH_DB = (
    Path(__file__).resolve().parents[3] / "shared" / "agentbench" / "dbbench" / "dev.jsonl"
)
DATA_SETS = [None] + ([str(AGENTBENCH_DB)] if AGENTBENCH_DB.exists() else [])


def _keys(env) -> list[str]:
    return [content_key(env.item(i)) for i in range(env.num_instances)]


@pytest.mark.parametrize("data", DATA_SETS)
def test_train_and_test_split_the_data_set_without_overlap(data):
    train, test, every = (make_task("db", data=data, split=s) for s in ("train", "test", "all"))
    assert train.num_instances + test.num_instances == every.num_instances
    assert train.num_instances > 0 and test.num_instances > 0
    check_disjoint(_keys(train), _keys(test), "db")
    assert sorted(_keys(train) + _keys(test)) == sorted(_keys(every))


def test_the_split_follows_content_not_file_order(tmp_path):
    lines = Path(load_items.__code__.co_filename).parent.joinpath("data/db_builtin.jsonl")
    reordered = tmp_path / "reordered.jsonl"
    reordered.write_text("\n".join(reversed(lines.read_text().splitlines())) + "\n")
    for split in ("train", "test"):
        original = set(_keys(make_task("db", split=split)))
        assert set(_keys(make_task("db", data=str(reordered), split=split))) == original


@pytest.mark.parametrize("level", [0, 1])
def test_generated_levels_are_disjoint_distinct_and_deterministic(level):
    train = make_task("db", levels=[level], split="train", generated=400)
    test = make_task("db", levels=[level], split="test", generated=400)
    train_keys, test_keys = _keys(train), _keys(test)
    check_disjoint(train_keys, test_keys, "db")
    assert len(set(train_keys)) > 300 and len(set(test_keys)) > 300  # hundreds per split
    again = make_task("db", levels=[level], split="train", generated=400)
    assert _keys(again)[:50] == train_keys[:50]
    other_seed = make_task("db", levels=[level], split="train", seed=1, generated=400)
    assert _keys(other_seed)[:50] != train_keys[:50]
    assert {train.item(i).level for i in range(20)} == {level}


@pytest.mark.parametrize("level", [0, 1])
def test_oracle_solves_every_generated_level_and_random_rarely(level):
    env = make_task("db", levels=[level], generated=100)
    assert check("db", env, "oracle").success_rate == 1.0
    assert check("db", env, "random").success_rate <= 0.1
    demo = make_task("db", levels=[level], generated=20, demo=True)
    assert check("db", demo, "oracle").success_rate == 1.0


def test_level_zero_is_one_select_then_a_commit_within_four_turns():
    env = make_task("db", levels=[0], generated=10)
    item = env.item(3)
    start = env.start(3)
    question = start.messages[-1].content
    column = item.description.split('"')[1]
    assert item.table_name in question and column in question

    def say(name, **arguments):
        return ChatMessage("assistant", "", [ToolCall("c", name, json.dumps(arguments))])

    step = env.interact(
        start.session, say("execute_sql", query=f"SELECT {column} FROM {item.table_name}")
    )
    values = [row[0] for row in ast.literal_eval(step.messages[0].content)]
    step = env.interact(start.session, say("commit_final_answer", answers=[str(v) for v in values]))
    assert step.reward == 1.0 and step.metrics["env/level"] == 0.0
    # a level-0 session ends after four turns without a commit
    session = env.start(4).session
    steps = [env.interact(session, say("execute_sql", query="SELECT 1")) for _ in range(4)]
    assert [s.finish for s in steps] == [False, False, False, True]
    assert steps[-1].status.value == "task_limit_reached"


def test_levels_cycle_with_the_index_and_the_full_level_uses_each_item_once():
    env = make_task("db", levels=[0, 2], split="all")
    items = load_items()
    assert env.num_instances == 2 * len(items)
    assert [env.item(i).level for i in range(4)] == [0, 2, 0, 2]
    assert [env.item(2 * k + 1) for k in range(len(items))] == items
    with pytest.raises(ValueError, match="levels"):
        make_task("db", levels=[5])
    with pytest.raises(ValueError, match="split"):
        make_task("db", split="dev")


@pytest.mark.parametrize("level", [0, 1])
def test_the_oracle_queries_before_it_commits(level):
    """An SFT episode or a demo must show where the answer comes from: the oracle runs the
    item's gold query, whose rows hold every value it then commits."""
    import random

    from agentrl.environments._check import scripts_for

    env = make_task("db", levels=[level], generated=20)
    oracle = scripts_for("db", env)["oracle"]
    for index in range(10):
        calls = list(oracle(env, index, random.Random(0)))
        assert [c.name for c in calls] == ["execute_sql", "commit_final_answer"]
        start = env.start(index)
        shown = env.interact(start.session, ChatMessage("assistant", "", [calls[0]]))
        rows = ast.literal_eval(shown.messages[0].content)
        answers = json.loads(calls[1].arguments)["answers"]
        assert sorted(answers) == sorted(str(row[0]) for row in rows)
        env.cancel(start.session)

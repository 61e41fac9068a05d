"""The kg task's train/test split and its generated levels (`tasks.kg.levels`)."""

from __future__ import annotations

import pytest

from agentrl.environments import make_task
from agentrl.environments._check import check
from agentrl.environments.tasks.kg.items import content_key
from agentrl.environments.tasks.toolkit.split import check_disjoint
from agentrl.messages import ChatMessage


def _keys(env) -> list[str]:
    return [content_key(env.item(i)) for i in range(env.num_instances)]


def test_train_and_test_split_the_built_in_set_without_overlap():
    train, test, every = (make_task("kg", split=s) for s in ("train", "test", "all"))
    assert train.num_instances + test.num_instances == every.num_instances == 14
    assert train.num_instances > 0 and test.num_instances > 0
    check_disjoint(_keys(train), _keys(test), "kg")


@pytest.mark.parametrize(("level", "distinct"), [(0, 80), (1, 250)])
def test_generated_levels_are_disjoint_and_deterministic(level, distinct):
    """Level 0 draws from the built-in graph's 132 one-hop paths, level 1 from its 404
    two-hop ones (`tasks.kg.levels`): about three quarters of them are training instances."""
    train = make_task("kg", levels=[level], split="train", generated=1500)
    test = make_task("kg", levels=[level], split="test", generated=1500)
    train_keys, test_keys = _keys(train), _keys(test)
    check_disjoint(train_keys, test_keys, "kg")
    assert len(set(train_keys)) > distinct and len(set(test_keys)) > distinct // 4
    again = make_task("kg", levels=[level], split="train", generated=30)
    assert _keys(again) == train_keys[:30]
    assert {train.item(i).level for i in range(10)} == {level}


@pytest.mark.parametrize("level", [0, 1])
def test_the_oracle_solves_every_generated_level_with_and_without_a_demo(level):
    env = make_task("kg", levels=[level], generated=60)
    assert check("kg", env, "oracle").success_rate == 1.0
    assert check("kg", env, "random").success_rate < 0.3
    assert (
        check("kg", make_task("kg", levels=[level], generated=20, demo=True), "oracle").success_rate
        == 1.0
    )


def test_level_zero_names_entity_and_relation_and_has_four_turns():
    env = make_task("kg", levels=[0], generated=10)
    item = env.item(2)
    start = env.start(2)
    question = start.messages[-1].content
    (name, entity), relation = item.entities[0], item.actions[0].args[1]
    assert name in question and relation in question
    assert question.endswith(f"\nEntities: [{name}]") and entity not in question  # AgentBench's
    assert len(item.actions) == 1
    steps = [env.interact(start.session, ChatMessage("assistant", "hm")) for _ in range(4)]
    assert [s.finish for s in steps] == [False, False, False, True]


def test_level_answers_leave_out_the_start_as_agentbench_queries_do():
    """A variable's query drops the entities its program names (AgentBench's
    ``utils/logic_form_util.py`` line 675), so a level's gold answer never holds the
    entity it starts at, and every path counted has a non-empty answer."""
    from agentrl.environments.tasks.kg.backend import RDFBackend, load_graph
    from agentrl.environments.tasks.kg.levels import HopPaths

    paths = HopPaths(RDFBackend(load_graph()))
    assert (paths.count(0), paths.count(1)) == (132, 404)
    for level in (0, 1):
        env = make_task("kg", levels=[level], generated=200, split="all")
        for i in range(env.num_instances):
            item = env.item(i)
            assert item.answers and item.entities[0][1] not in item.answers


def test_levels_need_the_local_graph_and_valid_numbers():
    with pytest.raises(ValueError, match="local graph"):
        make_task("kg", levels=[0], endpoint="http://127.0.0.1:9/sparql")
    with pytest.raises(ValueError, match="levels"):
        make_task("kg", levels=[3])
    assert [make_task("kg", levels=[1, 2]).item(i).level for i in range(4)] == [1, 2, 1, 2]


def test_the_oracle_answers_in_text_in_sft_data(smollm_tokenizer):
    """AgentBench's kg has no answer tool: the oracle's last turn is the text
    ``Final Answer: #N`` (then end-of-turn), and the episode it makes is solved."""
    from agentrl.actors import EpisodeLimits
    from agentrl.environments import ChatFormat
    from agentrl.ops.sft.data import oracle_trajectory

    fmt = ChatFormat(smollm_tokenizer)
    env = make_task("kg", levels=[0], generated=4, split="train")
    limits = EpisodeLimits(max_turns=4, max_tokens=4096, max_new_tokens=96)
    sft = oracle_trajectory("kg", env, 1, fmt, smollm_tokenizer, limits)
    assert not isinstance(sft, str), sft
    assert (sft.status, sft.reward, sft.num_turns) == ("completed", 1.0, 2)
    last = smollm_tokenizer.decode(sft.token_ids[-len(fmt.end_of_turn_ids) - 6 :])
    assert last.endswith("Final Answer: #0<|im_end|>"), last

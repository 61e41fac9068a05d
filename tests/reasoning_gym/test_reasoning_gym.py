"""The reasoning_gym tasks on reasoning-gym's own datasets and scorers (tox -e reasoning-gym)."""

from __future__ import annotations

import json
import uuid

import pytest

from agentrl.environments import Status, make_task
from agentrl.environments._check import agent_message, check
from agentrl.environments._conformance import conformance
from agentrl.messages import ChatMessage, ToolCall

pytestmark = pytest.mark.reasoning_gym

DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting"]


def _text(text: str) -> ChatMessage:
    return ChatMessage("assistant", text)


def _submit(answer) -> ChatMessage:
    return agent_message(ToolCall("c0", "submit_answer", json.dumps({"answer": answer})))


@pytest.mark.parametrize("mode", ["answer", "tool"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_the_protocol_contract_holds(dataset, mode):
    report = conformance(f"reasoning_gym:{dataset}", {"mode": mode, "size": 50})
    assert report.violations == [], report.format()
    assert report.episodes == 20


@pytest.mark.parametrize("mode", ["answer", "tool"])
@pytest.mark.parametrize("dataset", DATASETS)
def test_the_oracle_scores_one_on_every_instance(dataset, mode):
    name = f"reasoning_gym:{dataset}"
    env = make_task(name, mode=mode, size=100, split="all")
    report = check(name, env, "oracle")
    assert (report.successes, report.instances) == (100, 100), report.failures[:3]


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_wrong_answer_scores_zero_and_a_right_one_one(dataset):
    env = make_task(f"reasoning_gym:{dataset}", size=20)
    for index in range(20):
        answer = env.item(index).entry["answer"]
        wrong = str(int(answer) + 1)  # never holds the answer: no partial credit either
        for said, reward in ((wrong, 0.0), (answer, 1.0)):
            start = env.start(index)
            step = env.interact(start.session, _text(f"Thinking... <answer>{said}</answer>"))
            assert (step.status, step.reward, step.finish) == (Status.COMPLETED, reward, True)
            assert step.metrics["env/success"] == reward and step.metrics["env/score"] == reward


def test_the_reward_is_reasoning_gyms_own_score_partial_credit_included():
    env = make_task("reasoning_gym:chain_sum", size=5)
    item = env.item(0)
    longer = f"{item.entry['answer']} apples"
    expected = item.dataset.score_answer(longer, item.entry)
    assert 0.0 < expected < 1.0  # the base class's len(answer) / len(reply)
    step = env.interact(env.start(0).session, _text(f"<answer>{longer}</answer>"))
    assert step.status == Status.COMPLETED and step.reward == pytest.approx(expected)
    assert step.metrics["env/success"] == 0.0


@pytest.mark.parametrize("dataset", DATASETS)
def test_train_and_test_never_share_a_question_nor_a_seed(dataset):
    train = make_task(f"reasoning_gym:{dataset}", split="train", size=300)
    test = make_task(f"reasoning_gym:{dataset}", split="test", size=100)
    train_items = [train.item(i) for i in range(300)]
    test_items = [test.item(i) for i in range(100)]
    questions = {i.entry["question"] for i in train_items}
    assert not questions & {i.entry["question"] for i in test_items}
    # reasoning-gym draws item k from seed + k: disjoint indices are disjoint seeds
    assert not {i.index for i in train_items} & {i.index for i in test_items}
    assert {train.describe(i) for i in range(300)}.isdisjoint(test.describe(i) for i in range(100))


def test_split_all_is_reasoning_gyms_own_sequence():
    import reasoning_gym

    env = make_task("reasoning_gym:basic_arithmetic", split="all", seed=7, size=10)
    theirs = reasoning_gym.create_dataset("basic_arithmetic", seed=7, size=10)
    assert [env.item(i).entry["question"] for i in range(10)] == [e["question"] for e in theirs]


def test_a_malformed_reply_is_the_models_failure_with_a_reward():
    env = make_task("reasoning_gym:basic_arithmetic", size=5)
    for text in ("The answer is 4.", "<answer>4", "", "<answer >4</answer>"):
        step = env.interact(env.start(0).session, _text(text))
        assert (step.status, step.reward, step.finish) == (Status.AGENT_INVALID_ACTION, 0.0, True)
        assert step.metrics["env/bad_calls"] == 1.0 and step.metrics["env/answered"] == 0.0


def test_tool_mode_reminds_counts_bad_calls_and_ends_at_the_turn_limit():
    env = make_task("reasoning_gym:leg_counting", mode="tool", max_turns=3, size=5)
    assert [t["function"]["name"] for t in env.tools] == ["submit_answer"]
    start = env.start(0)
    step = env.interact(start.session, _text("Let me count."))
    assert step.status == Status.RUNNING and step.reward == 0.0
    assert [m.role for m in step.messages] == ["user"]
    bad = agent_message(ToolCall("c1", "submit", json.dumps({"x": 1})))
    step = env.interact(start.session, bad)
    assert step.status == Status.RUNNING and step.messages[0].content.startswith("error:")
    step = env.interact(start.session, _text("Still counting."))
    assert (step.status, step.reward) == (Status.TASK_LIMIT_REACHED, 0.0)
    assert step.metrics["env/bad_calls"] == 3.0 and step.metrics["env/turns"] == 3.0
    # a number submitted as a JSON number is read as its text
    answer = int(env.item(1).entry["answer"])
    step = env.interact(env.start(1).session, _submit(answer))
    assert (step.status, step.reward) == (Status.COMPLETED, 1.0)


def test_a_scorer_that_raises_is_the_tasks_failure_not_a_crash(monkeypatch):
    env = make_task("reasoning_gym:chain_sum", size=5)
    item = env.item(0)

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(item.dataset, "score_answer", broken)
    step = env.interact(env.start(0).session, _text("<answer>1</answer>"))
    assert (step.status, step.reward, step.finish) == (Status.TASK_ERROR, 0.0, True)


def test_levels_follow_reasoning_gyms_curriculum_and_config_overrides_a_field():
    from reasoning_gym.factory import create_curriculum

    env = make_task("reasoning_gym:chain_sum", levels=[0, 2], size=10, config={"max_terms": 2})
    curriculum = create_curriculum("chain_sum")
    curriculum.set_global_level(2)
    level2 = curriculum.generate_configuration({})
    item = env.item(1)
    assert item.level == 2 and env.item(0).level == 0
    assert item.dataset.config.max_digits == level2.max_digits
    assert item.dataset.config.max_terms == 2  # the config option over the level's config
    step = env.interact(env.start(1).session, _text(f"<answer>{item.entry['answer']}</answer>"))
    assert step.metrics["env/level"] == 2.0 and step.reward == 1.0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"dataset": "basic_arithmetc"}, "did you mean basic_arithmetic"),
        ({"mode": "chat"}, "mode must be one of answer, tool"),
        ({"config": {"no_such_field": 1}}, "bad config for basic_arithmetic"),
        ({"config": {"seed": 3}}, "give seed as the task's option"),
        ({"levels": [99]}, "levels must be in 0.."),
        ({"split": "neither"}, "split must be one of"),
    ],
)
def test_bad_options_are_refused_when_the_task_is_built(options, says):
    name = "reasoning_gym" if "dataset" in options else "reasoning_gym:basic_arithmetic"
    with pytest.raises(ValueError, match=says):
        make_task(name, **options)


def test_a_config_naming_the_task_parses_and_refuses_an_unknown_option(tmp_path):
    from agentrl.ops import ConfigError, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, "memory://rg-parse", "rg-parse")
    raw["tasks"] = {"reasoning_gym:basic_arithmetic": {"options": {"size": 50, "mode": "tool"}}}
    cfg = parse_config(raw)
    assert cfg.tasks["reasoning_gym:basic_arithmetic"].options == {"size": 50, "mode": "tool"}
    raw["tasks"] = {"reasoning_gym:basic_arithmetic": {"options": {"sizes": 50}}}
    with pytest.raises(ConfigError, match="unexpected keyword argument 'sizes'"):
        parse_config(raw)


def test_the_example_config_mixing_reasoning_gym_with_a_built_in_task_parses():
    from pathlib import Path

    import yaml

    from agentrl.ops import parse_config

    path = Path(__file__).resolve().parents[2] / "examples" / "reasoning_gym" / "config.yaml"
    cfg = parse_config(yaml.safe_load(path.read_text()))
    assert set(cfg.tasks) == {"reasoning_gym:letter_counting", "calculator"}
    assert cfg.tasks["reasoning_gym:letter_counting"].options["mode"] == "tool"


@pytest.mark.slow
def test_reasoning_gym_trains_one_step_in_the_whole_loop(tmp_path):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    run = f"smoke-rg-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, f"memory://{run}", run, steps=1)
    raw["tasks"] = {"reasoning_gym:basic_arithmetic": {"options": {"size": 50}}}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    (metrics,) = [
        json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["version"] == 1
    assert metrics["env/reasoning_gym:basic_arithmetic/episodes"] == 4

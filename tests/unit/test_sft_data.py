"""Oracle trajectories for `agentrl sft`: the rollout's token format, skips, the task mix."""

from __future__ import annotations

import dataclasses
import threading
import uuid

import pykka
import pytest

from agentrl.actors import EpisodeLimits, RolloutActor, SamplerActor, TopologySpec
from agentrl.actors._fakes import ScriptedEngine
from agentrl.environments import ChatFormat, make_task, register_task
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.messages import EpisodeRequest, Topology, Trajectory, connect, decode, encode
from agentrl.messages._memory import reset_memory_broker
from agentrl.ops.sft.data import OracleMix, SFTDataError, make_train_task, oracle_trajectory

LIMITS = EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=64)


@pytest.fixture(autouse=True)
def _stop_actors():
    yield
    pykka.ActorRegistry.stop_all()


@pytest.fixture(scope="module")
def fmt(smollm_tokenizer):
    return ChatFormat(smollm_tokenizer)


def segments(traj: Trajectory) -> dict[int, list[int]]:
    """The assistant turns of a trajectory, keyed by the position they start at."""
    out: dict[int, list[int]] = {}
    start = None
    for i, m in enumerate([*traj.loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out[start] = traj.token_ids[start:i]
            start = None
    return out


def rollout_of(tokenizer, fmt, task: str, env, sft: Trajectory) -> Trajectory:
    """What the rollout records when its engine "samples" exactly the SFT turns' ids."""
    turns = segments(sft)

    def respond(prompt_ids: list[int], version: int) -> list[int]:
        return turns.get(len(prompt_ids), [fmt.end_of_turn_ids[-1]])

    broker = f"memory://sft-{uuid.uuid4().hex[:8]}"
    spec = TopologySpec(run=f"r{uuid.uuid4().hex[:6]}", pools=("current",), trajectory_capacity=8)
    client = connect(broker, name="client")
    names = Topology(spec.run)
    names.declare(client, list(spec.pools), spec.trajectory_capacity)
    try:
        SamplerActor.start(
            broker=broker,
            topology=spec,
            pool="current",
            every=1,
            engine_factory=lambda: ScriptedEngine(respond),
            sampler_id="s0",
            query_timeout=0.2,
        )
        RolloutActor.start(
            broker=broker,
            topology=spec,
            environments={task: env},
            chat_format=fmt,
            pool_weights={"current": 1.0},
            limits=LIMITS,
            concurrency=1,
            rollout_id="r0",
        )
        got: list[Trajectory] = []
        done = threading.Event()

        def on_message(d):
            got.append(decode(d.body, expect=Trajectory).payload)
            d.ack()
            done.set()

        client.consume(names.trajectories, on_message, prefetch=1)
        request = EpisodeRequest("e0", task, sft.index, "g0", 0, 2, 0)
        client.publish("", names.episodes, encode(request, run=spec.run)).result(5)
        assert done.wait(30), "no trajectory from the rollout"
        return got[0]
    finally:
        client.close()
        pykka.ActorRegistry.stop_all()
        reset_memory_broker(broker.removeprefix("memory://"))


@pytest.mark.parametrize(("task", "index"), [("calculator", 3), ("db", 0), ("db", 2)])
def test_sft_ids_are_the_ids_the_rollout_records_for_the_same_text(
    smollm_tokenizer, fmt, task, index
):
    env, _ = make_train_task(task, {})
    sft = oracle_trajectory(task, env, index, fmt, smollm_tokenizer, LIMITS)
    assert isinstance(sft, Trajectory), sft
    rolled = rollout_of(smollm_tokenizer, fmt, task, env, sft)
    assert (rolled.status, rolled.reward, rolled.num_turns) == ("completed", 1.0, sft.num_turns)
    assert rolled.token_ids == sft.token_ids  # no retokenisation drift, prompt to last turn
    assert rolled.loss_mask == sft.loss_mask


def test_an_assistant_turn_is_the_call_text_then_end_of_turn(smollm_tokenizer, fmt):
    env = make_task("calculator", levels=[1])
    sft = oracle_trajectory("calculator", env, 0, fmt, smollm_tokenizer, LIMITS)
    expression = env.problem(0).expression
    turns = list(segments(sft).values())
    assert sft.num_turns == len(turns) == 2 and sft.pools == ["oracle", "oracle"]
    assert smollm_tokenizer.decode(turns[0]) == (
        '<tool_call>{"name": "calculate", "arguments": {"expression": "'
        + expression
        + '"}}</tool_call><|im_end|>'
    )
    assert all(t[-len(fmt.end_of_turn_ids) :] == fmt.end_of_turn_ids for t in turns)
    assert sft.loss_mask[0] == 0 and sft.loss_mask[-1] == 1  # ends on the final turn's stop


class _WrongJudge:
    """The calculator with a judge that never pays: its oracle episodes all fail."""

    def __init__(self) -> None:
        self.inner_task = CalculatorTask(num_instances=5)
        self.tools = self.inner_task.tools
        self.num_instances = 5
        self.cancelled = 0

    def problem(self, index):
        return self.inner_task.problem(index)

    def start(self, index):
        return self.inner_task.start(index)

    def interact(self, session, message):
        step = self.inner_task.interact(session, message)
        return dataclasses.replace(step, reward=0.0) if step.finish else step

    def cancel(self, session):
        self.cancelled += 1
        self.inner_task.cancel(session)


def test_failed_and_too_long_episodes_are_skipped_and_counted(smollm_tokenizer, fmt, monkeypatch):
    monkeypatch.setattr("agentrl.ops.sft.data.MAX_CONSECUTIVE_SKIPS", 4)
    env = _WrongJudge()
    assert oracle_trajectory("calculator", env, 0, fmt, smollm_tokenizer, LIMITS) == "failed"
    short = EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=8)
    calc = make_task("calculator")
    assert oracle_trajectory("calculator", calc, 0, fmt, smollm_tokenizer, short) == "too_long"
    one_turn = EpisodeLimits(max_turns=1, max_tokens=2048, max_new_tokens=64)
    assert oracle_trajectory("calculator", env, 1, fmt, smollm_tokenizer, one_turn) == "too_long"
    assert env.cancelled == 1  # the cut episode's session was released
    mix = OracleMix({"calculator": env}, {"calculator": 1.0}, fmt, smollm_tokenizer, LIMITS)
    with pytest.raises(SFTDataError, match="no usable episode on 4 instances"):
        mix.sample(1)
    assert mix.skipped["calculator"] == {"failed": 4}


def test_tasks_are_mixed_by_weight_and_instances_visited_once_per_pass(smollm_tokenizer, fmt):
    envs = {
        "calculator": make_task("calculator", num_instances=6),
        "db": make_train_task("db", {})[0],
    }
    mix = OracleMix(envs, {"calculator": 3.0, "db": 1.0}, fmt, smollm_tokenizer, LIMITS, seed=1)
    episodes = mix.sample(40)
    assert mix.counts["calculator"] + mix.counts["db"] == 40
    assert 22 <= mix.counts["calculator"] <= 38  # 30 expected (binomial sd ~2.7)
    calc = [t.index for t in episodes if t.task == "calculator"]
    assert sorted(calc[:6]) == list(range(6))  # every instance once before any twice
    again = OracleMix(envs, {"calculator": 3.0, "db": 1.0}, fmt, smollm_tokenizer, LIMITS, seed=1)
    assert [(t.task, t.index) for t in again.sample(40)] == [(t.task, t.index) for t in episodes]


def test_the_train_split_is_asked_for_when_the_task_has_one():
    seen = {}

    def factory(*, split: str = "all", size: int = 3):
        seen["split"] = split
        return make_task("calculator", num_instances=size)

    name = f"split-{uuid.uuid4().hex[:6]}"
    register_task(name, factory)
    assert make_train_task(name, {"size": 2})[1] == "train" and seen["split"] == "train"
    plain = f"plain-{uuid.uuid4().hex[:6]}"
    register_task(plain, lambda *, size=3: make_task("calculator", num_instances=size))
    env, split = make_train_task(plain, {"size": 7})
    assert (split, env.num_instances) == ("all", 7)  # a task without splits: all of it
    with pytest.raises(TypeError):  # the options' own problem still surfaces
        make_train_task(plain, {"colour": 1})
    with pytest.raises(SFTDataError, match="train split"):
        make_train_task(name, {"split": "test"})

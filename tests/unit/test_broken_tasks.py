"""Tasks that are broken rather than hostile: their calls raise, block, or return rewards and
schemas that must not be trained on. Each is one episode's infra failure, never the run's end,
until the task keeps failing."""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid

import pykka
import pytest
import structlog

from agentrl.actors import EpisodeLimits, RolloutActor, SamplerActor
from agentrl.actors._fakes import ScriptedEngine
from agentrl.environments import ChatFormat, TaskOptionsError, _registry, make_task
from agentrl.environments._guard import GuardedEnvironment, TaskFailure
from agentrl.environments.tasks.calculator.task import CalculatorTask
from agentrl.messages import ChatMessage, EpisodeRequest, ToolCall, Topology, encode
from tests.unit import flaky_task
from tests.unit.flaky_task import FlakyCalculator
from tests.unit.scripts import calculator_script


@pytest.fixture(autouse=True)
def _release_blocked_calls():
    flaky_task.RELEASE.clear()
    yield
    flaky_task.RELEASE.set()  # the abandoned threads return and end
    pykka.ActorRegistry.stop_all()


def _answer(value) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c1", "answer", json.dumps({"value": value}))])


# --- the guard on each call -------------------------------------------------------------


def test_an_exception_of_the_task_is_a_task_failure_naming_the_task_and_class():
    env = GuardedEnvironment("flaky", FlakyCalculator(raise_every=1), timeout=5)
    with pytest.raises(TaskFailure, match=r"task 'flaky': RuntimeError: start raised") as info:
        env.start(0)
    assert info.value.kind == "RuntimeError" and isinstance(info.value.__cause__, RuntimeError)


def test_a_call_that_blocks_is_abandoned_at_its_deadline_on_a_daemon_thread():
    env = GuardedEnvironment("stuck", FlakyCalculator(block_every=1), timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(TaskFailure, match=r"task 'stuck': timeout: start did not return"):
        env.start(0)
    assert time.monotonic() - t0 < 3
    (stuck,) = [t for t in threading.enumerate() if t.name == "task-stuck-start"]
    assert stuck.daemon  # it cannot keep the process alive at exit


@pytest.mark.parametrize(
    ("reward", "says"),
    [
        (7.0, "outside the declared range [0, 1]"),
        ("0.5", "is a str, not a number"),
        (math.nan, "is not finite"),
        (math.inf, "is not finite"),
        (True, "is a bool, not a number"),
    ],
)
def test_a_finishing_reward_that_is_no_trainable_number_is_refused(reward, says):
    env = GuardedEnvironment("bad-reward", FlakyCalculator(reward=reward), timeout=5)
    start = env.start(0)
    with pytest.raises(TaskFailure, match=f"task 'bad-reward': contract: .*{re.escape(says)}"):
        env.interact(start.session, _answer(0))


def test_a_declared_reward_range_is_the_bound():
    task = FlakyCalculator(reward=1.5)
    task.reward_range = (-1.0, 2.0)
    env = GuardedEnvironment("wide", task, timeout=5)
    start = env.start(0)
    assert env.interact(start.session, _answer(0)).reward == 1.5


def test_a_task_with_an_invalid_tool_schema_is_refused_when_it_is_built(monkeypatch):
    class NoParameters(CalculatorTask):
        @property
        def tools(self):
            return [{"type": "function", "function": {"name": "answer", "description": "x"}}]

    monkeypatch.setitem(_registry._factories, "no-parameters", NoParameters)
    with pytest.raises(TaskOptionsError) as info:
        make_task("no-parameters")
    assert str(info.value) == (
        "task 'no-parameters': invalid tool schema: tool 'answer': parameters must be a JSON "
        "schema of type object"
    )


# --- the rollout: retried, counted, and the run stopped only when a task keeps failing ---


def _start_rollout(broker, spec, tokenizer, env, **kw):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(calculator_script(tokenizer, fmt.end_of_turn_ids[-1], "oracle"))
    SamplerActor.start(
        broker=broker, topology=spec, pool="current", every=1,
        engine_factory=lambda: engine, sampler_id="s0", query_timeout=0.2,
    )  # fmt: skip
    return RolloutActor.start(
        broker=broker, topology=spec, environments={"flaky": env}, chat_format=fmt,
        pool_weights={"current": 1.0}, limits=EpisodeLimits(max_turns=4, max_tokens=2048,
        max_new_tokens=64), concurrency=2, rollout_id="r0", **kw,
    )  # fmt: skip


def _publish(client, spec, n):
    for i in range(n):
        req = EpisodeRequest(f"e{i}", "flaky", i, "g0", i, n, 0)
        client.publish("", Topology(spec.run).episodes, encode(req, run=spec.run)).result(5)


def test_a_task_that_raises_now_and_then_has_its_episodes_retried_and_counted(
    broker, spec, client, smollm_tokenizer
):
    from tests.unit.test_actors import collect_trajectories

    # calls 0, 5, 10, ... raise (an episode is start, calculate, answer: 3 calls)
    ref = _start_rollout(
        broker, spec, smollm_tokenizer, FlakyCalculator(raise_every=5), env_timeout=5
    )
    _publish(client, spec, 4)
    trajs = collect_trajectories(client, Topology(spec.run), 4)
    done = [t for t in trajs if not t.metrics.get("infra_failure")]
    assert all(t.status == "completed" and t.reward == 1.0 for t in done)
    assert max(t.metrics["env/failed_attempts"] for t in done) >= 1  # retried, then trained
    stats = ref.proxy().stats().get()
    assert stats["task_failures/flaky/RuntimeError"] == stats["infra_retries"] >= 1
    assert ref.is_alive()


def test_a_task_that_keeps_failing_stops_the_run_with_one_line(
    broker, spec, client, smollm_tokenizer
):
    fatal: list[str] = []
    with structlog.testing.capture_logs() as logs:
        ref = _start_rollout(
            broker, spec, smollm_tokenizer, FlakyCalculator(raise_every=1),
            env_timeout=5, on_fatal=fatal.append, failure_window=4,
        )  # fmt: skip
        _publish(client, spec, 4)
        deadline = time.monotonic() + 30
        while ref.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not ref.is_alive()
    (line,) = fatal
    assert line.startswith("task 'flaky' keeps failing (3 of its last 3 attempts); last: ")
    assert "RuntimeError: start raised: flaky call" in line
    stops = [e for e in logs if e["event"] == "task keeps failing; run stopped"]
    assert [e["reason"] for e in stops] == [line]
    assert not [e for e in logs if e.get("exc_info")]  # no traceback


@pytest.mark.parametrize("reward", [7.0, "0.5"])
def test_a_bad_reward_is_not_trained_on(broker, spec, client, smollm_tokenizer, reward):
    from tests.unit.test_actors import collect_trajectories

    _start_rollout(broker, spec, smollm_tokenizer, FlakyCalculator(reward=reward))
    _publish(client, spec, 1)
    (t,) = collect_trajectories(client, Topology(spec.run), 1)
    assert t.metrics.get("infra_failure") == 1.0, (t.reward, t.env_reward)


# --- the proof: a whole run whose task raises on 10% of calls and blocks on 1% -----------


@pytest.mark.slow
def test_a_run_whose_task_raises_and_blocks_completes_its_updates(tmp_path, monkeypatch):
    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    # call n raises when n % 10 == 3 and blocks (forever, until the test ends) when
    # n % 100 == 1: 10% and 1% of calls; the first block is the second call, so its
    # timeout (0.5 s) comes long before the run's updates are done
    monkeypatch.setitem(
        _registry._factories,
        "flaky-run",
        lambda: FlakyCalculator(raise_every=10, raise_at=3, block_every=100, block_at=1),
    )
    raw = smoke_config(tmp_path, f"memory://flaky-{uuid.uuid4().hex[:6]}", "flaky", steps=2)
    raw["tasks"] = {"flaky-run": {}}
    raw["rollout"].update(task_timeout=0.5)
    cfg = parse_config(raw)
    with structlog.testing.capture_logs() as logs:
        assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().split("\n")
            if line]  # fmt: skip
    assert [m["version"] for m in rows] == [1, 2]
    assert max(m["env/flaky-run/failed_attempts"] for m in rows) > 0
    kinds = {e.get("kind") for e in logs if e["event"] == "infra failure; episode re-issued"}
    assert {"RuntimeError", "timeout"} <= kinds, kinds


# --- the trainer's defence in depth: no NaN or infinity reaches an update -----------------


class _Delivery:
    acked = 0

    def ack(self):
        type(self).acked += 1


@pytest.mark.parametrize(
    ("rewards", "logprob"),
    [
        ([math.nan, 1.0], -1.0),
        ([math.inf, 0.0], -1.0),
        ([1e39, 0.0], -1.0),  # finite in Python, infinite in the float32 the trainer uses
        ([3e38, -3e38, 3e38], -1.0),  # each finite in float32, their advantages are not
        ([1.0, 0.0], math.nan),  # a sampled token's logprob
    ],
)
def test_a_group_with_a_value_that_is_not_finite_is_dropped_with_its_reason(rewards, logprob):
    from agentrl.actors._groups import DropBook, GroupBuffer
    from tests.unit.records import trajectory

    book, dropped = DropBook(None), []

    def drop(gid, group, reason):
        dropped.append((gid, reason))
        book.add(gid, len(group.members), reason, 0)

    buffer = GroupBuffer(
        group_size=len(rewards), groups_per_batch=1, hard_staleness=8, group_timeout=60,
        drop_flat_groups=False, clock=time.monotonic, drop=drop, log=structlog.get_logger(),
    )  # fmt: skip
    for i, reward in enumerate(rewards):
        traj = trajectory([0, 1, 1], reward=reward, logprob=logprob if i == 0 else -1.0,
                          episode_id=f"e{i}", group_size=len(rewards))  # fmt: skip
        buffer.add(traj, _Delivery())
    assert buffer.next_batch(0) is None
    assert dropped == [("g", "non_finite")]
    assert book.metrics()["learner/groups_dropped_total/non_finite"] == 1.0


def test_a_group_of_finite_values_still_trains():
    from agentrl.actors._groups import GroupBuffer
    from tests.unit.records import trajectory

    buffer = GroupBuffer(
        group_size=2, groups_per_batch=1, hard_staleness=8, group_timeout=60,
        drop_flat_groups=False, clock=time.monotonic, drop=None, log=structlog.get_logger(),
    )  # fmt: skip
    for i, reward in enumerate([1.0, -0.2]):
        buffer.add(trajectory([0, 1], reward=reward, episode_id=f"e{i}"), _Delivery())
    assert len(buffer.next_batch(0).trajectories) == 2


def test_a_task_metric_outside_env_is_warned_about_once():
    from agentrl.actors._episode import _warn_dropped_metrics

    task = f"metrics-{uuid.uuid4().hex[:6]}"
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            _warn_dropped_metrics(task, {"turns": 1.0, "env/turns": 1.0, "success": 1.0})
    dropped = [e for e in logs if e["event"].startswith("task metric dropped")]
    assert [(e["task"], e["key"]) for e in dropped] == [(task, "turns")]


# --- agentrl-env check: every violation named, exit 2, never a traceback ------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"raise_every": 1}, "contract: instance 0: start raised RuntimeError: flaky call 0"),
        ({"raise_every": 2, "raise_at": 1}, "interact raised RuntimeError: flaky call 1"),
        ({"reward": "0.5"}, "reward '0.5' is a str, not a number"),
        ({"reward": math.nan}, "reward nan is not finite"),
        ({"reward": 7.0}, "reward 7.0 is outside the declared range [0, 1]"),
    ],
)
def test_the_check_names_each_broken_contract_and_exits_2(monkeypatch, capsys, options, says):
    from agentrl.environments import _check
    from agentrl.ops.cli import agentrl_env

    monkeypatch.setitem(
        _registry._factories, "checked-flaky", lambda: FlakyCalculator(num_instances=20, **options)
    )
    monkeypatch.setitem(_check._SCRIPTS, "checked-flaky", _check._SCRIPTS["calculator"])
    assert agentrl_env.main(["check", "--task", "checked-flaky", "--agent", "oracle"]) == 2
    out = capsys.readouterr()
    assert says in out.out and "Traceback" not in out.out + out.err


def test_the_check_names_a_slow_call():
    from agentrl.environments._check import check

    env = FlakyCalculator(num_instances=2)
    real = env.start
    env.start = lambda index: (time.sleep(0.05), real(index))[1]
    report = check("calculator", env, "oracle", slow=0.01)
    assert report.violations[0].startswith("instance 0: start took ")


def test_partial_rewards_are_summarised_not_listed():
    from agentrl.environments._check import check

    env = FlakyCalculator(reward=0.5, num_instances=40)
    report = check("calculator", env, "oracle")
    assert report.failures == [] and len(report.partial) == 40
    assert report.format().splitlines()[1] == (
        "  partial rewards: 40 instance(s), mean 0.500, min 0.5, max 0.5"
    )

"""The env worker registry: states, reconciliation both ways, idle expiry, a dead worker.

The registry logic runs on a fake clock; the controller tests run it on the
in-process broker with real EnvWorkers, the controller's clock faked (and the
workers' session clocks with it) so no test waits for a timer.
"""

from __future__ import annotations

import json
import threading
import uuid

import pykka
import pytest

from agentrl.actors import (
    ControllerActor,
    EpisodeLimits,
    RolloutActor,
    SamplerActor,
    TaskEntry,
    TopologySpec,
)
from agentrl.actors._env_registry import EnvRegistry, RegistryTimes
from agentrl.actors._fakes import ScriptedEngine
from agentrl.environments import ChatFormat, make_task
from agentrl.environments._worker import EnvWorker, RemoteEnvironment
from agentrl.messages import (
    ChatMessage,
    CheckpointReady,
    MessageError,
    SessionReport,
    SessionsLost,
    ToolCall,
    Topology,
    Trajectory,
    connect,
    decode,
    encode,
)
from agentrl.messages._memory import reset_memory_broker
from tests.unit.scripts import calculator_script
from tests.unit.test_actors import wait_for

TIMES = RegistryTimes(unresponsive_after=3, dead_after=10, orphan_grace=3, idle_limit=5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def env_report(wid: str, sessions: dict[str, float], task: str = "calculator") -> SessionReport:
    return SessionReport(wid, "env", 0.0, task, 4, list(sessions), list(sessions.values()))


def rollout_report(rid: str, claims: dict[str, str], idle: float = 0.0) -> SessionReport:
    """claims: session id -> worker id."""
    n = len(claims)
    return SessionReport(
        rid, "rollout", 0.0, "", 8, list(claims), [idle] * n,
        list(claims.values()), [f"ep-{s}" for s in claims], ["calculator"] * n,
    )  # fmt: skip


# --- the registry on a fake clock ------------------------------------------------------


def test_worker_states_follow_the_age_of_the_last_report():
    reg = EnvRegistry(TIMES)
    reg.observe(env_report("w1", {"s1": 0.0, "s2": 1.0}), now=0.0)
    view = reg.workers(now=2.9)["w1"]
    assert (view["state"], view["sessions"], view["session_ids"]) == ("alive", 2, ["s1", "s2"])
    assert (view["first_seen"], view["last_seen"], view["task"]) == (0.0, 0.0, "calculator")
    assert reg.state("w1", 3.0) == "unresponsive"  # 3 s = unresponsive_after
    assert reg.state("w1", 9.9) == "unresponsive"
    reg.reconcile(10.0)
    assert reg.state("w1", 10.0) == "dead" and reg.counts["workers_died"] == 1
    reg.reconcile(11.0)
    assert reg.counts["workers_died"] == 1  # counted once
    status = reg.status(10.0)
    assert (status["env_workers/dead"], status["env_workers/alive"]) == (1.0, 0.0)
    assert status["env_sessions/live"] == 0.0  # a dead worker's sessions are not live
    assert status["env_worker/calculator/w1/state"] == 2.0
    reg.observe(env_report("w1", {}), now=12.0)  # it was only partitioned: alive again
    assert reg.state("w1", 12.0) == "alive" and reg.workers(12.0)["w1"]["first_seen"] == 0.0


def test_interval_defaults_are_three_and_ten_heartbeats():
    times = RegistryTimes.for_interval(2.0)
    assert (times.unresponsive_after, times.dead_after, times.orphan_grace) == (6.0, 20.0, 6.0)


def test_an_unclaimed_session_is_cancelled_once_after_the_grace_period():
    reg = EnvRegistry(TIMES)
    reg.observe(rollout_report("r0", {"kept": "w1"}), now=0.0)
    reg.observe(env_report("w1", {"kept": 0.0, "orphan": 0.0}), now=0.0)
    assert reg.reconcile(2.9).cancels == {}  # within orphan_grace (3 s)
    reg.observe(rollout_report("r0", {"kept": "w1"}), now=2.9)
    reg.observe(env_report("w1", {"kept": 0.0, "orphan": 0.0}), now=2.9)
    decided = reg.reconcile(3.0)
    assert decided.cancels == {"w1": ["orphan"]} and decided.lost == {}
    assert reg.reconcile(3.1).cancels == {}  # decided once
    assert reg.counts["orphans_cancelled"] == 1
    # still listed (the cancel was in flight): a new grace period starts
    reg.observe(env_report("w1", {"kept": 0.0, "orphan": 0.0}), now=3.5)
    reg.observe(rollout_report("r0", {"kept": "w1"}), now=3.5)
    assert reg.reconcile(6.4).cancels == {}
    assert reg.reconcile(6.5).cancels == {"w1": ["orphan"]}


def test_sessions_of_a_rollout_that_stopped_reporting_become_orphans():
    reg = EnvRegistry(TIMES)
    reg.observe(rollout_report("r0", {"s1": "w1"}), now=0.0)
    for t in (0.0, 4.0, 8.0, 9.9):
        reg.observe(env_report("w1", {"s1": 0.0}), now=t)
        assert reg.reconcile(t).cancels == {}, t  # r0 is still within dead_after
    reg.observe(env_report("w1", {"s1": 0.0}), now=10.0)  # r0 dead: nobody claims s1
    assert reg.reconcile(10.0).cancels == {"w1": ["s1"]}


def test_a_session_its_worker_stopped_listing_is_announced_after_two_reports():
    reg = EnvRegistry(TIMES)
    reg.observe(env_report("w1", {"s1": 0.0}), now=0.0)
    reg.observe(rollout_report("r0", {"s1": "w1", "s2": "w1"}), now=0.5)
    reg.observe(env_report("w1", {"s1": 0.0}), now=1.0)  # s2 missing once
    assert reg.reconcile(1.0).lost == {}
    reg.observe(env_report("w1", {"s1": 0.0}), now=2.0)  # twice
    decided = reg.reconcile(2.0)
    assert decided.lost == {"r0": [("s2", "not on its worker")]} and decided.cancels == {}
    assert reg.reconcile(2.1).lost == {} and reg.counts["lost"] == 1


def test_a_session_listed_again_resets_its_missing_count():
    reg = EnvRegistry(TIMES)
    reg.observe(rollout_report("r0", {"s1": "w1"}), now=0.0)
    reg.observe(env_report("w1", {}), now=1.0)
    reg.observe(env_report("w1", {"s1": 0.0}), now=2.0)
    reg.observe(env_report("w1", {}), now=3.0)
    assert reg.reconcile(3.0).lost == {}


def test_a_session_that_ended_normally_is_not_announced():
    reg = EnvRegistry(TIMES)
    reg.observe(rollout_report("r0", {"s1": "w1"}), now=0.0)
    reg.observe(env_report("w1", {"s1": 0.0}), now=0.5)
    reg.observe(env_report("w1", {}), now=1.0)  # ended on the worker ...
    reg.observe(rollout_report("r0", {}), now=1.2)  # ... and on the rollout
    reg.observe(env_report("w1", {}), now=2.0)
    assert reg.reconcile(2.0).lost == {} and reg.counts["lost"] == 0


def test_sessions_on_a_dead_worker_are_announced_lost():
    reg = EnvRegistry(TIMES)
    reg.observe(env_report("w1", {"s1": 0.0}), now=0.0)
    reg.observe(env_report("w2", {"s2": 0.0}), now=0.0)
    for t in (0.0, 5.0, 10.0):
        reg.observe(rollout_report("r0", {"s1": "w1", "s2": "w2"}), now=t)
        reg.observe(env_report("w2", {"s2": 0.0}), now=t)
    assert reg.reconcile(9.9).lost == {}  # w1 unresponsive only
    decided = reg.reconcile(10.0)
    assert decided.lost == {"r0": [("s1", "worker dead")]}
    assert reg.status(10.0)["env_workers/alive"] == 1.0


def test_a_session_on_a_worker_never_seen_is_announced_after_dead_after():
    reg = EnvRegistry(TIMES)
    reg.observe(rollout_report("r0", {"s1": "ghost"}), now=0.0)
    reg.observe(rollout_report("r0", {"s1": "ghost"}), now=9.0)
    assert reg.reconcile(9.0).lost == {}
    assert reg.reconcile(10.0).lost == {"r0": [("s1", "worker unknown")]}


def test_idle_sessions_are_expired_by_the_registry():
    reg = EnvRegistry(TIMES)
    reg.observe(env_report("w1", {"busy": 0.0, "idle": 4.0}), now=0.0)
    reg.observe(rollout_report("r0", {"busy": "w1", "idle": "w1"}, idle=4.0), now=0.0)
    assert reg.reconcile(0.9).cancels == {}
    decided = reg.reconcile(1.0)  # 4 s idle at the reports + 1 s = idle_limit
    # both sides' figures age; "busy" is 4 s idle on the rollout but 1 s on the worker
    assert decided.cancels == {"w1": ["idle"]}
    assert decided.lost == {"r0": [("idle", "idle")]}
    assert reg.counts["idle_expired"] == 1


def test_session_reports_must_list_one_entry_per_session():
    bad = SessionReport("w1", "env", 0.0, "db", 1, ["s1", "s2"], [0.0])
    with pytest.raises(MessageError, match=r"session_report\.idle: length 1"):
        encode(bad, run="r")
    ok = SessionsLost("r0", ["s1"], ["worker dead"])
    assert decode(encode(ok, run="r"), expect=SessionsLost).payload == ok


# --- the controller on the in-process broker --------------------------------------------


@pytest.fixture(autouse=True)
def _stop_actors():
    yield
    pykka.ActorRegistry.stop_all()


@pytest.fixture
def setup():
    name = f"reg-{uuid.uuid4().hex[:8]}"
    broker = f"memory://{name}"
    spec = TopologySpec(run=f"r{uuid.uuid4().hex[:6]}", pools=("current",), trajectory_capacity=64)
    client = connect(broker, name="test-client")
    Topology(spec.run).declare(client, list(spec.pools), spec.trajectory_capacity)
    client.declare_queue(f"{spec.run}.env.calculator")
    workers: list[EnvWorker] = []
    yield broker, spec, client, workers
    for w in workers:
        w.close()
    client.close()
    reset_memory_broker(name)


def start_controller(broker, spec, clock, *, batch: int = 2):
    return ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"calculator": TaskEntry(1.0, make_task("calculator").num_instances)},
        group_size=2,
        episodes_per_batch=batch,
        max_staleness=0,
        initial=CheckpointReady(version=0, uri="/none", digest="", created_at=0.0),
        env_times=TIMES,
        reconcile_interval=3600,  # the tests reconcile by hand
        clock=clock,
    ).proxy()


def add_worker(setup, wid, clock, *, env=None, capacity=2):
    broker, spec, _, workers = setup
    worker = EnvWorker(
        env or make_task("calculator"), broker=broker, run=spec.run, task="calculator",
        capacity=capacity, worker_id=wid, heartbeat_interval=0.02, idle_timeout=1e6,
        orphan_timeout=1e6, clock=clock,
    )  # fmt: skip
    workers.append(worker)
    return worker


def _say(name: str, **args) -> ChatMessage:
    return ChatMessage("assistant", "", [ToolCall("c1", name, json.dumps(args))])


def test_the_controller_cancels_an_orphan_session_on_its_worker(setup):
    broker, spec, client, _ = setup
    clock = FakeClock()
    ctl = start_controller(broker, spec, clock)
    worker = add_worker(setup, "w1", clock)
    session = RemoteEnvironment(client, spec.run, "calculator", timeout=5).start(0).session
    wait_for(lambda: ctl.env_workers().get().get("w1", {}).get("sessions") == 1, what="listed")
    assert ctl.reconcile().get() == {"cancels": 0, "lost": 0}  # within the grace period
    clock.now += TIMES.orphan_grace
    assert ctl.reconcile().get() == {"cancels": 1, "lost": 0}  # no rollout claims it
    wait_for(lambda: worker.sessions == 0, what="the worker to drop the orphan")
    status = ctl.status().get()
    assert status["env_sessions/orphans_cancelled"] == 1.0
    assert status["env_worker/calculator/w1/capacity"] == 2.0
    assert session[1] == "w1"


def test_the_controller_expires_an_idle_session_and_tells_its_rollout(setup):
    broker, spec, client, _ = setup
    clock = FakeClock()
    ctl = start_controller(broker, spec, clock)
    worker = add_worker(setup, "w1", clock)
    env = RemoteEnvironment(client, spec.run, "calculator", timeout=5)
    sid, _ = env.start(1, episode="ep-1").session
    notices: list[SessionsLost] = []
    got = threading.Event()
    queue = client.declare_queue("", exclusive=True, dead_letter=False)
    client.bind(queue, Topology(spec.run).control, "lost.r9")
    client.consume(
        queue, lambda d: (notices.append(decode(d.body).payload), d.ack(), got.set()), prefetch=4
    )
    # the controller listens for reports once it lists the worker
    wait_for(lambda: ctl.env_workers().get().get("w1", {}).get("sessions") == 1, what="listed")
    claim = rollout_report("r9", {sid: "w1"})
    control = Topology(spec.run).control
    client.publish(control, "sessions.rollout", encode(claim, run=spec.run)).result(5)
    wait_for(lambda: ctl.status().get().get("env_sessions/claimed") == 1.0, what="the claim")
    clock.now += TIMES.idle_limit  # no interact since: idle on both sides
    # (a worker report built just before the clock moved may arrive after it: poll)
    sent = wait_for(lambda: [n for n in [ctl.reconcile().get()] if n["cancels"]], what="expiry")
    assert sent == [{"cancels": 1, "lost": 1}]
    assert got.wait(10)
    assert (notices[0].session_ids, notices[0].reasons) == ([sid], ["idle"])
    wait_for(lambda: worker.sessions == 0, what="the worker to drop the idle session")
    assert ctl.status().get()["env_sessions/idle_expired"] == 1.0


class Stalling:
    """A calculator whose interact blocks until released: a worker hung mid-episode."""

    def __init__(self) -> None:
        self._env = make_task("calculator")
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.tools = self._env.tools
        self.num_instances = self._env.num_instances

    def start(self, index):
        return self._env.start(index)

    def interact(self, session, message):
        self.entered.release()
        self.release.wait(30)
        return self._env.interact(session, message)

    def cancel(self, session):
        self._env.cancel(session)


def test_a_dead_workers_episodes_are_retried_and_finished_on_another_worker(
    setup, smollm_tokenizer
):
    broker, spec, client, _ = setup
    clock = FakeClock()
    names = Topology(spec.run)
    stalling = Stalling()
    doomed = add_worker(setup, "doomed", clock, env=stalling, capacity=2)
    fmt = ChatFormat(smollm_tokenizer)
    engine = ScriptedEngine(calculator_script(smollm_tokenizer, fmt.end_of_turn_ids[-1], "oracle"))
    SamplerActor.start(
        broker=broker, topology=spec, pool="current", every=1,
        engine_factory=lambda: engine, sampler_id="s0", query_timeout=0.2,
    )  # fmt: skip
    rollout = RolloutActor.start(
        broker=broker, topology=spec, environments={}, remote_tasks=["calculator"],
        chat_format=fmt, pool_weights={"current": 1.0},
        limits=EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=64),
        concurrency=4, rollout_id="r0", heartbeat_interval=0.02, env_timeout=120,
    ).proxy()  # fmt: skip
    ctl = start_controller(broker, spec, clock)  # issues one group of 2
    for _ in range(2):  # both episodes are inside an interact on the doomed worker
        assert stalling.entered.acquire(timeout=20)
    wait_for(
        lambda: (
            ctl.status().get().get("env_sessions/claimed") == 2.0
            and ctl.env_workers().get()["doomed"]["sessions"] == 2
        ),
        what="the registry to see both sessions",
    )
    add_worker(setup, "spare", clock, capacity=4)  # + the doomed worker's 2 redelivered starts
    doomed.close()  # its queue is gone; the two calls in flight will never be answered
    clock.now += TIMES.dead_after
    wait_for(
        lambda: ctl.env_workers().get().get("spare", {}).get("state") == "alive",
        what="a report of the spare worker",
    )
    assert ctl.reconcile().get()["lost"] == 2
    trajs: list[Trajectory] = []
    done = threading.Event()

    def on_traj(d):
        trajs.append(decode(d.body, expect=Trajectory).payload)
        d.ack()
        if len(trajs) == 2:
            done.set()

    client.consume(names.trajectories, on_traj, prefetch=10)
    assert done.wait(20), f"{len(trajs)} of 2 trajectories (the env timeout is 120 s)"
    stalling.release.set()
    assert sorted(t.status for t in trajs) == ["completed", "completed"]
    assert len({t.group_id for t in trajs}) == 1  # the group is whole
    assert all(t.reward == 1.0 for t in trajs)
    stats = wait_for(lambda: [s for s in [rollout.stats().get()] if s["finished"] == 2])[0]
    # each episode: one attempt lost with its worker, one retry (attempt 1 < max_attempts 3)
    assert (stats["started"], stats["infra_retries"], stats["sessions_lost"]) == (4, 2, 2)
    view = ctl.env_workers().get()
    assert view["doomed"]["state"] == "dead"
    assert ctl.status().get()["env_sessions/workers_died"] == 1.0


def test_supervisor_status_prints_the_registry():
    from agentrl.ops.report.status import format_controller

    reg = EnvRegistry(TIMES)
    reg.observe(env_report("w1", {"a": 0.0, "b": 0.0}), now=0.0)
    reg.observe(env_report("w2", {"c": 0.0}), now=-20.0)
    reg.reconcile(1.0)
    text = format_controller({"controller/version": 1.0, **reg.status(1.0)})
    assert "env workers: 1 alive, 0 unresponsive, 1 dead; sessions 2 live" in text
    assert "worker w1 (calculator): alive, 2/4 sessions, last report 1.0 s ago" in text
    assert "worker w2 (calculator): dead, 1/4 sessions" in text
    assert "task " not in text  # registry rows are not mistaken for per-task figures


def test_the_registry_times_come_from_the_run_config():
    from agentrl.ops.config.load import ConfigError, parse_config

    cfg = parse_config({"run": "x", "env_registry": {"dead_after": 50, "idle_limit": 120}})
    assert (cfg.env_registry.dead_after, cfg.env_registry.idle_limit) == (50.0, 120.0)
    assert cfg.env_registry.unresponsive_after == 30.0  # default: 3 heartbeats of 10 s
    with pytest.raises(ConfigError, match="unresponsive_after < dead_after"):
        parse_config({"run": "x", "env_registry": {"unresponsive_after": 200}})

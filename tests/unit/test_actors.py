"""The four actors on the in-process broker, with a scripted engine and a fake learner backend."""

from __future__ import annotations

import json
import threading
import time

import pykka
import pytest

from agentrl.actors import (
    ControllerActor,
    EpisodeLimits,
    LearnerActor,
    RolloutActor,
    SamplerActor,
    TaskEntry,
    TopologySpec,
    batch_metrics,
)
from agentrl.actors._fakes import FakeBackend, ScriptedEngine
from agentrl.actors._metrics import turn_versions
from agentrl.environments import ChatFormat, make_task
from agentrl.messages import (
    CheckpointQuery,
    CheckpointReady,
    EpisodeRequest,
    GenerateRequest,
    GenerateResult,
    MetricsReport,
    Topology,
    Trajectory,
    decode,
    encode,
)
from agentrl.messages._transport import REASON_HEADER
from tests.unit.records import trajectory as make_trajectory
from tests.unit.scripts import calculator_script


def wait_for(predicate, timeout: float = 20.0, what: str = "condition"):
    """Wait on a condition that another thread makes true (polls an Event, no fixed sleeps)."""
    event = threading.Event()
    deadline = timeout
    step = 0.01
    while deadline > 0:
        value = predicate()
        if value:
            return value
        event.wait(step)
        deadline -= step
    raise AssertionError(f"timed out waiting for {what}")


pytestmark = pytest.mark.usefixtures("stop_actors")


def initial(version: int = 0) -> CheckpointReady:
    return CheckpointReady(version=version, uri="/nonexistent", digest="", created_at=0.0)


def start_controller(broker, spec, *, eta: int, group: int = 2, batch: int = 4):
    return ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"a": TaskEntry(weight=1.0, num_instances=5), "b": TaskEntry(3.0, 7)},
        group_size=group,
        episodes_per_batch=batch,
        max_staleness=eta,
        initial=initial(),
    )


# --- controller -------------------------------------------------------------------------


@pytest.mark.parametrize("eta", [0, 2])
def test_controller_admits_up_to_the_staleness_window(broker, spec, client, eta):
    names = Topology(spec.run)
    ctl = start_controller(broker, spec, eta=eta)
    # issued <= (v + eta + 1) * B with v = 0, B = 4
    wait_for(lambda: client.queue_depth(names.episodes) == (eta + 1) * 4, what="first window")
    assert ctl.proxy().stats().get()["issued"] == (eta + 1) * 4
    ckpt = CheckpointReady(version=1, uri="/x", digest="d", created_at=0.0)
    client.publish(names.checkpoints, "", encode(ckpt, run=spec.run)).result(5)
    # v = 1 opens one more batch
    wait_for(lambda: client.queue_depth(names.episodes) == (eta + 2) * 4, what="second window")
    # dropped episodes reported by the learner are replaced
    report = MetricsReport("learner", 1, {"learner/dropped_episodes_total": 2.0})
    client.publish(names.control, "metrics.learner", encode(report, run=spec.run)).result(5)
    wait_for(lambda: client.queue_depth(names.episodes) == (eta + 2) * 4 + 2, what="replacements")


def test_controller_groups_and_task_mix(broker, spec, client):
    names = Topology(spec.run)
    start_controller(broker, spec, eta=1, group=2, batch=4)
    received: list[EpisodeRequest] = []
    done = threading.Event()

    def on_message(d):
        received.append(decode(d.body, expect=EpisodeRequest).payload)
        d.ack()
        if len(received) == 8:
            done.set()

    client.consume(names.episodes, on_message, prefetch=100)
    assert done.wait(10)
    groups: dict[str, list[EpisodeRequest]] = {}
    for r in received:
        groups.setdefault(r.group_id, []).append(r)
    assert len(groups) == 4
    for members in groups.values():
        assert sorted(m.sample_idx for m in members) == [0, 1]  # G = 2 samples of one instance
        assert len({(m.task, m.index) for m in members}) == 1
        assert all(m.issued_version == 0 and m.group_size == 2 for m in members)


def test_controller_answers_checkpoint_queries_and_dead_letters_garbage(broker, spec, client):
    names = Topology(spec.run)
    start_controller(broker, spec, eta=0)
    reply = client.call(
        "", names.control_rpc, encode(CheckpointQuery("t"), run=spec.run), timeout=5
    )
    assert decode(reply.result(6).body, expect=CheckpointReady).payload.version == 0
    client.publish("", names.control_rpc, b"\x93not a message").result(5)
    dead = []
    got = threading.Event()
    client.consume(names.dead, lambda d: (dead.append(d), d.ack(), got.set()), prefetch=10)
    assert got.wait(10)
    assert dead[0].body == b"\x93not a message"
    assert dead[0].headers[REASON_HEADER]  # says why


# --- rollout + sampler --------------------------------------------------------------------


def start_rollout_pair(
    broker, spec, tokenizer, mode, *, version=3, on_episode=None, on_running=None
):
    fmt = ChatFormat(tokenizer)
    engine = ScriptedEngine(
        calculator_script(tokenizer, fmt.end_of_turn_ids[-1], mode), version=version
    )
    SamplerActor.start(
        broker=broker,
        topology=spec,
        pool="current",
        every=1,
        engine_factory=lambda: engine,
        sampler_id="s0",
        query_timeout=0.2,
    )
    RolloutActor.start(
        broker=broker,
        topology=spec,
        environments={"calculator": make_task("calculator")},
        chat_format=fmt,
        pool_weights={"current": 1.0},
        limits=EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=64),
        concurrency=4,
        rollout_id="r0",
        on_episode=on_episode,
        on_running=on_running,
    )
    return fmt, engine


def collect_trajectories(client, names, n):
    out: list[Trajectory] = []
    done = threading.Event()

    def on_message(d):
        out.append(decode(d.body, expect=Trajectory).payload)
        d.ack()
        if len(out) == n:
            done.set()

    client.consume(names.trajectories, on_message, prefetch=100)
    assert done.wait(30), f"got {len(out)} of {n} trajectories"
    return out


def publish_episodes(client, spec, n, task="calculator"):
    names = Topology(spec.run)
    for i in range(n):
        req = EpisodeRequest(f"e{i}", task, i, "g0", i, n, 2)
        client.publish("", names.episodes, encode(req, run=spec.run)).result(5)


@pytest.mark.parametrize(
    ("mode", "status", "reward", "turns"),
    [
        ("oracle", "completed", 1.0, 2),  # calculate, then answer
        ("wrong", "completed", 0.0, 2),
        # the malformed text goes to the calculator, which ends a turn without a call
        ("malformed", "agent_invalid_action", -0.2, 1),  # DESIGN: penalty -0.2
    ],
)
def test_rollout_runs_episodes_end_to_end(
    broker, spec, client, smollm_tokenizer, mode, status, reward, turns
):
    fmt, _ = start_rollout_pair(broker, spec, smollm_tokenizer, mode)
    publish_episodes(client, spec, 3)
    trajs = collect_trajectories(client, Topology(spec.run), 3)
    for t in trajs:
        assert (t.status, t.reward, t.num_turns) == (status, reward, turns)
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) == len(t.versions)
        assert t.pools == ["current"] * turns
        sampled = [tok for tok, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        # every trained token is a sampled one, with its logprob and version
        assert sampled.count(fmt.end_of_turn_ids[-1]) == turns
        assert all(v == 3 for v, m in zip(t.versions, t.loss_mask, strict=True) if m)
        assert all(lp == -1.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
        assert t.loss_mask[0] == 0  # the prompt is not trained on
        assert t.metrics["malformed_turns"] == (1.0 if mode == "malformed" else 0.0)
    (rollout,) = pykka.ActorRegistry.get_by_class(RolloutActor)
    stats = rollout.proxy().stats().get()
    assert (stats["turns"], stats["malformed_turns"]) == (
        3 * turns,
        3 if mode == "malformed" else 0,
    )


def test_rollout_hands_each_published_trajectory_to_on_episode(
    broker, spec, client, smollm_tokenizer
):
    seen: list[Trajectory] = []
    all_seen = threading.Event()

    def on_episode(t: Trajectory) -> None:  # called once the broker has confirmed it
        seen.append(t)
        if len(seen) == 3:
            all_seen.set()

    start_rollout_pair(broker, spec, smollm_tokenizer, "oracle", on_episode=on_episode)
    publish_episodes(client, spec, 3)
    published = collect_trajectories(client, Topology(spec.run), 3)
    assert all_seen.wait(10)
    assert sorted(t.episode_id for t in seen) == sorted(t.episode_id for t in published)


def test_rollout_reports_each_episode_in_flight_until_its_trajectory_is_published(
    broker, spec, client, smollm_tokenizer
):
    changes: list[int] = []
    lock = threading.Lock()
    in_flight_at_finish: list[int] = []

    def on_running(change: int) -> None:
        with lock:
            changes.append(change)

    def on_episode(t: Trajectory) -> None:  # the episode is still in flight here
        with lock:
            in_flight_at_finish.append(sum(changes))

    start_rollout_pair(
        broker, spec, smollm_tokenizer, "oracle", on_episode=on_episode, on_running=on_running
    )
    publish_episodes(client, spec, 3)
    collect_trajectories(client, Topology(spec.run), 3)
    wait_for(lambda: len(changes) == 6, what="3 episodes in and out of flight")
    assert sorted(changes) == [-1, -1, -1, 1, 1, 1] and sum(changes) == 0
    assert len(in_flight_at_finish) == 3 and min(in_flight_at_finish) >= 1


def test_cross_policy_turns_record_the_pool_and_version_that_sampled_them(
    broker, spec, client, smollm_tokenizer
):
    fmt = ChatFormat(smollm_tokenizer)
    topology = TopologySpec(spec.run, ("current", "stale"), 64)
    engines = {"current": 5, "stale": 4}
    for pool, version in engines.items():
        engine = ScriptedEngine(
            calculator_script(smollm_tokenizer, fmt.end_of_turn_ids[-1], "oracle"),
            version=version,
        )
        SamplerActor.start(
            broker=broker,
            topology=topology,
            pool=pool,
            every=1,
            engine_factory=lambda e=engine: e,
            sampler_id=f"s-{pool}",
            query_timeout=0.2,
        )
    RolloutActor.start(
        broker=broker,
        topology=topology,
        environments={"calculator": make_task("calculator")},
        chat_format=fmt,
        pool_weights={"current": 0.5, "stale": 0.5},
        limits=EpisodeLimits(max_turns=4, max_tokens=2048, max_new_tokens=64),
        concurrency=4,
        rollout_id="r0",
    )
    publish_episodes(client, spec, 8)
    trajs = collect_trajectories(client, Topology(spec.run), 8)
    turns = [turn for t in trajs for turn in turn_versions(t)]
    assert len(turns) == 16  # oracle: calculate, then answer
    assert {pool for pool, _ in turns} == {"current", "stale"}
    assert all(version == engines[pool] for pool, version in turns)
    metrics = batch_metrics(trajs, version=6, wall=1.0)
    assert metrics["staleness/turn_lag/current"] == 0.0
    assert metrics["staleness/turn_lag/stale"] == 1.0


def test_rollout_dead_letters_a_malformed_episode_request(broker, spec, client, smollm_tokenizer):
    names = Topology(spec.run)
    start_rollout_pair(broker, spec, smollm_tokenizer, "oracle")
    client.publish("", names.episodes, b"garbage").result(5)
    req = EpisodeRequest("e1", "no-such-task", 0, "g", 0, 2, 0)
    client.publish("", names.episodes, encode(req, run=spec.run)).result(5)
    dead = []
    got = threading.Event()
    client.consume(
        names.dead, lambda d: (dead.append(d), d.ack(), len(dead) == 2 and got.set()), prefetch=10
    )
    assert got.wait(10)
    reasons = sorted(d.headers[REASON_HEADER] for d in dead)
    assert any("no environment for task 'no-such-task'" in r for r in reasons), reasons


def test_sampler_loads_announced_checkpoints_and_answers_late_queries(
    broker, spec, client, tmp_path
):
    names = Topology(spec.run)
    backend = FakeBackend()
    engines, refs = {}, []
    for pool, every in (("current", 1), ("stale", 2)):
        engines[pool] = ScriptedEngine(lambda p, v: [7], version=0)
        refs.append(
            SamplerActor.start(
                broker=broker,
                topology=TopologySpec(spec.run, ("current", "stale"), 64),
                pool=pool,
                every=every,
                engine_factory=lambda e=engines[pool]: e,
                sampler_id=f"s-{pool}",
                query_timeout=0.2,
            )
        )
    for ref in refs:
        ref.proxy().stats().get()  # answered after on_start: the checkpoint queue is bound
    for v in (1, 2, 3):
        path = tmp_path / f"v{v}"
        digest = backend.save(path)
        ready = CheckpointReady(version=v, uri=str(path), digest=digest, created_at=0.0)
        client.publish(names.checkpoints, "", encode(ready, run=spec.run)).result(5)
    wait_for(lambda: engines["current"].version == 3, what="current pool at v3")
    wait_for(lambda: engines["stale"].version == 2, what="stale pool at v2")
    assert [v for _, v in engines["current"].loads] == [1, 2, 3]
    assert [v for _, v in engines["stale"].loads] == [2]  # every 2nd version only


def test_samplers_report_the_version_they_serve_to_the_controller(broker, spec, client, tmp_path):
    names = Topology(spec.run)
    topology = TopologySpec(spec.run, ("current", "stale"), 64)
    controller = ControllerActor.start(
        broker=broker,
        topology=topology,
        tasks={"calculator": TaskEntry(1.0, 10)},
        group_size=2,
        episodes_per_batch=4,
        max_staleness=0,
        initial=initial(),
    ).proxy()
    controller.stats().get()
    beats = []
    client.bind(client.declare_queue("beats"), names.control, "heartbeat.#")
    client.consume("beats", lambda d: (beats.append(decode(d.body).payload), d.ack()), prefetch=64)
    backend = FakeBackend()
    for pool, every, n in (("current", 1, 2), ("stale", 2, 1)):
        for i in range(n):
            SamplerActor.start(
                broker=broker,
                topology=topology,
                pool=pool,
                every=every,
                engine_factory=lambda: ScriptedEngine(lambda p, v: [7]),
                sampler_id=f"{pool}-{i}",
                query_timeout=0.2,
                heartbeat_interval=0.2,
                node="node-a",
            ).proxy().stats().get()
    wait_for(lambda: len(controller.samplers().get()) == 3, what="three samplers known")
    assert controller.pool_versions().get() == {"current": [0, 0], "stale": [0]}
    for v in (1, 2, 3):
        digest = backend.save(tmp_path / f"v{v}")
        ready = CheckpointReady(v, str(tmp_path / f"v{v}"), digest, time.time())
        client.publish(names.checkpoints, "", encode(ready, run=spec.run)).result(5)
    want = {"current": [3, 3], "stale": [2]}
    wait_for(lambda: controller.pool_versions().get() == want, what=f"versions {want}")
    table = controller.samplers().get()
    assert table["stale-0"]["pool"] == "stale" and table["stale-0"]["node"] == "node-a"
    loaded = [b for b in beats if b.labels.get("event") == "loaded"]
    assert sorted((b.actor_id, int(b.state["version"])) for b in loaded) == [
        ("current-0", 1), ("current-0", 2), ("current-0", 3),
        ("current-1", 1), ("current-1", 2), ("current-1", 3),
        ("stale-0", 2),
    ]  # fmt: skip
    assert all(0 <= b.state["since_announce"] < 10 for b in loaded)
    wait_for(lambda: any(b.labels["event"] == "alive" for b in beats), what="periodic beats")


# --- learner -------------------------------------------------------------------------------


def trajectory(
    group: str, i: int, *, reward: float, issued: int = 0, task="calculator", infra=False
):
    mask = [] if infra else [0, 0, 1, 1, 1, 0]
    return make_trajectory(
        mask,
        group=group,
        reward=reward,
        version=issued,
        episode_id=f"{group}-{i}",
        task=task,
        sample_idx=i,
        issued_version=issued,
        env_reward=max(reward, 0.0),
        timings={"episode": 1.0},
        metrics={"infra_failure": 1.0} if infra else {},
    )


def start_learner(broker, spec, tmp_path, backend, *, groups_per_batch=1, hard=8, max_steps=None):
    done = threading.Event()
    metrics: list[dict] = []
    ref = LearnerActor.start(
        broker=broker,
        topology=spec,
        backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt",
        start_version=0,
        group_size=2,
        groups_per_batch=groups_per_batch,
        hard_staleness=hard,
        prefetch=64,
        pad_id=0,
        max_steps=max_steps,
        on_metrics=metrics.append,
        done=done,
    )
    return ref, done, metrics


def publish_trajs(client, spec, trajs):
    names = Topology(spec.run)
    for t in trajs:
        client.publish("", names.trajectories, encode(t, run=spec.run)).result(5)


def test_learner_trains_whole_groups_checkpoints_and_announces(broker, spec, client, tmp_path):
    names = Topology(spec.run)
    announced = []
    q = client.declare_queue("", exclusive=True, dead_letter=False)
    client.bind(q, names.checkpoints)
    client.consume(q, lambda d: (announced.append(decode(d.body).payload), d.ack()), prefetch=10)
    backend = FakeBackend()
    _ref, done, metrics = start_learner(broker, spec, tmp_path, backend, max_steps=2)
    publish_trajs(client, spec, [trajectory("g1", 0, reward=1.0)])  # incomplete group: no step
    publish_trajs(client, spec, [trajectory("g2", 0, reward=0.0), trajectory("g2", 1, reward=1.0)])
    wait_for(lambda: backend.steps == 1, what="first update")
    publish_trajs(client, spec, [trajectory("g1", 1, reward=0.0)])
    assert done.wait(20)
    assert [a.version for a in wait_for(lambda: len(announced) == 2 and announced)] == [1, 2]
    assert (tmp_path / "ckpt" / "v000002" / "DIGEST").exists()
    assert [m["version"] for m in metrics] == [1.0, 2.0]
    assert metrics[0]["env/calculator/reward"] == 0.5  # mean of 0.0 and 1.0
    wait_for(lambda: client.queue_depth(names.trajectories) == 0, what="queue drained")


def test_learner_acks_only_after_the_checkpoint(broker, spec, client, tmp_path):
    """A learner that dies mid-update leaves the batch's trajectories to be redelivered."""
    names = Topology(spec.run)

    class Exploding(FakeBackend):
        def step(self, batch):
            raise RuntimeError("boom")

    ref, _, _ = start_learner(broker, spec, tmp_path, Exploding())
    publish_trajs(client, spec, [trajectory("g", 0, reward=0.0), trajectory("g", 1, reward=1.0)])
    wait_for(lambda: not ref.is_alive(), what="learner crash")
    wait_for(lambda: client.queue_depth(names.trajectories) == 2, what="redelivery")
    assert not (tmp_path / "ckpt" / "v000001").exists()


def test_a_learner_resumed_after_its_checkpoint_skips_the_unacked_replay(
    broker, spec, client, tmp_path, monkeypatch
):
    """Dies after checkpoint 1 is complete (committed) but before the announcement and the
    acks: the restarted learner (at version 1) acks the redelivered group without training
    it again; the next groups train."""
    from agentrl.actors import _learner

    names = Topology(spec.run)
    real = _learner.broadcast

    def broadcast(transport, exchange, key, body):
        if exchange == names.checkpoints:
            raise RuntimeError("killed after the checkpoint, before the acks")
        return real(transport, exchange, key, body)

    monkeypatch.setattr(_learner, "broadcast", broadcast)
    ref, _, _ = start_learner(broker, spec, tmp_path, FakeBackend())
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.0), trajectory("g1", 1, reward=1.0)])
    wait_for(lambda: not ref.is_alive(), what="learner death")
    wait_for(lambda: client.queue_depth(names.trajectories) == 2, what="g1 back on the queue")
    assert (tmp_path / "ckpt" / "v000001" / "DIGEST").exists()
    monkeypatch.setattr(_learner, "broadcast", real)

    backend = FakeBackend()
    done = threading.Event()
    metrics: list[dict] = []
    LearnerActor.start(
        broker=broker,
        topology=spec,
        backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt",
        start_version=1,
        group_size=2,
        groups_per_batch=1,
        hard_staleness=8,
        prefetch=64,
        pad_id=0,
        max_steps=2,
        on_metrics=metrics.append,
        done=done,
    )  # fmt: skip  (max_steps counts the run's updates: v1 was the first of two)
    publish_trajs(client, spec, [trajectory("g2", 0, reward=0.0), trajectory("g2", 1, reward=1.0)])
    assert done.wait(20)
    assert backend.steps == 1 and backend.batches[0].num_rows == 2  # g2 only
    assert metrics[0]["version"] == 2.0 and metrics[0]["learner/replays_skipped_total"] == 2.0
    wait_for(lambda: client.queue_depth(names.trajectories) == 0, what="g1 acked")
    journal = (tmp_path / "ckpt" / "trained.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in journal] == [
        {"version": 1, "groups": ["g1"], "episodes": ["g1-0", "g1-1"]},
        {"version": 2, "groups": ["g2"], "episodes": ["g2-0", "g2-1"]},
    ]


def test_a_learner_resumed_before_its_checkpoint_trains_the_batch_again(
    broker, spec, client, tmp_path
):
    """Journal written for version 1 but the checkpoint never completed: the learner
    restarts at version 0 and g1 is trained (once) into version 1."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "trained.jsonl").write_text('{"version": 1, "groups": ["g1"]}\n{"vers')
    backend = FakeBackend()
    _, done, metrics = start_learner(broker, spec, tmp_path, backend, max_steps=1)
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.0), trajectory("g1", 1, reward=1.0)])
    assert done.wait(20)
    assert backend.batches[0].num_rows == 2 and metrics[0]["learner/replays_skipped_total"] == 0


def _learner_at(broker, spec, tmp_path, backend, *, version, first, max_steps):
    done = threading.Event()
    metrics: list[dict] = []
    ref = LearnerActor.start(
        broker=broker, topology=spec, backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt", start_version=version, group_size=2,
        groups_per_batch=1, hard_staleness=8, prefetch=64, pad_id=0, max_steps=max_steps,
        on_metrics=metrics.append, done=done, first_version=first,
    )  # fmt: skip
    return ref, done, metrics


def test_max_steps_counts_the_runs_updates_not_this_processs(broker, spec, client, tmp_path):
    """Restarted at v4 of max_steps 4, the learner has nothing left: it stops at once and
    trains nothing; restarted at v3 it trains one update and stops at v4."""
    idle = FakeBackend()
    ref, done, _ = _learner_at(broker, spec, tmp_path, idle, version=4, first=0, max_steps=4)
    assert done.wait(10)
    ref.stop()
    backend = FakeBackend()
    ref, done, metrics = _learner_at(
        broker, spec, tmp_path / "b", backend, version=3, first=0, max_steps=4
    )
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.0), trajectory("g1", 1, reward=1.0)])
    assert done.wait(20)
    ref.stop()
    assert idle.steps == 0 and backend.steps == 1 and metrics[-1]["version"] == 4.0


def test_max_steps_counts_from_the_warm_start(broker, spec, client, tmp_path):
    """A run warm-started to v8 with max_steps 1 trains one RL update (v9)."""
    backend = FakeBackend()
    ref, done, metrics = _learner_at(
        broker, spec, tmp_path, backend, version=8, first=8, max_steps=1
    )
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.0), trajectory("g1", 1, reward=1.0)])
    assert done.wait(20)
    ref.stop()
    assert backend.steps == 1 and metrics[-1]["version"] == 9.0


def test_a_second_copy_of_a_trained_episode_is_not_trained_again(broker, spec, client, tmp_path):
    """A rollout that died after publishing its trajectory, before acking the episode:
    the episode is played again and its second copy arrives after the first was trained;
    a learner restarted afterwards knows it from the journal too."""
    backend = FakeBackend()
    _, done, metrics = start_learner(broker, spec, tmp_path, backend, max_steps=2)
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.0), trajectory("g1", 1, reward=1.0)])
    wait_for(lambda: backend.steps == 1, what="g1 trained")
    publish_trajs(client, spec, [trajectory("g1", 1, reward=0.5)])  # the replayed copy
    publish_trajs(client, spec, [trajectory("g2", 0, reward=0.0), trajectory("g2", 1, reward=1.0)])
    assert done.wait(20)
    assert [b.num_rows for b in backend.batches] == [2, 2]  # g1, then g2: no copy trained
    assert metrics[-1]["learner/duplicates_skipped_total"] == 1.0
    pykka.ActorRegistry.stop_all()
    again = FakeBackend()  # restarted at v2: the copy of g1-0 comes once more
    done, later = threading.Event(), []
    LearnerActor.start(
        broker=broker, topology=spec, backend_factory=lambda: again,
        checkpoint_dir=tmp_path / "ckpt", start_version=2, group_size=2, groups_per_batch=1,
        hard_staleness=8, prefetch=64, pad_id=0, max_steps=3, done=done,
        on_metrics=later.append,
    )  # fmt: skip
    publish_trajs(client, spec, [trajectory("g1", 0, reward=0.5)])
    publish_trajs(client, spec, [trajectory("g3", 0, reward=0.0), trajectory("g3", 1, reward=1.0)])
    assert done.wait(20)
    assert [b.num_rows for b in again.batches] == [2]
    assert later[-1]["learner/duplicates_skipped_total"] == 1.0  # known from the journal


def test_learner_drops_groups_without_two_survivors(broker, spec, client, tmp_path):
    backend = FakeBackend()
    _, done, metrics = start_learner(broker, spec, tmp_path, backend, max_steps=1)
    publish_trajs(
        client,
        spec,
        [trajectory("bad", 0, reward=0.0), trajectory("bad", 1, reward=-0.2, infra=True)],
    )
    publish_trajs(client, spec, [trajectory("ok", 0, reward=0.0), trajectory("ok", 1, reward=1.0)])
    assert done.wait(20)
    assert metrics[0]["learner/dropped_groups_total"] == 1.0
    assert backend.batches[0].num_rows == 2  # only the good group was trained


def test_learner_dead_letters_malformed_trajectories(broker, spec, client, tmp_path):
    names = Topology(spec.run)
    start_learner(broker, spec, tmp_path, FakeBackend())
    bad = encode(trajectory("g", 0, reward=1.0), run=spec.run).replace(b"trajectory", b"trajectorz")
    client.publish("", names.trajectories, bad).result(5)
    got = threading.Event()
    dead = []
    client.consume(names.dead, lambda d: (dead.append(d), d.ack(), got.set()), prefetch=10)
    assert got.wait(10)
    assert "unknown" in dead[0].headers[REASON_HEADER]


def test_controller_resuming_at_version_v_issues_one_window_not_v(broker, spec, client):
    names = Topology(spec.run)
    ctl = ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"a": TaskEntry(1.0, 5)},
        group_size=2,
        episodes_per_batch=4,
        max_staleness=1,
        initial=initial(version=3),
    )
    # issued starts at v * B = 12; the window allows (3 + 1 + 1) * 4 = 20: 8 new episodes
    wait_for(lambda: client.queue_depth(names.episodes) == 8, what="one window")
    assert ctl.proxy().stats().get()["issued"] == 20  # admission is done inside on_start


def test_sampler_drops_a_request_whose_requester_is_gone(broker, spec, client):
    """A request left behind by a dead process must not bounce between samplers forever."""
    names = Topology(spec.run)
    engine = ScriptedEngine(lambda p, v: [5, 6])
    ref = SamplerActor.start(
        broker=broker,
        topology=spec,
        pool="current",
        every=1,
        engine_factory=lambda: engine,
        sampler_id="s0",
        query_timeout=0.2,
    )
    req = GenerateRequest("r1", "e1", [1, 2, 3], 4, 1.0, 1.0, [6])
    body = encode(req, run=spec.run)
    client.publish(
        names.generate, "current", body, reply_to=f"{spec.run}.gone", correlation_id="c1"
    ).result(5)
    for _ in range(2):
        reply = client.call(names.generate, "current", body, timeout=10).result(11)
        assert decode(reply.body, expect=GenerateResult).payload.token_ids == [5, 6]
    # the orphan was served once and dropped, not requeued round and round
    wait_for(lambda: ref.proxy().stats().get()["served"] >= 3, what="three served")
    assert ref.proxy().stats().get()["served"] == 3
    assert client.queue_depth(names.generate_queue("current")) == 0


def test_sampler_rejects_a_checkpoint_that_fails_its_digest_and_keeps_serving(
    broker, spec, client, tmp_path
):
    names = Topology(spec.run)
    engine = ScriptedEngine(lambda p, v: [7])
    ref = SamplerActor.start(
        broker=broker,
        topology=spec,
        pool="current",
        every=1,
        engine_factory=lambda: engine,
        sampler_id="s0",
        query_timeout=0.2,
    )
    ref.proxy().stats().get()
    backend = FakeBackend()
    good = backend.save(tmp_path / "v1")
    for ready in (
        CheckpointReady(1, str(tmp_path / "v1"), "0" * 64, 0.0),  # corrupted in transit
        CheckpointReady(2, str(tmp_path / "missing"), "", 0.0),  # never written
        CheckpointReady(3, str(tmp_path / "v1"), good, 0.0),
    ):
        client.publish(names.checkpoints, "", encode(ready, run=spec.run)).result(5)
    wait_for(lambda: engine.version == 3, what="the good checkpoint loaded")
    assert [v for _, v in engine.loads] == [3]
    assert ref.is_alive()


def test_rollout_idle_ratio_integrates_busy_episode_slots(monkeypatch, smollm_tokenizer):
    import agentrl.actors._rollout as rollout_module

    clock = [100.0]
    monkeypatch.setattr(rollout_module.time, "monotonic", lambda: clock[0])
    actor = RolloutActor(
        broker="memory://unused",
        topology=TopologySpec("r", ("current",), 8),
        environments={},
        chat_format=ChatFormat(smollm_tokenizer),
        pool_weights={"current": 1.0},
        limits=EpisodeLimits(),
        concurrency=4,
        rollout_id="r0",
    )
    clock[0] = 110.0
    assert actor.idle_ratio() == 1.0  # 10 s, nothing running
    actor._slots(+1)  # one of four slots busy for 10 s, then two for 10 s
    clock[0] = 120.0
    actor._slots(+1)
    clock[0] = 130.0
    assert actor.idle_ratio() == pytest.approx(1 - (10 + 20) / (4 * 20))
    actor._slots(-1)
    actor._slots(-1)
    clock[0] = 140.0
    assert actor.idle_ratio() == 1.0

"""The learner's group buffer: stale and timed-out incomplete groups are dropped whole, and
with dynamic sampling (`drop_flat_groups`) so are complete groups without reward spread."""

from __future__ import annotations

import threading

import pykka
import pytest

from agentrl.actors import ControllerActor, LearnerActor, TaskEntry
from agentrl.actors._fakes import FakeBackend
from agentrl.messages import Topology, decode
from tests.unit.test_actors import initial, publish_trajs, trajectory, wait_for

pytestmark = pytest.mark.usefixtures("stop_actors")  # broker, spec, client: conftest


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def start(broker, spec, tmp_path, *, clock, start_version=0, max_steps=None, **options):
    backend, done = FakeBackend(), threading.Event()
    ref = LearnerActor.start(
        broker=broker,
        topology=spec,
        backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt",
        start_version=start_version,
        group_size=2,
        groups_per_batch=1,
        hard_staleness=2,
        prefetch=64,
        pad_id=0,
        max_steps=max_steps,
        done=done,
        group_timeout=600.0,
        sweep_interval=3600.0,  # the test sweeps by hand
        clock=clock,
        **options,
    )
    return ref, backend, done


def learner_reports(client, spec):
    names = Topology(spec.run)
    reports: list[dict] = []
    q = client.declare_queue("", exclusive=True, dead_letter=False)
    client.bind(q, names.control, "metrics.learner")
    client.consume(
        q, lambda d: (reports.append(decode(d.body).payload.values), d.ack()), prefetch=10
    )
    return reports


def test_an_incomplete_group_is_dropped_whole_after_the_timeout_and_acked_at_once(
    broker,
    spec,
    client,
    tmp_path,
):
    clock = Clock()
    reports = learner_reports(client, spec)
    ref, _, _ = start(broker, spec, tmp_path, clock=clock)
    publish_trajs(client, spec, [trajectory("lost", 0, reward=1.0)])  # its mate never comes
    wait_for(lambda: ref.proxy().buffered().get() == 1, what="buffered")
    clock.now += 600.0
    assert ref.proxy().sweep().get() == 0  # not *longer* than the timeout yet
    clock.now += 1.0
    assert ref.proxy().sweep().get() == 1
    # counted whole: the controller replaces both episodes
    last = wait_for(lambda: reports and reports[-1], what="drop report")
    assert last["learner/dropped_episodes_total"] == 2.0
    assert last["learner/groups_dropped_total/timeout"] == 1.0
    assert last["learner/groups_dropped_total/stale"] == 0.0
    # acked at once, not with a checkpoint: a learner stopped now hands nothing back
    ref.stop()
    assert client.queue_depth(Topology(spec.run).trajectories) == 0


def test_a_late_member_of_a_dropped_group_is_acked_and_not_counted_again(
    broker,
    spec,
    client,
    tmp_path,
):
    clock = Clock()
    reports = learner_reports(client, spec)
    ref, backend, done = start(broker, spec, tmp_path, clock=clock, max_steps=1)
    publish_trajs(client, spec, [trajectory("lost", 0, reward=1.0)])
    wait_for(lambda: ref.proxy().buffered().get() == 1, what="buffered")
    clock.now += 601.0
    ref.proxy().sweep().get()
    publish_trajs(client, spec, [trajectory("lost", 1, reward=0.0)])  # too late
    publish_trajs(client, spec, [trajectory("ok", 0, reward=0.0), trajectory("ok", 1, reward=1.0)])
    assert done.wait(20)
    assert backend.batches[0].num_rows == 2  # "ok" alone: the late member buffered nothing
    last = wait_for(lambda: reports and "version" in reports[-1] and reports[-1], what="update")
    assert last["learner/dropped_episodes_total"] == 2.0
    assert last["learner/groups_dropped_total/timeout"] == 1.0


def test_an_incomplete_group_past_the_hard_bound_is_dropped_on_arrival(
    broker,
    spec,
    client,
    tmp_path,
):
    reports = learner_reports(client, spec)
    start(broker, spec, tmp_path, clock=Clock(), start_version=5)
    # v = 5, hard = 2: issued at 2 is 3 versions old
    publish_trajs(client, spec, [trajectory("old", 0, reward=1.0, issued=2)])
    last = wait_for(lambda: reports and reports[-1], what="drop report")
    assert last["learner/groups_dropped_total/stale"] == 1.0
    assert last["learner/dropped_episodes_total"] == 2.0


def controller_with_one_group(broker, spec):
    """A controller of one group (2 episodes) per update at eta = 0, its first group issued:
    what it issues next is the replacement of a dropped group."""
    ctl = ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"calculator": TaskEntry(weight=1.0, num_instances=5)},
        group_size=2,
        episodes_per_batch=2,
        max_staleness=0,
        initial=initial(),
    )
    wait_for(lambda: ctl.proxy().stats().get()["issued"] == 2, what="first window")
    return ctl


def test_the_controller_replaces_a_dropped_incomplete_group(
    broker,
    spec,
    client,
    tmp_path,
):
    """issued <= (v + eta + 1) * B + dropped: the learner's count frees the window."""
    clock = Clock()
    ctl = controller_with_one_group(broker, spec)
    ref, _, _ = start(broker, spec, tmp_path, clock=clock)
    publish_trajs(client, spec, [trajectory("lost", 0, reward=1.0)])
    wait_for(lambda: ref.proxy().buffered().get() == 1, what="buffered")
    clock.now += 601.0
    ref.proxy().sweep().get()
    wait_for(lambda: ctl.proxy().stats().get()["issued"] == 4, what="a replacement group")
    assert ctl.proxy().stats().get()["dropped"] == 2


@pytest.mark.parametrize("drop_flat", [True, False])
def test_dynamic_sampling_drops_a_flat_group_and_trains_the_next_with_spread(
    broker, spec, client, tmp_path, drop_flat
):
    """Group "flat" (1.0, 1.0) arrives before "mixed" (0.0, 1.0), one group per update.
    Dropping flat groups: the update trains "mixed", "flat" is dropped (`no_spread`, both
    episodes counted for the controller to replace) and reported per task as one flat
    group, all-success. Without it, the update trains "flat" (advantage 0)."""
    reports = learner_reports(client, spec)
    _, backend, done = start(
        broker, spec, tmp_path, clock=Clock(), max_steps=1, drop_flat_groups=drop_flat
    )
    publish_trajs(
        client, spec, [trajectory("flat", 0, reward=1.0), trajectory("flat", 1, reward=1.0)]
    )
    wait_for(lambda: drop_flat or done.is_set(), what="the flat group trained")
    publish_trajs(
        client, spec, [trajectory("mixed", 0, reward=0.0), trajectory("mixed", 1, reward=1.0)]
    )
    assert done.wait(20)
    assert backend.batches[0].rewards.tolist() == ([0.0, 1.0] if drop_flat else [1.0, 1.0])
    last = wait_for(lambda: reports and "version" in reports[-1] and reports[-1], what="update")
    assert last["learner/groups_dropped_total/no_spread"] == (1.0 if drop_flat else 0.0)
    assert last["learner/dropped_episodes_total"] == (2.0 if drop_flat else 0.0)
    if drop_flat:
        assert last["env/calculator/flat_groups_dropped"] == 1.0
        assert last["env/calculator/flat_groups_succeeded"] == 1.0
        assert last["rollout/groups_with_spread"] == 1.0
    else:
        assert "env/calculator/flat_groups_dropped" not in last
        assert last["rollout/groups_with_spread"] == 0.0


@pytest.mark.parametrize("drop_flat", [True, False])
def test_the_supervisor_gives_the_learner_the_configured_drop_flat_groups(tmp_path, drop_flat):
    from types import SimpleNamespace

    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, "memory://drop-flat", "drop-flat")
    raw["learner"]["drop_flat_groups"] = drop_flat
    supervisor = Supervisor(parse_config(raw), roles=("learner",))
    args = supervisor._learner_args(None, tmp_path, 0, SimpleNamespace(pad_token_id=0))
    assert args["drop_flat_groups"] is drop_flat


def test_dynamic_sampling_says_when_no_group_has_spread(broker, spec, client, tmp_path, capfd):
    """4 * groups_per_batch (= 4) flat groups in a row, no update: a warning names them."""
    reports = learner_reports(client, spec)
    start(broker, spec, tmp_path, clock=Clock(), drop_flat_groups=True)
    for g in range(4):
        publish_trajs(client, spec, [trajectory(f"f{g}", i, reward=-0.2) for i in range(2)])
    wait_for(
        lambda: reports and reports[-1].get("learner/groups_dropped_total/no_spread") == 4.0,
        what="four flat drops",
    )
    # the warning is logged before the fourth drop's report goes out
    err = capfd.readouterr()
    assert "nothing to train on" in err.out + err.err


class GatedBackend(FakeBackend):
    """A FakeBackend whose step waits for the test to open the gate (an update that runs
    for as long as the test needs); ``fail`` makes the step raise instead."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.entered, self.gate, self.fail = threading.Event(), threading.Event(), fail

    def step(self, batch):
        self.entered.set()
        assert self.gate.wait(20), "the test never opened the gate"
        if self.fail:
            raise RuntimeError("the step broke")
        return super().step(batch)


def start_gated(broker, spec, tmp_path, backend, **options):
    done = threading.Event()
    ref = LearnerActor.start(
        broker=broker, topology=spec, backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt", start_version=0, group_size=2, groups_per_batch=1,
        hard_staleness=2, prefetch=64, pad_id=0, done=done, drop_flat_groups=True, **options,
    )  # fmt: skip
    return ref, done


def test_flat_groups_are_dropped_and_replaced_while_an_update_runs(broker, spec, client, tmp_path):
    """The update's computation runs off the actor's thread: a flat group that completes
    during a (long) update is dropped at once and the controller issues its replacement
    before the update ends. Before, it waited for the update, and so did the samplers."""
    ctl = controller_with_one_group(broker, spec)
    backend = GatedBackend()
    ref, done = start_gated(broker, spec, tmp_path, backend, max_steps=1)
    publish_trajs(
        client, spec, [trajectory("mixed", 0, reward=0.0), trajectory("mixed", 1, reward=1.0)]
    )
    assert backend.entered.wait(20)  # the update is running, and stays so
    publish_trajs(
        client, spec, [trajectory("flat", 0, reward=1.0), trajectory("flat", 1, reward=1.0)]
    )
    wait_for(lambda: ctl.proxy().stats().get()["issued"] == 4, what="a replacement, mid-update")
    assert ctl.proxy().stats().get()["dropped"] == 2
    assert ref.proxy().version().get() == 0 and not done.is_set()  # the update is still running
    assert ref.proxy().buffered().get() == 0
    backend.gate.set()
    assert done.wait(20)
    assert ref.proxy().version().get() == 1
    assert backend.batches[0].rewards.tolist() == [0.0, 1.0]


def test_a_stop_waits_for_the_update_in_flight_and_commits_it(broker, spec, client, tmp_path):
    backend = GatedBackend()
    ref, _ = start_gated(broker, spec, tmp_path, backend)
    publish_trajs(client, spec, [trajectory("g", 0, reward=0.0), trajectory("g", 1, reward=1.0)])
    assert backend.entered.wait(20)
    stopping = ref.stop(block=False)
    with pytest.raises(pykka.Timeout):  # held by the update
        stopping.get(timeout=0.3)
    backend.gate.set()
    stopping.get(timeout=20)
    assert (tmp_path / "ckpt" / "v000001" / "DIGEST").exists()
    assert backend.steps == 1


def test_a_stopping_learner_takes_no_deliveries_while_it_waits_for_its_update(
    broker, spec, client, tmp_path, monkeypatch
):
    """A stopping actor takes no messages: a trajectory delivered to it goes back to the
    queue and comes straight back. Its consumer is cancelled before it waits, so a late
    trajectory stays in the queue (before: delivered over and over, thousands of times a
    second, starving the update the stop waited for)."""
    from agentrl.actors import _learner as learner_module

    deliveries = []
    real = learner_module.forward_to

    def counting(ref, kind):
        forward = real(ref, kind)
        return lambda delivery: (deliveries.append(delivery), forward(delivery))

    monkeypatch.setattr(learner_module, "forward_to", counting)
    backend = GatedBackend()
    ref, _ = start_gated(broker, spec, tmp_path, backend)
    publish_trajs(client, spec, [trajectory("g", 0, reward=0.0), trajectory("g", 1, reward=1.0)])
    assert backend.entered.wait(20)
    stopping = ref.stop(block=False)
    with pytest.raises(pykka.Timeout):  # in on_stop, waiting for the update
        stopping.get(timeout=0.3)
    before = len(deliveries)
    publish_trajs(client, spec, [trajectory("late", 0, reward=0.0)])
    with pytest.raises(pykka.Timeout):
        stopping.get(timeout=0.5)
    assert len(deliveries) == before
    assert client.queue_depth(Topology(spec.run).trajectories) == 1
    backend.gate.set()
    stopping.get(timeout=20)
    assert (tmp_path / "ckpt" / "v000001" / "DIGEST").exists()


def test_a_step_that_raises_fails_the_learner_and_commits_nothing(broker, spec, client, tmp_path):
    backend = GatedBackend(fail=True)
    ref, _ = start_gated(broker, spec, tmp_path, backend)
    publish_trajs(client, spec, [trajectory("g", 0, reward=0.0), trajectory("g", 1, reward=1.0)])
    assert backend.entered.wait(20)
    backend.gate.set()
    wait_for(lambda: not ref.is_alive(), what="the learner's failure")
    assert not (tmp_path / "ckpt" / "v000001").exists()
    assert backend.steps == 0

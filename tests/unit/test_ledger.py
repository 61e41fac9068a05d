"""The episode ledger: folding its files, the controller restored from it (no replay of the
task order, no over-issue), the learner's drops continued from it, a whole run accounted."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from agentrl.actors import ControllerActor, LearnerActor, TaskEntry
from agentrl.actors._fakes import FakeBackend
from agentrl.actors._ledger import DROPPED_FILE, ISSUED_FILE, LEDGER_DIR, read_ledger
from agentrl.actors._mix import TaskMixer
from agentrl.messages import (
    CheckpointReady,
    EpisodeRequest,
    MetricsReport,
    Topology,
    decode,
    encode,
)
from agentrl.ops.cli.agentrl_supervisor import main
from tests.unit.test_actors import trajectory, wait_for

pytestmark = pytest.mark.usefixtures("stop_actors")


def _lines(path: Path, entries: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


def test_the_ledger_folds_issued_trained_and_dropped(tmp_path):
    ledger = tmp_path / LEDGER_DIR
    _lines(
        ledger / ISSUED_FILE,
        [
            {"group": "g1", "task": "a", "index": 0, "episodes": 2, "version": 0},
            {"group": "g2", "task": "b", "index": 3, "episodes": 2, "version": 0},
            {"group": "g3", "task": "a", "index": 1, "episodes": 2, "version": 1},
            {"group": "g4", "task": "a", "index": 2, "episodes": 2, "version": 1},
        ],
    )
    (ledger / ISSUED_FILE).open("a").write('{"group": "g5", "ta')  # cut by a crash
    _lines(
        tmp_path / "checkpoints" / "trained.jsonl",
        [
            {"version": 1, "groups": ["g1"], "episodes": ["g1-0", "g1-1"]},
            {"version": 2, "groups": ["g2"], "episodes": ["g2-0", "g2-1"]},  # checkpoint lost
            {"version": 2, "groups": ["g2"], "episodes": ["g2-0", "g2-1"]},  # trained again
            {"version": 3, "groups": ["g3", "gx"], "episodes": ["g3-1", "g1-0", "gx-0"]},
        ],
    )
    _lines(tmp_path / "metrics.jsonl", [{"version": 3.0}])  # v3 committed: all count
    _lines(
        ledger / DROPPED_FILE,
        [
            {"group": "g3", "members": ["g3-0"], "reason": "infra_failure", "version": 3},
            {"group": "g4", "episodes": 2, "reason": "timeout", "version": 3},
        ],
    )
    got = read_ledger(tmp_path)
    assert got.counts() == {
        "groups": 4,
        "issued": 8,
        "trained": 6,  # g1-0 g1-1 g2-0 g2-1 g3-1 gx-0
        "dropped": 3,  # g3-0 (infra), g4-0, g4-1 (timeout)
        "open": 0,
        "trained_twice": 1,  # g1-0 into v1 and v3; v2's retrain is one training
        "unissued": 1,  # gx-0
    }
    assert got.trained_twice == {"g1-0": [1, 3]}
    assert got.drop_reasons() == {"timeout": 2, "infra_failure": 1}
    assert got.last_version == 3


def _episodes(client, spec, count: int) -> list[EpisodeRequest]:
    out: list[EpisodeRequest] = []
    got = threading.Event()

    def take(delivery):
        out.append(decode(delivery.body, expect=EpisodeRequest).payload)
        delivery.ack()
        if len(out) >= count:
            got.set()

    consumer = client.consume(Topology(spec.run).episodes, take, prefetch=100)
    assert got.wait(10), f"{len(out)} of {count} episodes"
    consumer.cancel()
    return out


def _controller(broker, spec, tmp_path, version: int, **extra):
    return ControllerActor.start(
        broker=broker,
        topology=spec,
        tasks={"a": TaskEntry(1.0, 5), "b": TaskEntry(3.0, 7)},
        group_size=2,
        episodes_per_batch=4,
        max_staleness=1,
        initial=CheckpointReady(version=version, uri="/x", digest="", created_at=0.0),
        ledger_dir=tmp_path / LEDGER_DIR,
        **extra,
    )


def _announce(client, spec, version: int) -> None:
    ready = CheckpointReady(version=version, uri="/x", digest="", created_at=0.0)
    client.publish(Topology(spec.run).checkpoints, "", encode(ready, run=spec.run)).result(5)


def test_a_restarted_controller_neither_replays_the_task_order_nor_over_issues(
    broker, spec, client, tmp_path
):
    first = _controller(broker, spec, tmp_path, version=0)
    picked = _episodes(client, spec, 8)  # the window at v0 with eta 1: (0 + 1 + 1) * 4
    assert first.proxy().stats().get()["issued"] == 8
    first.stop()
    # restarted while v0 is still current (nothing trained): the window is full
    second = _controller(broker, spec, tmp_path, version=0)
    stats = second.proxy().stats().get()
    assert stats["issued"] == 8 and stats["groups"] == 4 and stats["allowance"] == 0
    assert client.queue_depth(Topology(spec.run).episodes) == 0  # nothing issued again
    _announce(client, spec, 1)  # one update: one more batch of 2 groups
    picked += _episodes(client, spec, 4)
    assert second.proxy().stats().get()["issued"] == 12
    # the task order continues where the first controller stopped, as one controller's would
    mixer = TaskMixer({"a": 1.0, "b": 3.0}, {"a": 5, "b": 7})
    expected = [mixer.next(v) for v in (0, 0, 0, 0, 1, 1)]
    groups = {(e.group_id, e.task, e.index) for e in picked}
    in_order = sorted(groups, key=lambda g: [e.group_id for e in picked].index(g[0]))
    assert [(task, index) for _, task, index in in_order] == expected
    assert len(read_ledger(tmp_path).issued) == 12


def _learner(broker, spec, tmp_path, backend, done):
    return LearnerActor.start(
        broker=broker, topology=spec, backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "checkpoints", start_version=0, group_size=2,
        groups_per_batch=1, hard_staleness=8, prefetch=64, pad_id=0, max_steps=1, done=done,
        group_timeout=0.2, sweep_interval=0.1, ledger_dir=tmp_path / LEDGER_DIR,
    )  # fmt: skip


def test_the_learner_writes_its_drops_and_continues_their_total_after_a_restart(
    broker, spec, client, tmp_path
):
    names = Topology(spec.run)
    totals: list[float] = []
    queue = client.declare_queue("", exclusive=True, dead_letter=False)
    client.bind(queue, names.control, "metrics.learner")

    def on_report(delivery) -> None:
        values = decode(delivery.body, expect=MetricsReport).payload.values
        if "learner/dropped_episodes_total" in values:
            totals.append(values["learner/dropped_episodes_total"])
        delivery.ack()

    client.consume(queue, on_report, prefetch=10)

    def lonely(group: str) -> None:  # one member of two: dropped at the 0.2 s timeout
        body = encode(trajectory(group, 0, reward=1.0), run=spec.run)
        client.publish("", names.trajectories, body).result(5)

    ref = _learner(broker, spec, tmp_path, FakeBackend(), threading.Event())
    lonely("lonely")
    wait_for(lambda: totals == [2.0], what="the first drop reported")
    ref.stop()
    _learner(broker, spec, tmp_path, FakeBackend(), threading.Event())
    lonely("alone")
    wait_for(lambda: totals[-1:] == [4.0], what="the run's total, not this process's")
    assert read_ledger(tmp_path).dropped == {
        "lonely-0": "timeout", "lonely-1": "timeout", "alone-0": "timeout", "alone-1": "timeout"
    }  # fmt: skip


def test_the_ledger_command_prints_the_counts_and_fails_on_a_double_training(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "r"
    _lines(
        run_dir / LEDGER_DIR / ISSUED_FILE,
        [{"group": "g1", "task": "a", "index": 0, "episodes": 2, "version": 0},
         {"group": "g2", "task": "a", "index": 1, "episodes": 2, "version": 0}],
    )  # fmt: skip
    _lines(
        run_dir / "checkpoints" / "trained.jsonl",
        [{"version": 1, "groups": ["g1"], "episodes": ["g1-0", "g1-1"]}],
    )
    _lines(run_dir / "metrics.jsonl", [{"version": 1.0}, {"version": 2.0}])
    assert main(["ledger", "--run", "r", "--output-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 groups, 4 episodes issued" in out and "trained       2 (into v1..v1)" in out
    assert "open          2" in out and "open: g2-0 (a)" in out
    _lines(
        run_dir / "checkpoints" / "trained.jsonl",
        [{"version": 1, "groups": ["g1"], "episodes": ["g1-0", "g1-1"]},
         {"version": 2, "groups": ["g1"], "episodes": ["g1-0"]}],
    )  # fmt: skip
    assert main(["ledger", "--run", "r", "--output-dir", str(tmp_path / "runs"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["trained_twice_episodes"] == {"g1-0": [1, 2]}
    assert main(["ledger", "--run", "nope", "--output-dir", str(tmp_path / "runs")]) == 2


def test_a_group_journaled_but_not_confirmed_is_published_again_under_its_ids(
    broker, spec, client, tmp_path
):
    """The controller died between journaling a group and the broker's confirm: the
    restarted controller publishes that group again (same episode ids), issues nothing
    beyond its window, and marks it confirmed."""
    mixer = TaskMixer({"a": 1.0, "b": 3.0}, {"a": 5, "b": 7})
    entries = []
    for i in range(4):  # the window at v0 with eta 1: 8 episodes in 4 groups of 2
        task, index = mixer.next(0)
        entries.append({"group": f"g{i}", "task": task, "index": index, "episodes": 2,
                        "version": 0})  # fmt: skip
    _lines(
        tmp_path / LEDGER_DIR / ISSUED_FILE,
        [*entries[:3], {"confirmed": ["g0", "g1", "g2"]}, entries[3]],
    )
    ctl = _controller(broker, spec, tmp_path, version=0)
    again = _episodes(client, spec, 2)
    assert sorted(e.episode_id for e in again) == ["g3-0", "g3-1"]
    assert (again[0].task, again[0].index) == (entries[3]["task"], entries[3]["index"])
    assert ctl.proxy().stats().get()["issued"] == 8  # nothing new: the window is full
    lines = (tmp_path / LEDGER_DIR / ISSUED_FILE).read_text().splitlines()
    assert json.loads(lines[-1]) == {"confirmed": ["g3"]}
    assert read_ledger(tmp_path).groups == 4


def test_a_controller_on_a_new_broker_issues_anew_what_died_with_the_old_one(
    broker, spec, client, tmp_path
):
    """Resumed at v1 (one batch of 4 trained) on an in-process broker in a new process: the
    ledger shows 12 episodes issued and the learner 2 dropped, so 6 died with the old
    broker. Counted as issued they filled the window for good (the run stalled); now the
    window issues them anew, and nothing is published again under the old ids."""
    mixer = TaskMixer({"a": 1.0, "b": 3.0}, {"a": 5, "b": 7})
    entries = []
    for i, version in enumerate([0, 0, 0, 0, 1, 1]):  # 12 episodes in groups of 2
        task, index = mixer.next(version)
        entries.append({"group": f"g{i}", "task": task, "index": index, "episodes": 2,
                        "version": version})  # fmt: skip
    _lines(tmp_path / LEDGER_DIR / ISSUED_FILE, [*entries, {"confirmed": ["g0", "g1", "g2"]}])
    _lines(tmp_path / LEDGER_DIR / DROPPED_FILE,
           [{"group": "g2", "episodes": 2, "reason": "stale", "version": 1}])  # fmt: skip
    kept = _controller(broker, spec, tmp_path, version=1)
    # the broker kept its queue: all 12 count, and the 3 unconfirmed groups go out again
    assert kept.proxy().stats().get()["issued"] == 12
    kept.stop()
    _episodes(client, spec, 6)  # (the unconfirmed groups' copies)
    gone = _controller(broker, spec, tmp_path, version=1, untrained_gone=True)
    # trained 4 + dropped 2 = 6 accounted; the window at v1 (eta 1) is (1 + 1 + 1) * 4 (+ the
    # learner's 2 dropped once it reports them): 6 to issue
    fresh = _episodes(client, spec, 6)
    assert gone.proxy().stats().get()["issued"] == 12
    assert not {e.group_id for e in fresh} & {f"g{i}" for i in range(6)}
    assert client.queue_depth(Topology(spec.run).episodes) == 0

"""The trace store (`actors/_trace_store`): what the learner writes is what the viewer reads,
a resumed run appends, a version trained again replaces its rows, the filters select."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from agentrl.actors import LearnerActor
from agentrl.actors._fakes import FakeBackend
from agentrl.actors._trace_store import (
    TRACE_FILE,
    EpisodeFilter,
    TraceError,
    TraceReader,
    TraceWriter,
)
from agentrl.trainer import build_batch
from tests.unit.records import trajectory
from tests.unit.test_actors import publish_trajs, wait_for
from tests.unit.test_actors import trajectory as wire_trajectory


def pair(group: str, *, task: str = "calc", version: int = 0, rewards=(1.0, 0.0)):
    """A GRPO group of two one-turn episodes (tokens 1..6, tokens 3..5 sampled)."""
    return [
        trajectory(
            [0, 0, 1, 1, 1, 0],
            group=group,
            reward=r,
            version=version,
            episode_id=f"{group}-{i}",
            sample_idx=i,
            task=task,
            status="completed" if r > 0 else "agent_invalid_action",
        )
        for i, r in enumerate(rewards)
    ]


def test_a_trained_episode_reads_back_with_the_advantage_of_each_token(tmp_path):
    batch = pair("g")
    train = build_batch(batch, pad_id=0)
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    writer.trained(1, batch, train)
    reader = TraceReader(tmp_path / TRACE_FILE)
    win, loss = reader.episode("g-0"), reader.episode("g-1")
    assert win is not None and loss is not None
    # rewards [1, 0]: A = ±(1 - 0.5) / (std 0.7071 + 1e-6) = ±0.7071 (group advantage); both
    # rows have spread and 3 tokens each, so the task RMS is 0.7071 and Ã = A / RMS = ±1.0
    assert win.advantages == pytest.approx([0, 0, 1.0, 1.0, 1.0, 0], abs=1e-5)
    assert loss.advantages == pytest.approx([0, 0, -1.0, -1.0, -1.0, 0], abs=1e-5)
    assert win.trained == [0, 0, 1, 1, 1, 0]
    t = batch[0]
    assert (win.token_ids, win.loss_mask, win.versions) == (t.token_ids, t.loss_mask, t.versions)
    assert win.logprobs == pytest.approx(t.logprobs)
    assert win.pools == ["current"] and win.summary.outcome == "trained"
    assert win.summary.version == 1 and win.summary.reason is None
    assert (win.summary.min_sampled, win.summary.max_sampled) == (0, 0)
    assert reader.meta() == {"tokenizer": "tiny"}
    assert reader.episode("nope") is None


def test_tokens_older_than_the_lag_bound_are_stored_as_untrained(tmp_path):
    old, new = pair("g")  # tokens of version 0
    batch = [old, new]
    train = build_batch(batch, pad_id=0, version=5, max_token_lag=4)  # lag 5 > 4: all masked
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    writer.trained(6, batch, train)
    got = TraceReader(tmp_path / TRACE_FILE).episode("g-0")
    assert got is not None
    assert got.loss_mask == [0, 0, 1, 1, 1, 0] and got.trained == [0] * 6
    assert got.advantages == [0.0] * 6


def test_a_resumed_writer_appends_and_a_version_trained_again_replaces(tmp_path):
    path = tmp_path / TRACE_FILE
    first = TraceWriter(path, tokenizer="/models/a")
    first.trained(1, pair("g1"), build_batch(pair("g1"), pad_id=0))
    first.close()
    again = TraceWriter(path, tokenizer="/models/b")  # the run resumed
    batch = pair("g2", version=1)
    again.trained(2, batch, build_batch(batch, pad_id=0))
    # the checkpoint of v2 was lost: v2 is trained again from the redelivered group
    again.trained(2, batch, build_batch(batch, pad_id=0))
    reader = TraceReader(path)
    assert reader.count() == 4
    assert [e.episode_id for e in reader.episodes()] == ["g2-0", "g2-1", "g1-0", "g1-1"]
    assert reader.meta()["tokenizer"] == "/models/b"


def test_dropped_episodes_keep_their_reason_and_the_left_out_members_of_a_trained_group(
    tmp_path,
):
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    flat = pair("flat", rewards=(0.0, 0.0))
    writer.dropped(3, "no_spread", flat)
    batch = pair("g", version=3)
    lost = trajectory([], group="g", episode_id="g-2", sample_idx=2, pools=[], num_turns=0,
                      metrics={"infra_failure": 1.0})  # fmt: skip
    writer.trained(4, batch, build_batch(batch, pad_id=0), [(lost, "infra_failure")])
    reader = TraceReader(tmp_path / TRACE_FILE)
    dropped = reader.episodes(EpisodeFilter(outcome="dropped"))
    assert {(e.episode_id, e.reason, e.version) for e in dropped} == {
        ("flat-0", "no_spread", 3),
        ("flat-1", "no_spread", 3),
        ("g-2", "infra_failure", 4),
    }
    empty = reader.episode("g-2")
    assert empty is not None and empty.token_ids == [] and empty.advantages is None
    assert empty.summary.min_sampled is None


def test_the_filters_select_by_task_status_outcome_version_and_reward(tmp_path):
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    for version, group, task in ((1, "a", "calc"), (2, "b", "calc"), (2, "c", "db")):
        batch = pair(group, task=task, version=version - 1, rewards=(1.0, -0.2))
        writer.trained(version, batch, build_batch(batch, pad_id=0))
    writer.dropped(2, "stale", pair("d", task="db", rewards=(0.5, 0.5)))
    reader = TraceReader(tmp_path / TRACE_FILE)

    def ids(**where):
        return sorted(e.episode_id for e in reader.episodes(EpisodeFilter(**where)))

    assert ids(task="db") == ["c-0", "c-1", "d-0", "d-1"]
    assert ids(group="b") == ["b-0", "b-1"]
    assert ids(status="completed", version=2) == ["b-0", "c-0", "d-0", "d-1"]
    assert ids(outcome="dropped") == ["d-0", "d-1"]
    assert ids(min_reward=0.5) == ["a-0", "b-0", "c-0", "d-0", "d-1"]
    assert ids(max_reward=0.0) == ["a-1", "b-1", "c-1"]
    assert ids(min_reward=0.2, max_reward=0.7, task="db") == ["d-0", "d-1"]
    assert reader.count(EpisodeFilter(task="calc", version=1)) == 2
    assert [e.episode_id for e in reader.episodes(limit=2, offset=1)] == ["b-1", "c-0"]
    facets = reader.facets()
    assert facets["task"] == ["calc", "db"] and facets["version"] == [1, 2]
    assert facets["outcome"] == ["dropped", "trained"]
    assert facets["status"] == ["agent_invalid_action", "completed"]


def test_a_reader_sees_each_update_once_committed_while_the_writer_stays_open(tmp_path):
    writer = TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    writer.trained(1, pair("a"), build_batch(pair("a"), pad_id=0))
    reader = TraceReader(tmp_path / TRACE_FILE)
    assert reader.count() == 2
    writer.trained(2, pair("b"), build_batch(pair("b"), pad_id=0))
    assert reader.count() == 4


def test_a_missing_store_or_one_of_another_schema_is_refused(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        TraceReader(tmp_path / TRACE_FILE)
    TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny").close()
    db = sqlite3.connect(tmp_path / TRACE_FILE)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(TraceError, match="schema 99, expected 1"):
        TraceReader(tmp_path / TRACE_FILE)
    with pytest.raises(TraceError, match="schema 99, expected 1"):
        TraceWriter(tmp_path / TRACE_FILE, tokenizer="tiny")
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all, " * 100)
    with pytest.raises(TraceError, match="not a readable trace store"):
        TraceReader(tmp_path / "junk.sqlite")


@pytest.mark.usefixtures("stop_actors")
def test_the_learner_writes_trained_dropped_and_late_episodes(broker, spec, client, tmp_path):
    backend, done = FakeBackend(), threading.Event()
    path = tmp_path / TRACE_FILE
    ref = LearnerActor.start(
        broker=broker,
        topology=spec,
        backend_factory=lambda: backend,
        checkpoint_dir=tmp_path / "ckpt",
        start_version=0,
        group_size=3,
        groups_per_batch=1,
        hard_staleness=8,
        prefetch=64,
        pad_id=0,
        done=done,
        drop_flat_groups=True,
        sweep_interval=3600.0,
        trace=lambda: TraceWriter(path, tokenizer="tiny"),
    )
    flat = [wire_trajectory("flat", i, reward=0.0) for i in range(3)]
    trained = [wire_trajectory("g", 0, reward=1.0), wire_trajectory("g", 1, reward=0.0),
               wire_trajectory("g", 2, reward=0.0, infra=True)]  # fmt: skip
    publish_trajs(client, spec, [*flat, *trained])
    wait_for(lambda: ref.proxy().version().get() == 1, what="one update")
    late = wire_trajectory("flat", 3, reward=0.0)  # a fourth copy, after its group's drop
    publish_trajs(client, spec, [late])
    reader = TraceReader(path)
    wait_for(lambda: reader.count() == 7, what="seven rows")
    rows = {e.episode_id: (e.outcome, e.reason, e.version) for e in reader.episodes()}
    assert rows == {
        "flat-0": ("dropped", "no_spread", 0),
        "flat-1": ("dropped", "no_spread", 0),
        "flat-2": ("dropped", "no_spread", 0),
        "flat-3": ("dropped", "no_spread", 1),
        "g-0": ("trained", None, 1),
        "g-1": ("trained", None, 1),
        "g-2": ("dropped", "infra_failure", 1),
    }
    got = reader.episode("g-0")
    assert got is not None
    # the advantages the backend trained with, shifted back onto the tokens
    row = backend.batches[0].advantages[0]
    assert got.advantages == pytest.approx([0.0, *row[:5].tolist()])
    assert got.advantages[2] > 0
    ref.stop()


@pytest.mark.slow
def test_a_resumed_tiny_model_run_appends_to_its_store(tmp_path):
    import uuid

    from agentrl.actors._ledger import read_ledger
    from agentrl.ops import Supervisor, parse_config
    from agentrl.trainer import resolve_model
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://trace-{uuid.uuid4().hex[:6]}", "trace", steps=1)
    assert Supervisor(parse_config(raw)).run(progress_every=3600, install_signals=False) == 0
    raw["max_steps"] = 2
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0  # resumed
    reader = TraceReader(cfg.run_dir / TRACE_FILE)
    trained = reader.episodes(EpisodeFilter(outcome="trained"))
    assert sorted(e.version for e in trained) == [1] * 4 + [2] * 4
    assert {e.episode_id: e.version for e in trained} == read_ledger(cfg.run_dir).trained
    assert reader.meta()["tokenizer"] == str(resolve_model("tiny"))  # the run's own model

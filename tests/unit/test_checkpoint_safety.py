"""A checkpoint is committed whole with its metrics row, a full disk stops the run before
the write, and Ctrl-C drains on the first signal and aborts on the second."""

from __future__ import annotations

import errno
import json
import signal
import threading
from collections import namedtuple
from pathlib import Path

import pytest

from agentrl.actors import LearnerActor
from agentrl.actors import _learner as learner_module
from agentrl.actors._checkpoint import METRICS_FILE, missing_rows
from agentrl.actors._fakes import FakeBackend
from agentrl.actors._ledger import read_ledger
from agentrl.messages import Topology
from agentrl.ops.run import disk
from agentrl.ops.run.disk import DiskCheck
from agentrl.ops.run.interrupt import ABORT_EXIT, Interrupts
from tests.unit.test_actors import publish_trajs, trajectory, wait_for

pytestmark = pytest.mark.usefixtures("stop_actors")


def _learner(broker, spec, tmp_path, **kwargs):
    done = threading.Event()
    metrics: list[dict] = []
    ref = LearnerActor.start(
        broker=broker, topology=spec,
        backend_factory=kwargs.pop("backend_factory", FakeBackend),
        checkpoint_dir=tmp_path / "ckpt", start_version=0, group_size=2, groups_per_batch=1,
        hard_staleness=8, prefetch=64, pad_id=0, on_metrics=metrics.append, done=done,
        **kwargs,
    )  # fmt: skip
    return ref, done, metrics


def _group(client, spec, name):
    publish_trajs(client, spec, [trajectory(name, 0, reward=0.0), trajectory(name, 1, reward=1.0)])


def test_a_death_between_checkpoint_and_broadcast_loses_no_metrics_row(
    broker, spec, client, tmp_path, monkeypatch
):
    """Issue 29: a learner that died after its checkpoint, before the announcement, never
    wrote that version's row. The row is in the checkpoint; the next start appends it once."""
    real = learner_module.broadcast
    died = threading.Event()

    def broadcast(transport, exchange, key, body):
        if exchange.endswith("checkpoints"):  # the learner dies here (the actor fails)
            died.set()
            raise RuntimeError("killed between checkpoint and broadcast")
        return real(transport, exchange, key, body)

    monkeypatch.setattr(learner_module, "broadcast", broadcast)
    ref, _, _ = _learner(broker, spec, tmp_path, on_fatal=None)
    _group(client, spec, "g1")
    wait_for(died.is_set, what="the death")
    wait_for(lambda: not ref.is_alive(), what="the learner's end")
    ckpt = tmp_path / "ckpt" / "v000001"
    assert (ckpt / "DIGEST").exists()
    metrics_path = tmp_path / "metrics.jsonl"  # what the supervisor had written: no v1 row
    metrics_path.write_text("")
    rows = missing_rows(tmp_path / "ckpt", metrics_path)
    assert [r["version"] for r in rows] == [1.0]
    assert rows[0]["learner/step_time"] >= 0 and "time" in rows[0]
    with metrics_path.open("a") as fh:  # what the restarted supervisor does with them
        fh.write(json.dumps(rows[0]) + "\n")
    assert missing_rows(tmp_path / "ckpt", metrics_path) == []  # resumed again: not twice


def test_every_committed_checkpoint_carries_its_row_and_no_partial_is_left(
    broker, spec, client, tmp_path
):
    _, done, metrics = _learner(broker, spec, tmp_path, max_steps=2)
    _group(client, spec, "g1")
    _group(client, spec, "g2")
    assert done.wait(20)
    for version in (1, 2):
        row = json.loads((tmp_path / "ckpt" / f"v{version:06d}" / METRICS_FILE).read_text())
        assert row["version"] == version
        assert {k: v for k, v in row.items() if k != "time"} == metrics[version - 1]
    assert not list((tmp_path / "ckpt").glob(".*partial"))


def test_a_partial_checkpoint_is_removed_at_start(broker, spec, tmp_path):
    partial = tmp_path / "ckpt" / ".v000003.partial"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"cut")
    ref, _, _ = _learner(broker, spec, tmp_path)
    wait_for(lambda: not partial.exists(), what="the partial's removal")
    ref.stop()


def test_a_full_disk_stops_the_run_before_the_checkpoint(broker, spec, client, tmp_path):
    said: list[str] = []
    line = "disk full: 1 MiB free"
    _ref, done, metrics = _learner(
        broker, spec, tmp_path, disk_problem=lambda: line, on_fatal=said.append
    )
    _group(client, spec, "g1")
    assert done.wait(20)
    assert said == [line] and metrics == []
    assert not list((tmp_path / "ckpt").glob("*v0*"))  # nothing of the update written


class _FillsTheDisk(FakeBackend):
    """A backend whose checkpoint write runs out of space part way (as the writer says it)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def save(self, out_dir):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"cut sh")
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"),
        RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"),
    ],
    ids=["oserror", "torch-context", "torch"],
)
def test_a_disk_that_fills_during_the_checkpoint_stops_the_run_and_keeps_nothing_of_it(
    broker, spec, client, tmp_path, error
):
    """Issue 50: the learner failed with the writer's raw error, stayed up, and the ledger
    counted the unwritten version as trained. Now: one line, the run stops, no partial,
    no journal entry, nothing acked (the episodes go back to the queue)."""
    if "unexpected pos" in str(error):  # torch raises this one from the ENOSPC it met
        error.__context__ = OSError(errno.ENOSPC, "No space left on device")
    said: list[str] = []
    ref, done, metrics = _learner(
        broker, spec, tmp_path, backend_factory=lambda: _FillsTheDisk(error), on_fatal=said.append
    )
    _group(client, spec, "g1")
    assert done.wait(20)
    assert len(said) == 1 and said[0].startswith("disk full while writing checkpoint v1 (")
    assert "--resume" in said[0] and "\n" not in said[0]
    assert metrics == []
    ckpt = tmp_path / "ckpt"
    assert not [p for p in ckpt.iterdir() if p.name.startswith((".v", "v0"))]
    journal = ckpt / "trained.jsonl"
    assert not journal.exists() or journal.read_text() == ""
    ref.stop()
    names = Topology(spec.run)
    wait_for(lambda: client.queue_depth(names.trajectories) == 2, what="the episodes requeued")


def test_a_disk_error_that_is_not_a_full_disk_still_fails_the_learner(
    broker, spec, client, tmp_path
):
    error = RuntimeError("a bug in the writer")
    ref, _, _ = _learner(
        broker, spec, tmp_path, backend_factory=lambda: _FillsTheDisk(error), on_fatal=None
    )
    _group(client, spec, "g1")
    wait_for(lambda: not ref.is_alive(), what="the learner's failure")
    assert not list((tmp_path / "ckpt").glob(".v*"))  # the partial is removed all the same


def test_the_ledger_counts_no_version_past_the_newest_committed_checkpoint(tmp_path):
    run_dir = tmp_path
    ledger_dir = run_dir / "ledger"
    ledger_dir.mkdir()
    (ledger_dir / "issued.jsonl").write_text(
        "".join(
            json.dumps({"group": g, "task": "t", "index": 0, "episodes": 2, "version": 0}) + "\n"
            for g in ("a", "b", "c")
        )
    )
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir()
    (ckpt / "trained.jsonl").write_text(
        "".join(
            json.dumps({"version": v, "groups": [g], "episodes": [f"{g}-0", f"{g}-1"]}) + "\n"
            for v, g in ((1, "a"), (2, "b"), (3, "c"))
        )
    )
    (ckpt / "v000002").mkdir()
    (ckpt / "v000002" / "DIGEST").write_text("d\n")  # v1 pruned, v3's write failed
    (ckpt / "v000003").mkdir()  # no DIGEST: not a checkpoint
    summary = read_ledger(run_dir)
    assert summary.trained == {"a-0": 1, "a-1": 1, "b-0": 2, "b-1": 2}
    assert summary.open == ["c-0", "c-1"]
    (run_dir / "metrics.jsonl").write_text(json.dumps({"version": 3.0}) + "\n")
    assert read_ledger(run_dir).trained["c-0"] == 3  # its row says v3 was committed


Usage = namedtuple("Usage", "total used free")


def test_disk_check_needs_the_newest_checkpoint_and_its_state(tmp_path, monkeypatch):
    ckpt, state = tmp_path / "ckpt", tmp_path / "state"
    (ckpt / "v000001").mkdir(parents=True)
    (ckpt / "v000001" / "model.safetensors").write_bytes(b"x" * 1000)
    (ckpt / "v000002").mkdir()
    (ckpt / "v000002" / "model.safetensors").write_bytes(b"x" * 3000)
    (state / "v000002").mkdir(parents=True)
    (state / "v000002" / "optimizer.pt").write_bytes(b"x" * 6000)
    check = DiskCheck(ckpt, state_dir=state, margin=100)
    assert check.needed() == 3000 + 6000 + 100  # the newest of each, plus the margin
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda _: Usage(10**6, 0, 9100))
    assert check.problem() is None
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda _: Usage(10**6, 0, 9099))
    problem = check.problem()
    assert problem.startswith("disk full:") and "keep_checkpoints" in problem
    assert "\n" not in problem


def test_disk_check_estimates_the_first_checkpoint_from_the_model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 500)
    check = DiskCheck(tmp_path / "ckpt", model_dir=model, state_dir=tmp_path / "s", margin=0)
    assert check.needed() == 500 + 2 * 500  # weights, and AdamW's two moments


def test_the_first_checkpoint_of_a_bfloat16_model_trained_in_float32_is_twice_its_files(
    tmp_path,
):
    """Issue 48: a bfloat16 model directory (46 GB at 7B) was taken as the size of the first
    float32 checkpoint, half of what it writes. The estimate reads the parameter count from
    the safetensors headers and sizes it in the learner's dtype."""
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir()
    save_file({"a": torch.zeros(10, 30, dtype=torch.bfloat16)}, model / "model-1.safetensors")
    save_file({"b": torch.zeros(100, dtype=torch.bfloat16)}, model / "model-2.safetensors")
    params = 10 * 30 + 100
    as_stored = DiskCheck(tmp_path / "ckpt", model_dir=model, margin=0)
    assert as_stored.needed() == params * 2  # bfloat16, as the files hold it
    learner = DiskCheck(
        tmp_path / "ckpt", model_dir=model, state_dir=tmp_path / "s", margin=0, param_bytes=4
    )
    assert learner.needed() == params * 4 * 3  # float32 weights, and AdamW's two moments


def test_keep_checkpoints_is_bounded_by_default():
    from agentrl.ops.config.schema import LearnerConfig

    assert LearnerConfig().keep_checkpoints == 5


def test_the_first_signal_drains_and_says_what_it_waits_for_the_second_aborts(capsys):
    done, aborted = threading.Event(), []
    interrupts = Interrupts(done, "the learner's update", abort=aborted.append)
    interrupts(signal.SIGINT)
    assert done.is_set() and aborted == []
    err = capsys.readouterr().err
    assert "SIGINT: stopping; waiting for the learner's update" in err and "again" in err
    interrupts(signal.SIGTERM)
    assert aborted == [ABORT_EXIT]
    assert "SIGTERM again: aborted" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_on_a_full_disk_stops_with_one_line_and_exit_2(tmp_path, monkeypatch, capfd):
    import uuid

    from agentrl.ops import Supervisor, parse_config
    from tests.smoke_helpers import smoke_config

    raw = smoke_config(tmp_path, f"memory://full-{uuid.uuid4().hex[:6]}", "full", steps=2)
    cfg = parse_config(raw)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda _: Usage(10**9, 10**9, 1 << 20))
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 2
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("agentrl-supervisor: disk full: 1 MiB free")
    assert not list((cfg.run_dir / "checkpoints").glob("*v0*"))  # nothing written

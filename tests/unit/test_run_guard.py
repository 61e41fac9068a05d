"""A run is started once: a second learner is refused (the broker lock), an existing run
resumes only when asked (--resume), and a resumed run keeps its earlier config."""

from __future__ import annotations

import uuid

import pytest
import yaml

from agentrl.ops.cli.agentrl_supervisor import main
from agentrl.ops.run.run_dir import earlier_start, write_config
from agentrl.ops.run.run_lock import RunLocked, take_learner_lock


def test_a_second_learner_of_a_run_is_refused_until_the_first_lets_go():
    broker, run = f"memory://lock-{uuid.uuid4().hex[:6]}", "r"
    first = take_learner_lock(broker, run, "a")
    try:
        with pytest.raises(RunLocked, match="already has a learner"):
            take_learner_lock(broker, run, "b")
        other = take_learner_lock(broker, "another-run", "b")  # other runs are not locked
        other.close()
    finally:
        first.close()
    take_learner_lock(broker, run, "b").close()  # released with the connection


def test_a_held_lock_is_waited_for(monkeypatch):
    import threading
    import time

    broker, run = f"memory://lock-{uuid.uuid4().hex[:6]}", "r"
    first = take_learner_lock(broker, run, "a")
    threading.Timer(0.5, first.close).start()  # its holder goes while the next one waits
    start = time.monotonic()
    take_learner_lock(broker, run, "b", wait=10.0).close()
    assert 0.4 < time.monotonic() - start < 5.0


def _config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "tiny",
                "run": "guarded",
                "broker": f"memory://guard-{uuid.uuid4().hex[:6]}",
                "output_dir": str(tmp_path / "runs"),
                "tasks": {"calculator": {}},
            }
        )
    )
    return path


def test_starting_an_existing_run_without_resume_is_refused(tmp_path, capsys):
    config = _config(tmp_path)
    run_dir = tmp_path / "runs" / "guarded"
    (run_dir / "checkpoints" / "v000003").mkdir(parents=True)
    (run_dir / "checkpoints" / "v000003" / "DIGEST").write_text("d")
    (run_dir / "config.yaml").write_text("model: tiny\n")
    assert main(["start", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "run 'guarded' exists" in err and "newest checkpoint v3" in err and "--resume" in err
    assert (run_dir / "config.yaml").read_text() == "model: tiny\n"  # not overwritten
    # roles without the learner (another node's samplers) join an existing run freely
    assert earlier_start(run_dir) is not None


def test_a_run_never_started_is_new(tmp_path):
    assert earlier_start(tmp_path / "nothing") is None


def test_a_warm_started_directory_counts_as_new(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "v000008").mkdir(parents=True)
    (run_dir / "sft.json").write_text("{}")
    assert earlier_start(run_dir) is None


def test_a_resume_with_another_config_keeps_the_earlier_one(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_config(run_dir, "a: 1\n")
    write_config(run_dir, "a: 1\n")  # the same: nothing kept
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]
    write_config(run_dir, "a: 2\n")
    write_config(run_dir, "a: 3\n")
    assert (run_dir / "config.1.yaml").read_text() == "a: 1\n"
    assert (run_dir / "config.2.yaml").read_text() == "a: 2\n"
    assert (run_dir / "config.yaml").read_text() == "a: 3\n"

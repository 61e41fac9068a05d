"""The whole loop with learner.backend: megatron (TP=2) on the in-process broker: the
supervisor builds MegatronLearner, stops its worker, and a second start resumes from the
learner state."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from agentrl.ops import Supervisor, parse_config
from tests.smoke_helpers import smoke_config


def _megatron_workers() -> list[int]:
    """Pids of megatron worker processes whose parent is this process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        if b"agentrl.trainer.megatron._worker" in cmdline and ppid == os.getpid():
            found.append(int(entry.name))
    return found


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_loop_trains_with_megatron_and_a_restart_resumes_its_state(tmp_path: Path, capsys):
    broker = f"memory://smoke-meg-{uuid.uuid4().hex[:6]}"
    raw = smoke_config(tmp_path, broker, "smoke-megatron", steps=2)
    raw["learner"].update(backend="megatron", megatron={"tp": 2})
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    assert _megatron_workers() == []  # the supervisor closed the backend
    metrics = _metrics(cfg.run_dir)
    assert [m["version"] for m in metrics] == [1.0, 2.0]
    # The fp32 sampler (HF layout) and the TP=2 Megatron learner score the same tokens alike.
    gaps = [m["rollout/logprob_gap_current"] for m in metrics if "rollout/logprob_gap_current" in m]
    assert gaps and max(gaps) < 1e-3, gaps
    assert (cfg.run_dir / "learner_state" / "v000002" / "metadata.json").exists()

    # A second start on the same run continues from checkpoint 2 and its learner state.
    capsys.readouterr()
    again = parse_config({**raw, "max_steps": 3})  # of the run: one more update
    assert Supervisor(again).run(progress_every=3600, install_signals=False) == 0
    state = str(cfg.run_dir / "learner_state" / "v000002")
    out = capsys.readouterr().out.splitlines()
    loaded = [line for line in out if "learner_state_loaded" in line]
    assert loaded and all(state in line for line in loaded)
    assert [m["version"] for m in _metrics(cfg.run_dir)] == [1.0, 2.0, 3.0]
    assert (cfg.run_dir / "checkpoints" / "v000003" / "DIGEST").exists()
    assert _megatron_workers() == []

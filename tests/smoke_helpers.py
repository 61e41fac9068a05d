"""The whole loop for a few learner steps with the tiny model (shared by the smoke tests)."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.actors._ledger import read_ledger
from agentrl.actors._trace_store import TRACE_FILE, EpisodeFilter, TraceReader
from agentrl.ops import Supervisor, parse_config


def smoke_config(tmp_path: Path, broker: str, run: str, steps: int = 2) -> dict:
    return {
        "run": run,
        "broker": broker,
        "model": "tiny",
        "output_dir": str(tmp_path),
        "max_steps": steps,
        "tasks": {"calculator": {"options": {"levels": [1]}}},
        "rollout": {
            "group_size": 2,
            "groups_per_batch": 2,
            "concurrency": 4,
            "max_turns": 2,
            "max_tokens": 1024,
            "max_new_tokens": 8,
        },
        "staleness": {"max": 1, "hard": 4},
        "pools": {"current": {"weight": 0.5}, "stale": {"weight": 0.5, "every": 2}},
        "learner": {"lr": 1e-4, "micro_batch_tokens": 2048},
    }


def run_smoke(tmp_path: Path, broker: str, run: str, steps: int = 2) -> list[dict]:
    cfg = parse_config(smoke_config(tmp_path, broker, run, steps))
    code = Supervisor(cfg).run(progress_every=3600, install_signals=False)
    assert code == 0
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["version"] for m in metrics] == list(range(1, steps + 1))
    for v in range(1, steps + 1):
        ckpt = cfg.run_dir / "checkpoints" / f"v{v:06d}"
        assert (ckpt / "DIGEST").exists() and list(ckpt.glob("*.safetensors")), ckpt
    for m in metrics:
        assert m["rollout/episodes"] == 4
        assert "env/calculator/reward" in m and "learner/step_time" in m
    # fp32 engine and fp32 learner agree on tokens sampled by the learner's own version
    # (update 1 trains on version-0 tokens only, so the metric is there at least once)
    events = list((cfg.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    gaps = [m["rollout/logprob_gap_current"] for m in metrics if "rollout/logprob_gap_current" in m]
    assert gaps and max(gaps) < 1e-3, gaps
    # the ledger accounts for every trained episode, once, each one issued
    ledger = read_ledger(cfg.run_dir)
    assert len(ledger.trained) == steps * 4 and ledger.last_version == steps
    assert not ledger.trained_twice and not ledger.unissued
    assert len(ledger.issued) == len(ledger.trained) + len(ledger.dropped) + len(ledger.open)
    # the trace store holds every trained episode, in the version the journal says
    trace = TraceReader(cfg.run_dir / TRACE_FILE)
    rows = trace.episodes(EpisodeFilter(outcome="trained"), limit=1000)
    assert {e.episode_id: e.version for e in rows} == ledger.trained
    return metrics

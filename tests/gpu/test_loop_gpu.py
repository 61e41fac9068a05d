"""The whole loop on the device: `agentrl-supervisor start` with every role in one process
on the in-process broker, learner and sampler engine on the device, for two updates; in
float32, and with ``learner.autocast: auto`` (bfloat16 for the learner's passes and the
engine where the device computes it faster: every CUDA device with bfloat16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from agentrl.trainer._device import BFLOAT16_MIN_SPEEDUP, bfloat16_speed


@pytest.mark.parametrize("autocast", [False, "auto"])
def test_the_supervisor_trains_two_updates_with_learner_and_sampler_on_the_device(
    device, model_dir, tmp_path, report, autocast
):
    config = {
        "run": "gpu",
        "broker": "memory://gpu",
        "model": str(model_dir),
        "output_dir": str(tmp_path / "runs"),
        "tasks": {"calculator": {"weight": 1.0, "options": {"levels": [1], "max_turns": 2}}},
        "rollout": {
            "group_size": 4,
            "groups_per_batch": 2,
            "concurrency": 8,
            "max_tokens": 1024,
            "max_new_tokens": 32,
        },
        "pools": {"current": {"max_batch": 8}},
        "learner": {
            "device": device,
            "kl_coef": 1e-3,
            "keep_checkpoints": 2,
            "autocast": autocast,
        },
    }
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "agentrl.ops.cli.agentrl_supervisor"]
    argv += ["start", "--config", str(path)]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--max-steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "gpu"
    assert (run / "checkpoints" / "v000002" / "DIGEST").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows if "learner/loss" in r][:2] == [1, 2], rows
    events = [
        json.loads(line)
        for path in (run / "logs").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.startswith("{")
    ]
    expected = "cuda" if device.startswith("cuda") else "cpu"
    loaded = [e for e in events if e.get("event") == "learner_loaded"]
    engines = [e for e in events if e.get("event") == "engine started"]
    assert loaded and all(e["device"].startswith(expected) for e in loaded), loaded
    assert engines and all(e["device"].startswith(expected) for e in engines), engines
    # auto: bfloat16 exactly where the device is fast at it (every CUDA device with bfloat16)
    fast = autocast == "auto" and bfloat16_speed(device) >= BFLOAT16_MIN_SPEEDUP
    if autocast == "auto" and expected == "cuda":
        assert fast, bfloat16_speed(device)
    assert all(e["autocast"] is fast for e in loaded), loaded
    assert all(e["dtype"] == ("bfloat16" if fast else "float32") for e in engines), engines
    chosen = [e for e in events if e.get("event") == "bfloat16 auto"]
    said = {e["what"] for e in chosen}
    assert said == ({"learner.autocast", "sampler engine"} if autocast == "auto" else set()), chosen
    report(
        autocast=autocast,
        bfloat16=fast,
        seconds=seconds,
        updates=2,
        episodes=sum(r.get("rollout/episodes", 0) for r in rows),
    )

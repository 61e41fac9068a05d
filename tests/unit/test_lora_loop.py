"""LoRA RL through the whole loop (tiny model, in-process broker): adapter checkpoints
announced and merged by every sampler, a resume from one, `agentrl eval` of one."""

from __future__ import annotations

import json
import uuid

import pytest
import torch

from agentrl.ops import Supervisor, parse_config
from agentrl.ops.eval.evaluate import evaluate
from agentrl.trainer import resolve_model
from agentrl.trainer._lora import ADAPTER_WEIGHTS, adapter_base
from tests.smoke_helpers import smoke_config


@pytest.mark.slow
def test_a_lora_run_checkpoints_adapters_resumes_and_evaluates(tmp_path):
    raw = smoke_config(tmp_path, f"memory://lora-{uuid.uuid4().hex[:6]}", "lora", steps=2)
    raw["learner"]["lora"] = {"rank": 4, "alpha": 8}
    cfg = parse_config(raw)
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    raw["max_steps"] = 3  # the same run started again: resumes at v2, trains one more
    assert Supervisor(parse_config(raw)).run(progress_every=3600, install_signals=False) == 0

    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["version"] for m in metrics] == [1, 2, 3]
    # both pools (current every version, stale every 2nd) merged the adapters exactly: the
    # tokens of the learner's own version score alike on both sides
    gaps = [m["rollout/logprob_gap_current"] for m in metrics if "rollout/logprob_gap_current" in m]
    assert gaps and max(gaps) < 1e-3, gaps
    model = resolve_model("tiny")
    full = (model / "model.safetensors").stat().st_size
    for v in (1, 2, 3):
        ckpt = cfg.run_dir / "checkpoints" / f"v{v:06d}"
        assert [p.name for p in ckpt.glob("*.safetensors")] == [ADAPTER_WEIGHTS]
        assert (ckpt / ADAPTER_WEIGHTS).stat().st_size < full / 20
        assert adapter_base(ckpt) == model.resolve()
    # the resumed learner loaded v2's AdamW state (adapters only) and continued: 3 updates
    # counted, where a fresh AdamW would count 1
    state = torch.load(cfg.run_dir / "learner_state" / "v000003" / "optimizer.pt")
    assert state["steps"] == 3

    report = evaluate(
        cfg.run_dir / "checkpoints" / "v000003",
        {"calculator": {"levels": [1]}},
        episodes=2,
        runs=1,
        max_new_tokens=8,
        concurrency=2,
    )
    assert sum(report.tasks["calculator"].statuses.values()) == 2


@pytest.mark.slow
def test_lora_rl_after_the_sft_warm_start_adapts_the_warm_started_model(tmp_path):
    from agentrl.ops.sft.train import run_sft

    raw = smoke_config(tmp_path, f"memory://lora-sft-{uuid.uuid4().hex[:6]}", "lora-sft", steps=1)
    raw["learner"]["lora"] = {"rank": 4}
    raw["rollout"]["max_new_tokens"] = 64  # room for the oracle's calls
    cfg = parse_config(raw)
    run_sft(cfg, steps=1, batch_episodes=2, lr=1e-3)  # the whole model, whatever learner.lora
    warm = cfg.run_dir / "checkpoints" / "v000001"
    assert (warm / "model.safetensors").is_file()
    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    adapter = cfg.run_dir / "checkpoints" / "v000002"
    # the base is the warm start's reference copy (it outlives pruning v1), not the run's model
    assert adapter_base(adapter) == (cfg.run_dir / "sft_reference").resolve()
    (metrics,) = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics["version"] == 2 and metrics["learner/kl"] < 1e-3  # B = 0: the policy is the base

"""`agentrl sft` end to end with the tiny model: checkpoint, record, metrics, then RL resumes."""

from __future__ import annotations

import itertools
import json
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from agentrl.ops import Supervisor, parse_config
from agentrl.ops.cli.agentrl import main
from agentrl.ops.sft.train import SFTError, run_sft
from agentrl.ops.sft.warm_start import WarmStartError, kl_reference, read_warm_start
from agentrl.trainer import checkpoint_digest, resolve_model


def config(tmp_path: Path, run: str, tasks: dict, **extra) -> dict:
    return {
        "run": run,
        "broker": f"memory://{run}",
        "model": "tiny",
        "output_dir": str(tmp_path),
        "tasks": tasks,
        "rollout": {
            "group_size": 2,
            "groups_per_batch": 1,
            "concurrency": 2,
            "max_turns": 2,
            "max_tokens": 1024,
            "max_new_tokens": 48,  # an oracle turn is ~30 tokens; longer ones are skipped
        },
        "staleness": {"max": 1, "hard": 4},
        "pools": {"current": {}},
        "learner": {"lr": 1e-4, "micro_batch_tokens": 4096},
        **extra,
    }


def test_sft_then_the_rl_run_continues_from_its_version_with_it_as_reference(tmp_path: Path):
    run = f"sft-{uuid.uuid4().hex[:6]}"
    tasks = {"calculator": {"weight": 2.0, "options": {"levels": [1]}}, "db": {}}
    raw = config(tmp_path, run, tasks, max_steps=1)
    raw["learner"]["kl_coef"] = 0.1
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    argv = ["sft", "--config", str(path), "--steps", "2", "--batch-episodes", "3", "--lr", "1e-3"]
    assert main(argv) == 0

    cfg = parse_config(raw)
    ckpt = cfg.run_dir / "checkpoints" / "v000002"
    assert (ckpt / "DIGEST").read_text().strip() == checkpoint_digest(ckpt)
    record = read_warm_start(cfg.run_dir)
    assert (record.version, record.checkpoint, record.base_model) == (
        2,
        "checkpoints/v000002",
        "tiny",
    )
    assert kl_reference(cfg.run_dir, resolve_model("tiny")) == cfg.run_dir / "sft_reference"
    lines = [json.loads(x) for x in (cfg.run_dir / "sft.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert sum(lines[-1]["episodes"].values()) == 6 and set(lines[-1]["skipped"]) == set(tasks)
    assert all(x["tokens"] > 0 and x["loss"] > 0 for x in lines)

    assert Supervisor(cfg).run(progress_every=3600, install_signals=False) == 0
    metrics = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [3]  # continued from the warm start's v2
    assert (cfg.run_dir / "checkpoints" / "v000003" / "DIGEST").exists()
    # The KL reference is the warm-started model: before the first RL update the policy
    # is that model, so the k3 KL is 0 (to the base model it would not be, see below).
    assert metrics[0]["learner/kl"] == pytest.approx(0.0, abs=1e-7)


def test_the_kl_reference_is_the_base_model_without_a_warm_start_and_checked_with_one(
    tmp_path: Path,
):
    base = resolve_model("tiny")
    assert kl_reference(tmp_path, base) == base
    run = f"sft-{uuid.uuid4().hex[:6]}"
    cfg = parse_config(config(tmp_path, run, {"calculator": {"options": {"num_instances": 4}}}))
    run_sft(cfg, steps=1, batch_episodes=2, lr=1e-3)
    reference = cfg.run_dir / "sft_reference"
    assert checkpoint_digest(reference) != checkpoint_digest(base)  # the update moved it
    shutil.rmtree(cfg.run_dir / "checkpoints" / "v000001")  # pruned by keep_checkpoints
    assert kl_reference(cfg.run_dir, base) == reference  # the copy outlives it
    (reference / "model.safetensors").write_bytes(b"damaged")
    with pytest.raises(WarmStartError, match="digest"):
        kl_reference(cfg.run_dir, base)


def test_sft_lowers_the_nll_of_the_oracle_data_and_refuses_a_run_with_checkpoints(
    tmp_path: Path,
):
    run = f"sft-{uuid.uuid4().hex[:6]}"
    # 4 instances, 4 episodes a step: each step's loss is the NLL of the same data set
    tasks = {"calculator": {"options": {"num_instances": 4, "levels": [1]}}}
    cfg = parse_config(config(tmp_path, run, tasks))
    result = run_sft(cfg, steps=6, batch_episodes=4, lr=2e-3)
    assert result.episodes == {"calculator": 24}
    assert result.skipped == {"calculator": {}}
    losses = result.losses  # each measured before its update: the NLL of the data so far
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.5, losses  # measured: 10.80 -> 9.54 in 5 updates
    with pytest.raises(SFTError, match="already has checkpoint"):
        run_sft(cfg, steps=1)

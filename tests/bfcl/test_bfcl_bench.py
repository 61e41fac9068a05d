"""bench/learning.py's held-out BFCL evaluation of the arms (``--bfcl-only``) and its table."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from agentrl.trainer import resolve_model

pytestmark = pytest.mark.bfcl

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("learning_bench_bfcl", BENCH / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCH))


def test_bfcl_of_the_arms_runs_on_the_kept_checkpoints_and_reaches_the_report(learning, tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    run_dir = work / "runs" / "learning-full"
    shutil.copytree(resolve_model("tiny"), run_dir / "checkpoints" / "v000003")
    (run_dir / "checkpoints" / "v000003" / "DIGEST").write_text("d\n")
    results.mkdir()
    arm = {
        "arm": "full",
        "config": {"run": "learning-full", "model": "tiny", "tasks": {}},
        "before_version": 0,
        "after_version": 3,
        "before": {"db": 0.5},
        "after": {"db": 0.75},
        "base": None,
        "sft": {"steps": 0, "seconds": 0.0},
        "rl": {"updates": 3, "seconds": 1.0, "stopped_by": "steps"},
        "budget_minutes": 1,
        "eval_settings": {"episodes": 4, "runs": 1},
        "seeds": {"run": 0},
        "training": [],
    }
    (results / "learning-full.json").write_text(json.dumps(arm))
    args = argparse.Namespace(
        results=results, bfcl="parallel,irrelevance=3", bfcl_episodes=2, bfcl_max_new=16, seed=0
    )
    learning.bfcl_of_arms(args, work)
    data = json.loads((results / "learning-full.json").read_text())
    bfcl = data["bfcl"]
    assert bfcl["base"] == bfcl["before"]  # v0: the model as shipped, evaluated once
    assert bfcl["after"]["checkpoint"] == str(run_dir / "checkpoints" / "v000003")
    assert bfcl["after"]["entries"] == {"parallel": 2, "irrelevance": 3}
    assert set(bfcl["after"]["accuracy"]) == {"parallel", "irrelevance"}
    from learning_report import bfcl_table

    table = bfcl_table({"full": data})
    assert table.splitlines()[0] == "| BFCL category | entries | base | full after |"
    assert "| parallel | 2 |" in table and "--bfcl" not in table

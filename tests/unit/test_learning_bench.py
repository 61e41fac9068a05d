"""bench/learning.py's reuse of an earlier arm's warm start (``--warm-start-from``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("learning_bench", BENCH / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCH))  # the bench puts its folder first to import learning_report


CFG = {"model": "smollm2", "tasks": {"db": {"options": {"levels": [0]}}}}
ROLLOUT = {"max_tokens": 2048, "max_new_tokens": 96}


def _source(tmp_path: Path, steps: int = 2) -> Path:
    """A run directory as an arm leaves it after its warm start and first evaluation."""
    source = tmp_path / "warm" / "learning-full"
    (source / f"checkpoints/v{steps:06d}").mkdir(parents=True)
    (source / f"checkpoints/v{steps:06d}/DIGEST").write_text("d\n")
    (source / "sft_reference").mkdir()
    (source / "sft_reference/DIGEST").write_text("d\n")
    config = source.with_suffix(".yaml")
    config.write_text(yaml.safe_dump({**CFG, "run": "learning-full"}))
    os.utime(config, (1000.0, 1000.0))  # the arm wrote its config at t = 1000 s
    record = {"version": steps, "created_at": 1130.0}  # its SFT finished at t = 1130 s
    (source / "sft.json").write_text(json.dumps(record))
    (source / "sft.jsonl").write_text("".join(f'{{"step": {i + 1}}}\n' for i in range(steps)))
    report = {
        "episodes": 16,
        "runs": 1,
        "seed": 0,
        "seconds": 222.0,
        **ROLLOUT,
        "tasks": {
            "db": {
                "pass_rate_mean": 0.25,
                "pass_rate_std": 0.0,
                "reward_mean": 0.1,
                "statuses": {"completed": 16},
            }
        },
    }
    (source / f"eval-v{steps:06d}.json").write_text(json.dumps(report))
    (source / f"eval-v{steps:06d}.md").write_text("| task |\n")
    return source


def _args(**overrides) -> argparse.Namespace:
    values = {"sft_steps": 2, "sft_lr": 1e-4, "eval_episodes": 16, "eval_runs": 1, "seed": 0}
    values["results"] = None
    return argparse.Namespace(**{**values, **overrides})


def test_the_warm_start_and_its_evaluation_are_copied(learning, tmp_path):
    source = _source(tmp_path)
    run_dir = tmp_path / "runs" / "learning-no-task-norm"
    run_dir.mkdir(parents=True)
    cfg = {**CFG, "rollout": ROLLOUT}
    sft, before = learning.reuse_warm_start(source, run_dir, cfg, _args())
    assert learning.checkpoints(run_dir) == {2: run_dir / "checkpoints/v000002"}
    assert (run_dir / "sft_reference/DIGEST").exists() and (run_dir / "sft.json").exists()
    # seconds: SFT record (1130 s) - config written (1000 s)
    assert sft == {
        "steps": 2,
        "seconds": 130.0,
        "version": 2,
        "lr": 1e-4,
        "reused_from": str(source),
    }
    assert before["pass_rate"] == {"db": 0.25} and before["seconds"] == 222.0
    assert before["checkpoint"] == str(run_dir / "checkpoints/v000002")
    assert (run_dir / "eval-v000002.json").exists()


def test_an_evaluation_with_other_settings_is_not_reused(learning, tmp_path):
    source = _source(tmp_path)
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    cfg = {**CFG, "rollout": ROLLOUT}
    _, before = learning.reuse_warm_start(source, run_dir, cfg, _args(eval_episodes=8))
    assert before is None
    run_dir = tmp_path / "runs" / "b"
    run_dir.mkdir(parents=True)
    cfg = {**CFG, "rollout": {**ROLLOUT, "max_new_tokens": 64}}
    assert learning.reuse_warm_start(source, run_dir, cfg, _args())[1] is None


def test_a_warm_start_of_other_tasks_or_steps_is_refused(learning, tmp_path):
    source = _source(tmp_path)
    run_dir = tmp_path / "runs" / "c"
    run_dir.mkdir(parents=True)
    other = {**CFG, "tasks": {"kg": {}}, "rollout": ROLLOUT}
    with pytest.raises(SystemExit, match="its tasks differ"):
        learning.reuse_warm_start(source, run_dir, other, _args())
    with pytest.raises(SystemExit, match="2 SFT steps, not --sft-steps 3"):
        learning.reuse_warm_start(source, run_dir, {**CFG, "rollout": ROLLOUT}, _args(sft_steps=3))


def _supervisor_that(learning, monkeypatch, run_dir: Path, *, writes: int, code: int):
    """Replaces the supervisor by a process that writes checkpoints up to v``writes`` and
    exits ``code`` (as one that failed to stop an actor after its updates would)."""
    real = learning.subprocess.Popen

    def popen(argv, **kwargs):
        script = (
            "import pathlib, sys\n"
            f"for v in range(1, {writes} + 1):\n"
            f"    d = pathlib.Path({str(run_dir)!r}, 'checkpoints', f'v{{v:06d}}')\n"
            "    d.mkdir(parents=True)\n"
            "    (d / 'DIGEST').write_text('d')\n"
            f"sys.exit({code})\n"
        )
        return real([sys.executable, "-c", script], **kwargs)

    monkeypatch.setattr(learning.subprocess, "Popen", popen)


def test_a_supervisor_that_exits_non_zero_after_its_updates_is_still_measured(
    learning, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _supervisor_that(learning, monkeypatch, run_dir, writes=3, code=1)
    args = argparse.Namespace(minutes=1.0, max_steps=None, drain_timeout=5.0, eval_every=0)
    rl = learning.train(run_dir / "c.yaml", run_dir, args, start_version=0)
    assert rl["exit_code"] == 1
    assert sorted(learning.checkpoints(run_dir)) == [1, 2, 3]  # all among the last few


def test_a_supervisor_that_exits_non_zero_with_no_update_stops_the_bench(
    learning, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _supervisor_that(learning, monkeypatch, run_dir, writes=0, code=1)
    args = argparse.Namespace(minutes=1.0, max_steps=None, drain_timeout=5.0, eval_every=0)
    with pytest.raises(SystemExit, match="exited 1"):
        learning.train(run_dir / "c.yaml", run_dir, args, start_version=0)


def test_the_report_reads_the_arms_beside_a_base_evaluation(learning, tmp_path):
    """bench/results holds learning-base.json (an `agentrl eval --out` report) beside the
    arms' results: the report takes the arms and leaves the evaluation alone."""
    import learning_report

    (tmp_path / "learning-base.json").write_text(json.dumps({"checkpoint": "smollm2"}))
    arm = {"arm": "full", "eval": {}}
    (tmp_path / "learning-full.json").write_text(json.dumps(arm))
    assert list(learning_report.load_results(tmp_path)) == ["full"]


def test_the_signal_table_counts_groups_with_spread_and_flat_drops(learning, tmp_path):
    """From metrics-<arm>.jsonl: groups trained = episodes / group_size per update, with
    spread = that times rollout/groups_with_spread, flat drops summed per task."""
    import learning_report

    updates = [
        {"version": 9, "rollout/episodes": 16, "rollout/groups_with_spread": 0.5,
         "env/db/flat_groups_dropped": 2, "env/db/flat_groups_succeeded": 2,
         "env/os/flat_groups_dropped": 1, "env/os/flat_groups_succeeded": 0,
         "learner/step_time": 300.0, "learner/idle_ratio": 0.1},
        {"version": 10, "rollout/episodes": 16, "rollout/groups_with_spread": 1.0,
         "env/alfworld/flat_groups_dropped": 3, "env/alfworld/flat_groups_succeeded": 0,
         "learner/step_time": 100.0, "learner/idle_ratio": 0.3},
    ]  # fmt: skip
    (tmp_path / "metrics-full.jsonl").write_text("".join(json.dumps(u) + "\n" for u in updates))
    arms = {arm: {"config": {"rollout": {"group_size": 8}}} for arm in ("full", "no-task-norm")}
    table = learning_report.signal_table(tmp_path, arms)
    rows = [line for line in table.splitlines() if line.startswith("| full")]
    assert rows == [
        "| full | 2 | 4 | 3 | 6 | alfworld 3 (0 all-success), db 2 (2 all-success), "
        "os 1 (0 all-success) | 200 | 0.20 |"
    ]
    assert "no-task-norm" not in table  # no metrics file, no row
    assert learning_report.signal_table(tmp_path / "none", arms) == ""


def test_all_arms_share_one_warm_start_and_one_evaluation_of_the_base_model(
    learning, tmp_path, monkeypatch
):
    """`--arm all --eval-base --sft-steps N`: the first arm evaluates the model as shipped
    and makes the warm start; the others reuse both from its run directory."""
    seen = []

    def run_arm(arm, base, args, work):
        seen.append((arm, args.eval_base, args.base_eval, args.warm_start_from))
        return tmp_path / f"learning-{arm}.json"

    monkeypatch.setattr(learning, "run_arm", run_arm)
    monkeypatch.setattr(
        learning,
        "write_report",
        lambda results: argparse.Namespace(
            table="", table_path=results / "t.md", plot_path=results / "p.png"
        ),
    )
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(CFG))
    argv = ["learning.py", "--config", str(config), "--arm", "all", "--eval-base"]
    argv += ["--sft-steps", "2", "--work", str(tmp_path), "--results", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    learning.main()
    first = tmp_path.resolve() / "runs" / "learning-full"
    assert seen == [
        ("full", True, None, None),
        ("no-task-norm", False, first / "eval-base.json", first),
        ("no-cross-policy", False, first / "eval-base.json", first),
    ]


def test_the_reused_warm_start_reports_the_source_arms_sft_seconds(learning, tmp_path):
    """Not the time from its config to its SFT record, which holds its base evaluation too:
    the source arm's results file when there is one, else that time less eval-base.json's."""
    source = _source(tmp_path)
    (source / "eval-base.json").write_text(json.dumps({"seconds": 50.0}))
    cfg = {**CFG, "rollout": ROLLOUT}
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    sft, _ = learning.reuse_warm_start(source, run_dir, cfg, _args(results=tmp_path))
    assert sft["seconds"] == 80.0  # 1130 - 1000 - 50
    (tmp_path / "learning-full.json").write_text(
        json.dumps({"sft": {"version": 2, "seconds": 77.5}})
    )
    run_dir = tmp_path / "runs" / "b"
    run_dir.mkdir(parents=True)
    sft, _ = learning.reuse_warm_start(source, run_dir, cfg, _args(results=tmp_path))
    assert sft["seconds"] == 77.5


def test_the_warm_starts_own_measure_wins_and_a_config_newer_than_the_sft_gives_none(
    learning, tmp_path
):
    """A config copied after the SFT gave -622 s once (rl60-full-s1-60min): no estimate
    then, and the seconds the warm start's arm wrote beside it (`SFT_SECONDS`) first."""
    source = _source(tmp_path)
    os.utime(source.with_suffix(".yaml"), (2000.0, 2000.0))  # after the SFT record (1130 s)
    cfg = {**CFG, "rollout": ROLLOUT}
    run_dir = tmp_path / "runs" / "a"
    run_dir.mkdir(parents=True)
    assert learning.reuse_warm_start(source, run_dir, cfg, _args())[0]["seconds"] is None
    (source / learning.SFT_SECONDS).write_text(json.dumps({"seconds": 313.0}))
    run_dir = tmp_path / "runs" / "b"
    run_dir.mkdir(parents=True)
    assert learning.reuse_warm_start(source, run_dir, cfg, _args())[0]["seconds"] == 313.0
    assert (run_dir / learning.SFT_SECONDS).exists()  # a reuse of the reuse keeps it


def test_the_standard_error_of_the_mean_pass_rate(learning):
    """sqrt(sum p(1-p)/n) / tasks: 0.5 and 0.0 on 32 episodes -> sqrt(0.25/32) / 2."""
    import learning_report

    se = learning_report.mean_standard_error({"a": 0.5, "b": 0.0}, ["a", "b"], 32)
    assert se == pytest.approx(0.0441942, abs=1e-7)
    assert learning_report.mean_standard_error({"a": 0.5}, ["a", "b"], 32) is None


def test_the_report_says_when_the_warm_starts_time_is_unknown(learning):
    import learning_report

    arms = learning_report.load_results(BENCH / "results" / "rl60-full-s1-60min")
    assert "warm start 6 SFT steps in 313 s," in learning_report.markdown_table(arms)
    arms["full"]["sft"]["seconds"] = None
    assert "warm start 6 SFT steps in an unknown time," in learning_report.markdown_table(arms)

"""`write_report` on a synthetic metrics.jsonl, and the `agentrl report` command line."""

from __future__ import annotations

import json
import sys

import pytest

from agentrl.ops import ReportError, write_report
from agentrl.ops.cli import agentrl as cli_agentrl

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def metrics_lines(staleness: bool = True) -> list[dict[str, float]]:
    """12 updates, versions 1..12, two tasks; values chosen so the window means are easy."""
    lines = []
    for v in range(1, 13):
        line = {
            "time": 1000.0 + 10.0 * (v - 1),
            "version": float(v),
            "learner/step_time": float(v),
            "learner/idle_ratio": 0.1,
            "rollout/episodes_per_s": 2.0,
            "env/calc/success": v / 12,
            "env/calc/reward": 2 * v / 12 - 1,
            "env/search/success": 1.0 if v <= 6 else 0.0,
            "env/search/reward": (1.0 if v <= 6 else 0.0) - 0.2,
        }
        if staleness:
            line["staleness/issue_lag_mean"] = float(v % 3)
            line["staleness/token_lag_mean"] = 0.5 * (v % 3)
        lines.append(line)
    return lines


def write_run(tmp_path, lines, name="run"):
    run = tmp_path / name
    run.mkdir()
    text = "\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines)
    (run / "metrics.jsonl").write_text(text + "\n")
    return run


def test_all_plots_and_the_summary_numbers(tmp_path):
    run = write_run(tmp_path, list(reversed(metrics_lines())))  # sorted by version on reading
    files = write_report(run)

    assert files.summary == run / "report" / "summary.md"
    assert set(files.plots) == {"rewards", "staleness", "idle", "throughput"}
    assert files.skipped == {}
    for path in files.plots.values():
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1000, path
    summary = files.summary.read_text()
    # Hand-computed, first 5 updates = versions 1..5, last 5 = versions 8..12:
    # calc success v/12: first (1+2+3+4+5)/5/12 = 0.250, last (8+..+12)/5/12 = 10/12 = 0.833;
    # calc reward 2v/12 - 1: first 2*0.25 - 1 = -0.500, last 2*10/12 - 1 = 0.667;
    # search success 1 for v <= 6 else 0: first 1.000, last 0.000; reward = success - 0.2.
    assert "| calc | 0.250 | 0.833 | -0.500 | 0.667 |" in summary
    assert "| search | 1.000 | 0.000 | 0.800 | -0.200 |" in summary
    assert "updates: 12 (versions 1 to 12)" in summary
    assert "wall time, first to last update: 1m 50s" in summary  # time 1000 .. 1110
    assert "mean learner step time: 6.500 s" in summary  # mean of 1..12
    assert "mean learner idle ratio: 0.100" in summary
    assert "mean episodes/s: 2.000" in summary
    for name in ("rewards", "staleness", "idle", "throughput"):
        assert f"]({name}.png)" in summary


def test_absent_staleness_is_skipped_and_noted(tmp_path):
    run = write_run(tmp_path, metrics_lines(staleness=False))
    out = tmp_path / "out"
    files = write_report(run, out)

    assert "staleness" not in files.plots and not (out / "staleness.png").exists()
    assert set(files.plots) == {"rewards", "idle", "throughput"}
    summary = (out / "summary.md").read_text()
    assert "- staleness: skipped, none of `staleness/issue_lag_mean`" in summary


def test_malformed_line_names_its_number(tmp_path):
    lines = metrics_lines()[:4]
    run = write_run(tmp_path, [lines[0], lines[1], '{"version": 3, "learner/step_', lines[3]])
    with pytest.raises(ReportError, match=r"metrics\.jsonl, line 3: not JSON"):
        write_report(run)
    run = write_run(tmp_path, [lines[0], {"version": 2.0, "learner/loss": "x"}], name="text")
    with pytest.raises(ReportError, match=r"line 2: not a number: learner/loss"):
        write_report(run)


def test_missing_metrics_file(tmp_path):
    with pytest.raises(ReportError, match=r"metrics\.jsonl: no such file"):
        write_report(tmp_path)


def test_missing_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    run = write_run(tmp_path, metrics_lines()[:2])
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ReportError, match=r"pip install 'agentrl\[report\]'"):
        write_report(run)


def test_cli_prints_the_files(tmp_path, capsys):
    run = write_run(tmp_path, metrics_lines(staleness=False)[:3])
    assert cli_agentrl.main(["report", str(run), "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == str(tmp_path / "r" / "summary.md")
    assert str(tmp_path / "r" / "rewards.png") in out.splitlines()
    assert "staleness plot skipped" in err


def test_cli_exit_2_on_a_missing_run_dir(tmp_path, capsys):
    assert cli_agentrl.main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


def test_cross_policy_runs_get_a_turn_lag_panel_per_pool(tmp_path):
    import struct

    def png_height(path):
        return struct.unpack(">I", path.read_bytes()[20:24])[0]  # IHDR height

    plain = write_report(write_run(tmp_path, metrics_lines(), name="plain"))
    lines = metrics_lines()
    for line in lines:
        line["staleness/turn_lag/current"] = 0.5
        line["staleness/turn_lag/stale"] = 1.5
    pools = write_report(write_run(tmp_path, lines, name="pools"))
    one, two = png_height(plain.plots["staleness"]), png_height(pools.plots["staleness"])
    assert two == 2 * one  # a second panel of the same height


def test_a_run_with_one_update_gets_whole_version_ticks(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.ops.report.plots import _line, read_metrics

    run = write_run(tmp_path, metrics_lines()[2:3])  # version 3 only
    rows = read_metrics(run / "metrics.jsonl")
    fig, ax = plt.subplots()
    _line(rows, "learner/idle_ratio", "idle")(ax)
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks

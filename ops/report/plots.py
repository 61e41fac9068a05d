"""Plots and a markdown summary of a run, read from `runs/<run>/metrics.jsonl`.

`write_report(run_dir)` reads one JSON object per learner update (names in
docs/metrics.md; `version` is the x axis) and writes into `run_dir/report/`:

- `rewards.png`: `env/<task>/reward` and `env/<task>/success` per task over versions;
- `staleness.png`: histograms of `staleness/issue_lag_mean` and `staleness/token_lag_mean`
  (and, with cross-policy pools, each pool's `staleness/turn_lag/<pool>` over versions),
  one value per update (each value is already a mean over that update's batch);
- `idle.png`: `learner/idle_ratio` over versions;
- `throughput.png`: `rollout/episodes_per_s` and `learner/step_time` over versions;
- `summary.md`: updates, wall time, per task the mean success and reward of the first 5
  and the last 5 updates (by version), mean step time, idle ratio and episodes/s, and
  links to the plots. A plot whose metrics are all absent is skipped and the summary
  says so.

matplotlib is imported here, inside `write_report`, so that `agentrl eval` and the
supervisor do not need it; each figure is drawn on its own Agg canvas (no pyplot, no
global backend switch).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ReportError", "ReportFiles", "read_metrics", "write_report"]

WINDOW = 5
"""Updates in the "first" and "last" windows of the per-task table."""

Row = dict[str, float]


class ReportError(Exception):
    """Raised when a report cannot be written: no metrics file, a malformed line, no matplotlib."""


@dataclass(frozen=True, slots=True)
class ReportFiles:
    summary: Path
    """The markdown summary."""
    plots: dict[str, Path] = field(default_factory=dict)
    """Plot name (`rewards`, `staleness`, `idle`, `throughput`) -> PNG written."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Plot name -> why it was not drawn (its metrics are absent)."""


def read_metrics(path: Path) -> list[Row]:
    """The updates of a metrics.jsonl, sorted by `version`; blank lines are ignored."""
    if not path.is_file():
        raise ReportError(f"{path}: no such file (a run writes it after its first update)")
    rows: list[Row] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReportError(f"{path}, line {number}: not JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ReportError(f"{path}, line {number}: expected a JSON object")
            bad = [k for k, v in obj.items() if isinstance(v, bool) or not _is_number(v)]
            if bad:
                raise ReportError(f"{path}, line {number}: not a number: {', '.join(bad)}")
            if "version" not in obj:
                raise ReportError(f"{path}, line {number}: no `version`")
            rows.append({k: float(v) for k, v in obj.items()})
    if not rows:
        raise ReportError(f"{path}: no updates")
    return sorted(rows, key=lambda row: row["version"])


def write_report(run_dir: Path, out_dir: Path | None = None) -> ReportFiles:
    """Write the plots and `summary.md` of `run_dir` into `out_dir` (default run_dir/report)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    rows = read_metrics(run_dir / "metrics.jsonl")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ReportError("matplotlib is missing: pip install 'agentrl[report]'") from exc
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    tasks = _tasks(rows)
    pools = sorted(
        {k.split("/")[2] for row in rows for k in row if k.startswith("staleness/turn_lag/")}
    )

    def save(name: str, panels: Sequence[Callable[[Any], None]]) -> Path:
        fig = Figure(figsize=(7, 3.2 * len(panels)), layout="constrained")
        FigureCanvasAgg(fig)
        for i, draw in enumerate(panels, start=1):
            draw(fig.add_subplot(len(panels), 1, i))
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        return path

    plots: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    specs: dict[str, tuple[list[str], list[Callable[[Any], None]]]] = {
        "rewards": (
            [f"env/{t}/{m}" for t in tasks for m in ("reward", "success")],
            [_per_task(rows, tasks, "reward"), _per_task(rows, tasks, "success")],
        ),
        "staleness": (
            ["staleness/issue_lag_mean", "staleness/token_lag_mean"],
            [_histograms(rows, ["staleness/issue_lag_mean", "staleness/token_lag_mean"])]
            + ([_turn_lags(rows, pools)] if pools else []),
        ),
        "idle": (["learner/idle_ratio"], [_line(rows, "learner/idle_ratio", "idle ratio")]),
        "throughput": (
            ["rollout/episodes_per_s", "learner/step_time"],
            [
                _line(rows, "rollout/episodes_per_s", "episodes / s"),
                _line(rows, "learner/step_time", "learner step time (s)"),
            ],
        ),
    }
    for name, (keys, panels) in specs.items():
        if any(_series(rows, k)[0] for k in keys):
            plots[name] = save(name, panels)
        else:
            wanted = ", ".join(f"`{k}`" for k in keys) or "`env/<task>/reward|success`"
            skipped[name] = f"none of {wanted} in metrics.jsonl"
    summary = out / "summary.md"
    summary.write_text(_summary(run_dir, rows, tasks, plots, skipped, out), encoding="utf-8")
    return ReportFiles(summary=summary, plots=plots, skipped=skipped)


_TITLES = {
    "rewards": "reward and success per task over versions",
    "staleness": "staleness: per-update mean issue and token lag",
    "idle": "learner idle ratio over versions",
    "throughput": "episodes/s and learner step time over versions",
}


def _summary(
    run_dir: Path,
    rows: list[Row],
    tasks: list[str],
    plots: dict[str, Path],
    skipped: dict[str, str],
    out: Path,
) -> str:
    times = [row["time"] for row in rows if "time" in row]
    wall = _duration(max(times) - min(times)) if times else "n/a (no `time`)"
    versions = [row["version"] for row in rows]
    lines = [
        f"# Report: {run_dir.name}",
        "",
        f"- updates: {len(rows)} (versions {versions[0]:g} to {versions[-1]:g})",
        f"- wall time, first to last update: {wall}",
        f"- mean learner step time: {_mean(rows, 'learner/step_time', ' s')}",
        f"- mean learner idle ratio: {_mean(rows, 'learner/idle_ratio')}",
        f"- mean episodes/s: {_mean(rows, 'rollout/episodes_per_s')}",
        "",
        f"## Per task: mean of the first {WINDOW} vs the last {WINDOW} updates",
        "",
    ]
    if tasks:
        first, last = rows[:WINDOW], rows[-WINDOW:]
        lines += [
            "| task | success first | success last | reward first | reward last |",
            "|---|---|---|---|---|",
        ]
        for t in tasks:
            cells = [
                _mean(window, f"env/{t}/{m}")
                for m in ("success", "reward")
                for window in (first, last)
            ]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    else:
        lines.append("No `env/<task>/...` metrics.")
    lines += ["", "## Plots", ""]
    for name, title in _TITLES.items():
        if name in plots:
            lines.append(f"- [{title}]({plots[name].relative_to(out).as_posix()})")
        else:
            lines.append(f"- {name}: skipped, {skipped[name]}")
    return "\n".join(lines) + "\n"


def _version_axis(ax: Any) -> None:
    """Label the x axis "version" and tick it at whole versions only (a run with one update
    would otherwise get ticks at 2.8, 3.0, 3.2)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("version")
    low, high = ax.get_xlim()
    if high - low < 2:  # one update: widen to the versions on either side
        middle = round((low + high) / 2)
        ax.set_xlim(middle - 1, middle + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _per_task(rows: list[Row], tasks: list[str], metric: str) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        for t in tasks:
            xs, ys = _series(rows, f"env/{t}/{metric}")
            if xs:
                ax.plot(xs, ys, marker=".", label=t)
        _version_axis(ax)
        ax.set_ylabel(metric)
        ax.set_title(f"env/<task>/{metric}")
        if metric == "success":
            ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        if tasks:
            ax.legend(loc="best", fontsize="small")

    return draw


def _turn_lags(rows: list[Row], pools: list[str]) -> Callable[[Any], None]:
    """Per sampler pool, the mean version lag of its turns over versions (cross-policy)."""

    def draw(ax: Any) -> None:
        for pool in pools:
            xs, ys = _series(rows, f"staleness/turn_lag/{pool}")
            if xs:
                ax.plot(xs, ys, marker=".", label=pool)
        _version_axis(ax)
        ax.set_ylabel("turn lag (versions)")
        ax.set_title("staleness/turn_lag/<pool>: how old each pool's turns were")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")

    return draw


def _histograms(rows: list[Row], keys: list[str]) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        series = {key: _series(rows, key)[1] for key in keys}
        every = [v for values in series.values() for v in values]
        bins = min(20, max(5, len(every) // 4))
        span = (min(every), max(every)) if every and min(every) < max(every) else None
        for key, values in series.items():  # same bins for both, so the bars line up
            if values:
                ax.hist(values, bins=bins, range=span, alpha=0.6, label=key)
        ax.set_xlabel("lag in versions (one value per update: the batch's mean)")
        ax.set_ylabel("updates")
        ax.set_title("staleness: distribution of per-update means")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")

    return draw


def _line(rows: list[Row], key: str, label: str) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker=".")
        else:
            ax.text(0.5, 0.5, f"no {key}", ha="center", va="center", transform=ax.transAxes)
        _version_axis(ax)
        ax.set_ylabel(label)
        ax.set_title(key)
        ax.grid(alpha=0.3)

    return draw


def _tasks(rows: list[Row]) -> list[str]:
    names = set()
    for row in rows:
        for key in row:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "env" and parts[2] in ("reward", "success"):
                names.add(parts[1])
    return sorted(names)


def _series(rows: list[Row], key: str) -> tuple[list[float], list[float]]:
    pairs = [(row["version"], row[key]) for row in rows if key in row and math.isfinite(row[key])]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _mean(rows: list[Row], key: str, unit: str = "") -> str:
    values = _series(rows, key)[1]
    return f"{statistics.fmean(values):.3f}{unit}" if values else "n/a"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)

"""The learning benchmark's report: a markdown table and a plot from its per-arm JSON files.

    python bench/learning.py --report      # reads bench/results/learning-<arm>.json

Table: per task, each arm's test pass rate of the model as shipped (``base``, with
``--eval-base``), before RL (after the warm start) and after RL, and the change RL made;
the last row is the mean over tasks. With the arms' ``metrics-<arm>.jsonl``, a second
table says where their updates found a signal (``signal_table``). Plot
(``learning.png``): one panel per task and one for the mean, test pass rate against
learner version, one line per arm (solid: evaluated checkpoints; dotted: the training
episodes' success per update from metrics.jsonl).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ReportFiles",
    "load_results",
    "markdown_table",
    "mean_standard_error",
    "paired_table",
    "signal_table",
    "write_report",
]


@dataclass(frozen=True)
class ReportFiles:
    table: str
    """The markdown table (also written to ``table_path``)."""
    table_path: Path
    plot_path: Path


def load_results(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``learning-<arm>.json`` under ``results``, by arm, in file-name order (an
    ``agentrl eval --out`` report there, such as ``learning-base.json``, is not an arm)."""
    found = {}
    for path in sorted(results.glob("learning-*.json")):
        data = json.loads(path.read_text())
        if "arm" in data:
            found[data["arm"]] = data
    if not found:
        raise SystemExit(f"no learning-<arm>.json in {results}: run bench/learning.py first")
    return found


def _tasks(arms: dict[str, dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for data in arms.values():
        names += [t for t in data["after"] if t not in names]
    return names


def markdown_table(arms: dict[str, dict[str, Any]]) -> str:
    """Per task: before, after and the change of each arm; the mean over tasks last."""
    tasks = _tasks(arms)
    cols = ("base", "before", "after", "Δ")
    head = ["task"] + [f"{arm} {col}" for arm in arms for col in cols]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]

    def cells(arm: dict[str, Any], task: str | None) -> list[str]:
        def value(which: str) -> float | None:
            rates = arm.get(which) or {}
            if task is not None:
                return rates.get(task)
            return (
                statistics.fmean(rates[t] for t in tasks)
                if all(t in rates for t in tasks)
                else None
            )

        base, before, after = value("base"), value("before"), value("after")
        shown = "n/a" if base is None else f"{base:.3f}"
        if before is None or after is None:
            return [shown] + ["n/a"] * 3
        return [shown, f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}"]

    for task in [*tasks, None]:
        row = [task or "**mean**"] + [c for data in arms.values() for c in cells(data, task)]
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    for arm, data in arms.items():
        sft = data["sft"]
        n = data["eval_settings"]["episodes"] * data["eval_settings"]["runs"]
        errors = [mean_standard_error(data.get(w) or {}, tasks, n) for w in ("before", "after")]
        se = (
            f"; binomial standard error of the mean: before ±{errors[0]:.3f}, after "
            f"±{errors[1]:.3f}"
            if None not in errors
            else ""
        )
        took = "an unknown time" if sft["seconds"] is None else f"{sft['seconds']:.0f} s"
        warm = f"warm start {sft['steps']} SFT steps in {took}, " if sft["steps"] else ""
        notes.append(
            f"- {arm}: {warm}RL {data['rl']['updates']} updates in {data['rl']['seconds']:.0f} s "
            f"(budget {data['budget_minutes']:g} min, {data['rl']['stopped_by']}); "
            f"base = the model as shipped, before = v{data['before_version']} (after the warm "
            f"start, if any), after = v{data['after_version']}; "
            f"test split, {data['eval_settings']['episodes']} episodes x "
            f"{data['eval_settings']['runs']} runs per task; seed {data['seeds']['run']}{se}"
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def mean_standard_error(rates: dict[str, float], tasks: list[str], n: int) -> float | None:
    """Binomial standard error of the mean pass rate over ``tasks``, each rate measured on
    ``n`` episodes: sqrt(sum p(1-p)/n) / len(tasks); None when a task has no rate."""
    if not tasks or n <= 0 or not all(t in rates for t in tasks):
        return None
    return math.sqrt(sum(rates[t] * (1 - rates[t]) / n for t in tasks)) / len(tasks)


def bfcl_table(arms: dict[str, dict[str, Any]]) -> str:
    """BFCL (held out) per category and BFCL's summaries: the model as shipped, before RL
    (shared by the arms when they share a warm start) and each arm after RL; "" when no arm
    has a BFCL evaluation."""
    from agentrl.environments.tasks.bfcl.leaderboard import summaries

    with_bfcl = {arm: data["bfcl"] for arm, data in arms.items() if data.get("bfcl")}
    if not with_bfcl:
        return ""
    columns: dict[str, dict[str, Any]] = {}
    for arm, bfcl in with_bfcl.items():
        for which in ("base", "before"):  # shown once when the arms share it
            if which in bfcl and bfcl[which] not in columns.values():
                columns[which if which not in columns else f"{which} ({arm})"] = bfcl[which]
        if "after" in bfcl:
            columns[f"{arm} after"] = bfcl["after"]
    categories: list[str] = []
    for column in columns.values():
        categories += [c for c in column["accuracy"] if c not in categories]
    head = ["BFCL category", "entries", *columns]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for category in categories:
        entries = {c["entries"].get(category) for c in columns.values()} - {None}
        cells = [f"{c['accuracy'][category]:.3f}" if category in c["accuracy"] else "n/a"
                 for c in columns.values()]  # fmt: skip
        shown = "/".join(map(str, sorted(entries)))
        lines.append(f"| {category} | {shown} | " + " | ".join(cells) + " |")
    scored = [
        summaries({k: (v, c["entries"][k]) for k, v in c["accuracy"].items()})
        for c in columns.values()
    ]
    for name in scored[0]:
        cells = ["N/A" if s[name] is None else f"{s[name][0]:.3f}" for s in scored]
        if any(c != "N/A" for c in cells):
            lines.append(f"| **{name}** |  | " + " | ".join(cells) + " |")
    note = next(iter(columns.values()))["argv"]
    return "\n".join(lines) + f"\n\n- BFCL: `{' '.join(note)}` (per checkpoint)\n"


def _metrics(results: Path, arm: str) -> list[dict[str, Any]]:
    """``metrics-<arm>.jsonl`` (the arm's run metrics, one line per update, read as
    ``agentrl report`` reads a run's); [] if absent."""
    from agentrl.ops.report.plots import read_metrics

    path = results / f"metrics-{arm}.jsonl"
    return read_metrics(path) if path.exists() else []


def signal_table(results: Path, arms: dict[str, dict[str, Any]]) -> str:
    """Where the arms' updates found a learning signal, from ``metrics-<arm>.jsonl``: per arm,
    the GRPO groups trained and how many had reward spread (a flat group's advantage is 0),
    the flat groups dynamic sampling dropped instead (``learner.drop_flat_groups``), and
    the learner's seconds per update and idle share; "" when no arm has its metrics."""
    lines = []
    for arm, data in arms.items():
        rows = _metrics(results, arm)
        if not rows:
            continue
        size = data["config"]["rollout"]["group_size"]
        groups = spread = 0
        dropped: dict[str, list[int]] = {}  # task -> [flat groups dropped, of them all-success]
        for row in rows:
            n = round(row.get("rollout/episodes", 0) / size)
            groups += n
            spread += round(row.get("rollout/groups_with_spread", 0.0) * n)
            for key, value in row.items():
                if key.startswith("env/") and key.endswith("/flat_groups_dropped"):
                    task = key[len("env/") : -len("/flat_groups_dropped")]
                    won = row.get(f"env/{task}/flat_groups_succeeded", 0)
                    counts = dropped.setdefault(task, [0, 0])
                    counts[0] += round(value)
                    counts[1] += round(won)
        flat = ", ".join(f"{t} {d} ({w} all-success)" for t, (d, w) in sorted(dropped.items()))
        step = statistics.fmean(r["learner/step_time"] for r in rows if "learner/step_time" in r)
        idle = [r["learner/idle_ratio"] for r in rows if "learner/idle_ratio" in r]
        lines.append(
            f"| {arm} | {len(rows)} | {groups} | {spread} | "
            f"{sum(d for d, _ in dropped.values())} | {flat or '-'} | {step:.0f} | "
            f"{statistics.fmean(idle) if idle else float('nan'):.2f} |"
        )
    if not lines:
        return ""
    head = (
        "| arm | updates | groups trained | with reward spread | flat groups dropped | "
        "dropped by task | learner s/update | learner idle |"
    )
    align = "|---|---:|---:|---:|---:|---|---:|---:|"
    return "\n".join([head, align, *lines]) + "\n"


def _training_by_task(data: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Training success per update, entries of the same task averaged: task -> [(v, s)]."""
    task_of = {
        key: (entry or {}).get("task") or key for key, entry in data["config"]["tasks"].items()
    }
    out: dict[str, list[tuple[int, float]]] = {}
    for row in data["training"]:
        per_task: dict[str, list[float]] = {}
        for key, value in row.items():
            entry = key[len("env/") : -len("/success")] if key.startswith("env/") else None
            if entry in task_of:
                per_task.setdefault(task_of[entry], []).append(value)
        for task, values in per_task.items():
            out.setdefault(task, []).append((int(row["version"]), statistics.fmean(values)))
    return out


def plot(arms: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    tasks = _tasks(arms)
    panels = [*tasks, "mean"]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, data) in enumerate(arms.items()):
        color = colors[i % len(colors)]
        versions = sorted(int(v) for v in data["eval"])
        training = _training_by_task(data)
        for ax, task in zip(axes.flat, panels, strict=False):
            if task == "mean":
                ys = [
                    statistics.fmean(data["eval"][str(v)]["pass_rate"][t] for t in tasks)
                    for v in versions
                ]
            else:
                ys = [data["eval"][str(v)]["pass_rate"].get(task, float("nan")) for v in versions]
            ax.plot(versions, ys, "o-", color=color, label=f"{arm} (test)")
            if task in training:
                xs, ts = zip(*training[task], strict=True)
                ax.plot(xs, ts, ":", color=color, alpha=0.6, label=f"{arm} (training)")
    for ax, task in zip(axes.flat, panels, strict=False):
        ax.set_title(task)
        ax.set_xlabel("learner version")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole versions
        ax.set_ylabel("success")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paired_table(arms: dict[str, dict[str, Any]]) -> str:
    """Per arm and task, RL's change on the same test instances with its paired-bootstrap
    95% interval (`agentrl compare`), and the mean over tasks; arms whose results predate
    the kept outcomes are left out."""
    from agentrl.ops.eval.compare import compare_reports

    lines = [
        "| arm | task | instances | before | after | Δ | 95% CI (paired bootstrap) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, arm in arms.items():
        evals = arm.get("eval", {})
        before = evals.get(str(arm["before_version"]), {}).get("outcomes")
        after = evals.get(str(arm["after_version"]), {}).get("outcomes")
        if not (before and after):
            continue
        comparison = compare_reports(before, after, resamples=10_000, seed=0)
        for c in (*comparison.tasks, comparison.mean):
            task = "**mean**" if c is comparison.mean else c.task
            lines.append(
                f"| {name} | {task} | {c.instances} | {c.before:.3f} | {c.after:.3f} | "
                f"{c.delta:+.3f} | [{c.low:+.3f}, {c.high:+.3f}] |"
            )
    if len(lines) == 2:
        return ""
    return "\n".join(lines) + "\n"


def write_report(results: Path) -> ReportFiles:
    """Write ``learning.md`` and ``learning.png`` into ``results``."""
    arms = load_results(results)
    table = markdown_table(arms)
    paired = paired_table(arms)
    if paired:
        table += "\n" + paired
    signal = signal_table(results, arms)
    if signal:
        table += "\n" + signal
    bfcl = bfcl_table(arms)
    if bfcl:
        table += "\n" + bfcl
    table_path, plot_path = results / "learning.md", results / "learning.png"
    table_path.write_text(table)
    plot(arms, plot_path)
    return ReportFiles(table, table_path, plot_path)

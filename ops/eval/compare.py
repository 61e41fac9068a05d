"""Paired comparison of two evaluations of the same instances: `agentrl compare A.json B.json`.

Two `agentrl eval --out` results (`EvalReport` JSON) are compared instance by instance:
for each task both must have evaluated the same instances (same task options, hence the
same split, and the same episode count), and an instance's score is the share of runs in
which it succeeded (``solved_per_instance / runs``). Per task:

    Δ_task = mean_i (after_i - before_i)

and over the tasks both evaluated, the unweighted mean of the tasks' means (the
"five-task mean" of the learning bench), Δ_mean = mean_task Δ_task.

Intervals: a paired bootstrap over instances (``resamples`` draws, seeded): each draw
resamples each task's instances with replacement, the same indices for before and after,
and recomputes Δ_task and Δ_mean; the 95% interval is the 2.5th and 97.5th percentiles.
Pairing removes the instance-to-instance variance that two unpaired samples of pass
rates carry: what is left is the change itself plus sampling noise within instances.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CompareError", "Comparison", "TaskChange", "compare_reports", "format_comparison"]


class CompareError(ValueError):
    """Raised when two reports cannot be compared pairwise (one line per problem)."""


@dataclass(frozen=True)
class TaskChange:
    task: str
    instances: int
    """Instances evaluated in both reports."""
    before: float
    after: float
    delta: float
    low: float
    """2.5th percentile of the bootstrap Δ."""
    high: float
    """97.5th percentile of the bootstrap Δ."""


@dataclass(frozen=True)
class Comparison:
    tasks: tuple[TaskChange, ...]
    mean: TaskChange
    """The unweighted mean over tasks (``instances``: their sum)."""
    resamples: int


def instance_scores(report: dict[str, Any], task: str) -> np.ndarray:
    """``[episodes]`` share of runs in which each instance succeeded."""
    result = report["tasks"][task]
    return np.asarray(result["solved_per_instance"], dtype=np.float64) / result["runs"]


def load_report(path: str | Path) -> dict[str, Any]:
    """An `agentrl eval` JSON result; CompareError with the reason when it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CompareError(f"{path}: cannot read an eval result ({exc})") from exc
    if not isinstance(report, dict) or not isinstance(report.get("tasks"), dict):
        raise CompareError(f"{path}: not an `agentrl eval --out` result (no 'tasks')")
    return report


def compare_reports(
    before: dict[str, Any], after: dict[str, Any], *, resamples: int = 10_000, seed: int = 0
) -> Comparison:
    """The paired comparison of ``after`` against ``before`` (module docstring)."""
    common = [t for t in before["tasks"] if t in after["tasks"]]
    problems = []
    if not common:
        problems.append("the two results share no task")
    for task in common:
        b, a = before["tasks"][task], after["tasks"][task]
        if b["options"] != a["options"]:
            problems.append(
                f"{task}: evaluated with other options ({b['options']} vs {a['options']})"
            )
        if b["episodes"] != a["episodes"]:
            problems.append(f"{task}: {b['episodes']} instances against {a['episodes']}")
    if problems:
        raise CompareError("; ".join(problems))
    rng = np.random.default_rng(seed)
    diffs = {t: instance_scores(after, t) - instance_scores(before, t) for t in common}
    draws = {
        t: d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
        for t, d in diffs.items()
    }
    changes = []
    for task in common:
        b, a = instance_scores(before, task), instance_scores(after, task)
        low, high = (float(x) for x in np.percentile(draws[task], [2.5, 97.5]))
        delta = float(diffs[task].mean())
        changes.append(TaskChange(task, len(b), float(b.mean()), float(a.mean()), delta, low, high))
    mean_draws = np.mean([draws[t] for t in common], axis=0)
    low, high = np.percentile(mean_draws, [2.5, 97.5])
    mean = TaskChange(
        "mean",
        sum(c.instances for c in changes),
        float(np.mean([c.before for c in changes])),
        float(np.mean([c.after for c in changes])),
        float(np.mean([c.delta for c in changes])),
        float(low),
        float(high),
    )
    return Comparison(tuple(changes), mean, resamples)


def format_comparison(comparison: Comparison, before: str, after: str) -> str:
    """A markdown table: per task and the mean, before, after, Δ and its 95% interval."""
    lines = [
        f"before: {before}",
        f"after:  {after}",
        "",
        "| task | instances | before | after | Δ | 95% CI (paired bootstrap) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in (*comparison.tasks, comparison.mean):
        name = f"**{c.task}**" if c is comparison.mean else c.task
        lines.append(
            f"| {name} | {c.instances} | {c.before:.3f} | {c.after:.3f} | {c.delta:+.3f} | "
            f"[{c.low:+.3f}, {c.high:+.3f}] |"
        )
    lines.append("")
    lines.append(f"{comparison.resamples} bootstrap resamples of the instances, paired.")
    return "\n".join(lines) + "\n"

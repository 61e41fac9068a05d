"""BFCL's leaderboard table from per-category accuracies.

The summary rows follow bfcl-eval's ``generate_leaderboard_csv``
(``eval_checker/eval_runner_helper.py``, which cannot be imported without pandas and every
provider SDK): Non-Live AST is the unweighted mean of simple (itself the unweighted mean
of simple_python, simple_java and simple_javascript), multiple, parallel and
parallel_multiple; Live AST the mean of its four categories weighted by entries;
Multi-Turn the unweighted mean of its four; Irrelevance the unweighted mean of
irrelevance and live_irrelevance. BFCL shows a summary as N/A when one of its categories
was not run, and so does this table.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentrl.environments.tasks.bfcl.data import CATEGORIES, entries

__all__ = ["format_leaderboard", "summaries"]

Score = tuple[float, int]
"""(accuracy, entries run) of one category."""


def _unweighted(scores: list[Score | None]) -> Score | None:
    if any(s is None for s in scores):
        return None
    return sum(s[0] for s in scores) / len(scores), sum(s[1] for s in scores)


def _weighted(scores: list[Score | None]) -> Score | None:
    if any(s is None for s in scores):
        return None
    total = sum(s[1] for s in scores)
    return sum(s[0] * s[1] for s in scores) / total, total


_PARTS = {
    "Non-Live AST": ("simple_python", "simple_java", "simple_javascript", "multiple",
                     "parallel", "parallel_multiple"),
    "Non-Live simple": ("simple_python", "simple_java", "simple_javascript"),
    "Live AST": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
    "Multi-Turn": tuple(c for c in CATEGORIES if c.startswith("multi_turn")),
    "Irrelevance": ("irrelevance", "live_irrelevance"),
    "Relevance": ("live_relevance",),
}  # fmt: skip
"""The categories of each summary."""


def summaries(scores: Mapping[str, Score]) -> dict[str, Score | None]:
    """BFCL's summary scores (None: a category of it was not run)."""
    get = scores.get
    simple = _unweighted([get("simple_python"), get("simple_java"), get("simple_javascript")])
    return {
        "Non-Live AST": _unweighted(
            [simple, get("multiple"), get("parallel"), get("parallel_multiple")]
        ),
        "Non-Live simple": simple,
        "Live AST": _weighted(
            [
                get("live_simple"),
                get("live_multiple"),
                get("live_parallel"),
                get("live_parallel_multiple"),
            ]
        ),
        "Multi-Turn": _unweighted([get(c) for c in CATEGORIES if c.startswith("multi_turn")]),
        "Irrelevance": _unweighted([get("irrelevance"), get("live_irrelevance")]),
        "Relevance": get("live_relevance"),
    }


def format_leaderboard(scores: Mapping[str, Score], title: str = "BFCL") -> str:
    """A markdown table: each category run (accuracy, entries run of the category's), then
    the summaries of which a category was run (N/A unless all of its were)."""
    lines = [f"| {title} category | accuracy | entries |", "|---|---:|---:|"]
    for category in CATEGORIES:
        if category in scores:
            accuracy, n = scores[category]
            lines.append(f"| {category} | {accuracy:.3f} | {n}/{len(entries(category))} |")
    for name, score in summaries(scores).items():
        if score is None and not any(c in scores for c in _PARTS[name]):
            continue  # nothing of it was run
        shown = "N/A" if score is None else f"**{score[0]:.3f}**"
        lines.append(f"| **{name}** | {shown} | {'' if score is None else score[1]} |")
    return "\n".join(lines) + "\n"

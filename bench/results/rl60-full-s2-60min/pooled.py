"""The full arm's two seeds pooled: each instance's before and after are the shares of the
two seeds' runs that solved it (runs = 2), compared pairwise as `agentrl compare` does
(paired bootstrap over instances, `agentrl.ops.eval.compare`). The interval holds the
instances' sampling and the episodes' noise; with two training seeds it cannot hold the
seed-to-seed spread of the training itself (read the two seeds' own tables beside it).

    python bench/results/rl60-full-s2-60min/pooled.py
"""

import copy
import json
from pathlib import Path

from agentrl.ops.eval.compare import compare_reports, format_comparison

RESULTS = Path(__file__).resolve().parents[1]
SEEDS = {  # results directory: (before, after) evaluations
    "rl60-full-s1-60min": ("eval-v000006.json", "eval-v000017.json"),
    "rl60-full-s2-60min": ("eval-v000006.json", "eval-v000018.json"),
}


def pooled(which: int) -> dict:
    reports = [json.loads((RESULTS / d / files[which]).read_text()) for d, files in SEEDS.items()]
    out = copy.deepcopy(reports[0])
    for task, result in out["tasks"].items():
        parts = [r["tasks"][task] for r in reports]
        if any(p["episodes"] != result["episodes"] for p in parts):
            raise SystemExit(f"{task}: the seeds evaluated other instance counts")
        result["runs"] = sum(p["runs"] for p in parts)
        result["solved_per_instance"] = [
            sum(s) for s in zip(*(p["solved_per_instance"] for p in parts), strict=True)
        ]
    return out


print(
    format_comparison(
        compare_reports(pooled(0), pooled(1)), "before (both seeds)", "after (both seeds)"
    )
)

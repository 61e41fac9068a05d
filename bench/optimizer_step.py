"""AdamW's step as the learner runs it (fused) against torch's default (foreach): peak memory
and time per step, each way in a process of its own.

    python bench/optimizer_step.py [--params-m 134] [--steps 3] [--threads 2]
    python bench/optimizer_step.py --smoke    # 8M parameters: seconds (CI)

The default foreach step builds a full transient copy of a moment while it updates (a
7B float32 model: +30 GB at the step's peak); the fused step updates in place. Each way
prints its peak RSS above the weights, gradients and moments it holds, and its seconds
per step; then the ratios fused / foreach.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def one_way(way: str, params_m: int, steps: int, threads: int) -> dict:
    """Run in a fresh process: the peak RSS of one way, undisturbed by the other's."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    side = 4096
    count = max(1, round(params_m * 1e6 / (side * side)))
    rows = max(1, round(params_m * 1e6 / count / side))
    params = [torch.nn.Parameter(torch.randn(rows, side)) for _ in range(count)]
    for p in params:
        p.grad = torch.randn_like(p)
    options = {"fused": True} if way == "fused" else {"foreach": True}
    optimizer = torch.optim.AdamW(params, lr=1e-3, **options)
    held = 4 * sum(p.numel() for p in params) * 4  # weights, gradients, two moments
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    seconds = (time.perf_counter() - start) / steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "way": way,
        "params": sum(p.numel() for p in params),
        "held": held,
        "peak": peak,
        "before": before,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params-m", type=int, default=134, help="millions of parameters")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="8M parameters, 1 step")
    parser.add_argument("--way", help=argparse.SUPPRESS)  # the child process's way
    args = parser.parse_args()
    if args.smoke:
        args.params_m, args.steps = 8, 1
    if args.way:
        print(json.dumps(one_way(args.way, args.params_m, args.steps, args.threads)))
        return
    results = {}
    for way in ("foreach", "fused"):
        child = [sys.executable, __file__, "--way", way, "--params-m", str(args.params_m)]
        child += ["--steps", str(args.steps), "--threads", str(args.threads)]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        results[way] = json.loads(out.strip().splitlines()[-1])
    mib = 1 << 20
    for way, r in results.items():
        # ru_maxrss covers the whole process: tensors held + the first step's allocation of
        # the moments + the step's transients; what a way adds is its peak over "held"
        extra = r["peak"] - r["held"]
        print(
            f"{way}: {r['params'] / 1e6:.0f}M parameters, holds {r['held'] / mib:.0f} MiB, "
            f"peak RSS {r['peak'] / mib:.0f} MiB (+{extra / mib:.0f} MiB), "
            f"{r['seconds'] * 1000:.0f} ms per step"
        )
    fused, foreach = results["fused"], results["foreach"]
    print(
        f"ratio fused / foreach: peak RSS {fused['peak'] / foreach['peak']:.2f}, "
        f"time per step {fused['seconds'] / foreach['seconds']:.2f}"
    )


if __name__ == "__main__":
    main()

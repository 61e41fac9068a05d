"""`trace_profile.py`'s update (shared prompt + bfloat16 compute, the first GROUPS groups of the
seed-2 full arm's trace, 2 threads) profiled with its ops' input shapes: the costliest ops by
own time, then the matrix products and elementwise ops by shape (which micro-batch rows,
which weights). epyc-zen4-trace5-head-profile.txt was run so, with GROUPS 5:

    PYTHONPATH=bench:bench/results/learner-step \\
        python bench/results/learner-step/trace_profile_shapes.py 5
"""

import dataclasses
import sys
import time

import torch
from device_cpu_profile import shared_prompt_learner
from learner_step import traced_batch
from torch.profiler import ProfilerActivity, profile

from agentrl.trainer import resolve_model

torch.set_num_threads(2)
batch = traced_batch("bench/results/rl60-full-s2-60min/trace.sqlite", int(sys.argv[1]))
learner = shared_prompt_learner(resolve_model("smollm2"), bf16_compute=True)
scored = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    t = time.perf_counter()
    learner.step(scored)
    print("step", time.perf_counter() - t, flush=True)
print(
    prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50)
)
ka = prof.key_averages(group_by_input_shape=True)
rows = sorted(
    [
        e
        for e in ka
        if e.key
        in (
            "aten::mul",
            "aten::div",
            "aten::where",
            "aten::pow",
            "aten::copy_",
            "aten::add",
            "aten::sum",
            "aten::cat",
            "aten::silu",
            "aten::mm",
        )
    ],
    key=lambda e: -e.self_cpu_time_total,
)[:40]
for e in rows:
    print(
        f"{e.key:14s} {e.self_cpu_time_total / 1e6:7.2f}s calls {e.count:6d} "
        f"shapes {str(e.input_shapes)[:150]}"
    )

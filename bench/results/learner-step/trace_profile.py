"""CPU op profile of one shared-prompt + bfloat16-compute update on real episodes: the first
GROUPS whole groups of the seed-2 full arm's trace store (`bench/learner_step.py`'s
``traced_batch``), real SmolLM2 weights, micro-batches of 2,048 tokens, 2 threads
(epyc-zen4-trace5-profile.txt was run so, with GROUPS 5):

    PYTHONPATH=bench python bench/results/learner-step/trace_profile.py GROUPS
"""

import dataclasses
import sys
import time

import torch
from learner_step import traced_batch
from torch.profiler import ProfilerActivity, profile

from agentrl.trainer import TorchLearner, resolve_model

torch.set_num_threads(2)
batch = traced_batch("bench/results/rl60-full-s2-60min/trace.sqlite", int(sys.argv[1]))
learner = TorchLearner(
    resolve_model("smollm2"),
    micro_batch_tokens=2048,
    gradient_checkpointing=False,
    share_prefix=True,
    bf16_compute=True,
    device="cpu",
)
scored = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
start = time.perf_counter()
learner.step(scored)
print("step", time.perf_counter() - start, flush=True)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    learner.step(scored)
table = prof.key_averages().table(
    sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60
)
print(table, flush=True)

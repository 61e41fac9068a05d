"""CPU op profile of one shared-prompt + bfloat16-compute update on real episodes: the first
GROUPS whole groups of the seed-2 full arm's trace store (`bench/learner_step.py`'s
``traced_batch``), real SmolLM2 weights, micro-batches of 2,048 tokens, 2 threads
(epyc-zen4-trace5-profile.txt was run so, with GROUPS 5; the learner and the profile are
`device_cpu_profile.py`'s):

    PYTHONPATH=bench python bench/results/learner-step/trace_profile.py GROUPS
"""

import dataclasses
import sys
import time

import torch
from device_cpu_profile import print_profiled_step, shared_prompt_learner
from learner_step import traced_batch

from agentrl.trainer import resolve_model

torch.set_num_threads(2)
batch = traced_batch("bench/results/rl60-full-s2-60min/trace.sqlite", int(sys.argv[1]))
learner = shared_prompt_learner(resolve_model("smollm2"), bf16_compute=True)
scored = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
start = time.perf_counter()
learner.step(scored)
print("step", time.perf_counter() - start, flush=True)
print_profiled_step(learner, scored, rows=40)

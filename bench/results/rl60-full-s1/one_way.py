"""One update of the torch learner on the 5 real groups of this run, in a process of its
own: the update's seconds (after scoring the batch) and the process's peak RSS.

    python bench/results/rl60-full-s1/one_way.py shared   # or: ckpt
"""

import dataclasses
import resource
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/, for learner_step
from learner_step import traced_batch  # noqa: E402

from agentrl.trainer import TorchLearner, resolve_model  # noqa: E402

way = sys.argv[1]
torch.set_num_threads(2)
batch = traced_batch(HERE / "trace.sqlite", 5)
learner = TorchLearner(
    resolve_model("smollm2"),
    micro_batch_tokens=2048,
    autocast=True,
    share_prefix=way == "shared",
    gradient_checkpointing=way == "ckpt",
)
batch = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
t0 = time.perf_counter()
metrics = learner.step(batch)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{way}: {seconds:.1f} s, peak RSS {peak:.2f} GB, tokens {metrics['learner/tokens']:.0f}")

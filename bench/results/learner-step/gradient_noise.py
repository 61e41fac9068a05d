"""How far the bfloat16 ways' first gradient is from float32's, against how far the batch's
own sampling moves it: one update batch of a run (`bench/learner_step.py`'s ``traced_batch``,
``--trace-update``), SmolLM2's real weights, 2 threads, the learner of
`device_cpu_profile.py`'s profiles (micro-batches of 2,048 tokens, the shared prompt).

Float32 (shared prompt + copies once: the same logprobs as today's float32, its update
0.0002-0.0003 of its size apart) gives each group's gradient alone, ``g_i`` (its token-mean loss),
and the whole batch's, ``g``. The batch's loss is the token mean over every group, so
``g = sum_i T_i g_i / T`` (``T_i`` group i's trained tokens): checked, as the cosine of that
sum to the directly computed ``g``. Then, every figure a cosine to ``g``:

- each bfloat16 way's gradient of the whole batch (each way scores the batch's logprobs
  itself first, as `learner_step.py` does, so every way's first ratio is 1);
- the batch without group i (``sum_{j != i} T_j g_j``), for each i: what one group fewer
  would have changed;
- the batch's groups resampled with replacement (2,000 draws): the spread of the gradient
  over batches like this one.

    PYTHONPATH=bench:bench/results/learner-step python \
        bench/results/learner-step/gradient_noise.py TRACE UPDATE
"""

import dataclasses
import sys
import time

import torch
from device_cpu_profile import shared_prompt_learner
from learner_step import traced_batch

from agentrl.trainer import TorchLearner, resolve_model

torch.set_num_threads(2)
torch.manual_seed(0)
batch = traced_batch(sys.argv[1], 0, "trained", int(sys.argv[2]))
model_dir = resolve_model("smollm2")
groups = sorted(set(batch.group_index.tolist()))
WAYS = {  # label -> TorchLearner keywords
    "float32 (shared prompt + copies once)": dict(),
    "shared prompt + copies once + bf16 compute": dict(bf16_compute=True),
    "shared prompt + copies once + bf16 autocast": dict(autocast=True),
}


def gradient(learner: TorchLearner, part) -> torch.Tensor:
    """The flat float32 gradient of ``part``'s token-mean loss (no optimiser step)."""
    learner.optimizer.zero_grad(set_to_none=True)
    learner.accumulate_gradients(part)
    flat = torch.cat([p.grad.reshape(-1) for p in learner.model.parameters()])
    learner.optimizer.zero_grad(set_to_none=True)
    return flat


rows_of = [torch.nonzero(batch.group_index == g).flatten() for g in groups]
trained = torch.tensor([float(batch.loss_mask[r].sum()) for r in rows_of], dtype=torch.float64)
task_of = [batch.tasks[int(batch.task_index[r[0]])] for r in rows_of]
vectors, labels = [], []
for label, how in WAYS.items():
    start = time.perf_counter()
    learner = shared_prompt_learner(model_dir, **how)  # copies once: the default
    scored = dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))
    vectors.append(gradient(learner, scored))
    labels.append(label)
    if not how:  # float32: each group alone too
        for g, rows in zip(groups, rows_of, strict=True):
            vectors.append(gradient(learner, scored.select(rows)))
            labels.append(f"group {g}")
    print(f"{label}: {time.perf_counter() - start:.0f} s", flush=True)
    del learner

V = torch.stack(vectors)
del vectors
gram = torch.zeros(len(V), len(V), dtype=torch.float64)
for lo in range(0, V.shape[1], 1 << 22):
    chunk = V[:, lo : lo + (1 << 22)].double()
    gram += chunk @ chunk.T
full, per_group = 0, list(range(1, 1 + len(groups)))  # indices into V
bf16_ways = [i for i, label in enumerate(labels) if "bf16" in label]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos of two combinations of V's rows (coefficient vectors)."""
    return float(a @ gram @ b / ((a @ gram @ a) * (b @ gram @ b)).sqrt())


def unit(i: int) -> torch.Tensor:
    e = torch.zeros(len(V), dtype=torch.float64)
    e[i] = 1.0
    return e


def from_groups(weights: torch.Tensor) -> torch.Tensor:
    c = torch.zeros(len(V), dtype=torch.float64)
    c[per_group] = weights * trained
    return c


g = unit(full)
print(f"batch: {batch.num_rows} episodes, {len(groups)} groups, {batch.num_tokens} trained tokens")
summed = cosine(from_groups(torch.ones(len(groups), dtype=torch.float64)), g)
print(f"check: cos(sum of the groups' gradients, the batch's) = {summed:.6f}")
for i in bf16_ways:
    print(f"{labels[i]}: cos to float32's = {cosine(unit(i), g):.5f}")
for k, (grp, task) in enumerate(zip(groups, task_of, strict=True)):
    w = torch.ones(len(groups), dtype=torch.float64)
    w[k] = 0.0
    own = cosine(unit(per_group[k]), g)
    print(
        f"without group {grp} ({task}, {int(trained[k])} trained tokens): cos to the batch's = "
        f"{cosine(from_groups(w), g):.5f}; the group's own gradient {own:+.3f}"
    )
draws = torch.multinomial(torch.ones(len(groups)), 2000 * len(groups), replacement=True)
draws = draws.view(2000, len(groups))
boot = torch.tensor(
    [cosine(from_groups(torch.bincount(d, minlength=len(groups)).double()), g) for d in draws],
    dtype=torch.float64,
)
q = torch.quantile(boot, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
print(
    f"groups resampled (2000 draws): cos to the batch's median {q[1]:.4f}, 5%-95% "
    f"[{q[0]:.4f}, {q[2]:.4f}], above the worst bfloat16 way's in "
    f"{float((boot > min(cosine(unit(i), g) for i in bf16_ways)).double().mean()):.1%} of draws"
)

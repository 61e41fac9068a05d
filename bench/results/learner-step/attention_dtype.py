"""CPU flash attention (torch SDPA), forward and backward, in float32 against bfloat16, at the
learner's shapes: SmolLM2's 9 heads of 64, n rows of q queries past a shared prompt of
`past` keys (the explicit mask of the shared path), or one causal row. Best of 3, 2 threads.
    python bench/results/learner-step/attention_dtype.py
"""

import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)


def run(dtype, n, q, past, masked, reps=3):
    H, D = 9, 64  # (the 3 key-value heads expanded to 9, as HF's sdpa does on the CPU)
    g = torch.Generator().manual_seed(0)
    qq = torch.randn(n, H, q, D, generator=g).to(dtype).requires_grad_()
    k = torch.randn(n, H, past + q, D, generator=g).to(dtype).requires_grad_()
    v = torch.randn(n, H, past + q, D, generator=g).to(dtype).requires_grad_()
    if masked:
        m = (
            torch.ones(q, past + q, dtype=torch.bool)
            .tril(diagonal=past)[None, None]
            .expand(n, 1, q, past + q)
        )
        kw = dict(attn_mask=m)
    else:
        kw = dict(is_causal=True)
    best_f = best_b = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(qq, k, v, **kw)
        t1 = time.perf_counter()
        o.sum().backward()
        t2 = time.perf_counter()
        best_f = min(best_f, t1 - t0)
        best_b = min(best_b, t2 - t1)
    return best_f, best_b


for n, q, past in [(8, 1002, 455), (4, 330, 770), (1, 1100, 0)]:
    for masked in [True] if past else [False]:
        r32 = run(torch.float32, n, q, past, masked)
        r16 = run(torch.bfloat16, n, q, past, masked)
        f32, b16 = sum(r32) * 1e3, sum(r16) * 1e3
        print(
            f"n={n} q={q} past={past} masked={masked}: "
            f"fp32 fwd {r32[0] * 1e3:.0f} bwd {r32[1] * 1e3:.0f} ms; "
            f"bf16 fwd {r16[0] * 1e3:.0f} bwd {r16[1] * 1e3:.0f} ms; "
            f"bf16/fp32 total {b16 / f32:.2f}"
        )

"""float32 against bfloat16 matrix products on this CPU, 2 threads, SmolLM2's linear shapes at
2,048 positions (epyc-zen4-gemm.txt was run so):

    python bench/results/learner-step/gemm_rate.py
"""

import time

import torch

torch.set_num_threads(2)
for m, k, n in ((2048, 576, 1536), (2048, 1536, 576), (2048, 576, 576)):
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(3):
            a @ b
        start, repeats = time.perf_counter(), 20
        for _ in range(repeats):
            a @ b
        seconds = (time.perf_counter() - start) / repeats
        print(m, k, n, dtype, f"{2 * m * k * n / seconds / 1e9:.0f} GFLOP/s")

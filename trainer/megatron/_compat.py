"""megatron-core on CPU: one shim for the CUDA calls megatron-core 0.16 hard-codes.

megatron-core assumes a GPU in a handful of places even when every tensor is on the
CPU: it seeds and forks "CUDA" RNG states, moves the RoPE frequencies to
``torch.cuda.current_device()``, builds the causal mask with ``device="cuda"``,
allocates its global memory buffer (used by attention) on the current CUDA
device, and so on. The layers themselves are plain torch and run on CPU over gloo.

:func:`ensure_cpu_compat` redirects exactly those calls, all here:

1. **Module-scoped torch.** In each megatron module listed in ``_CUDA_MODULES`` the
   global name ``torch`` is replaced by :class:`_CpuTorch`, a stand-in that
   forwards everything to torch except that ``device="cuda"`` (or a CUDA device
   index) in tensor factories becomes the CPU, and ``torch.cuda`` answers
   ``current_device()`` with ``"cpu"``, ``synchronize()`` with nothing, and its RNG
   calls with the CPU generator's. Nothing outside those modules sees a change.
2. **RNG tracker.** ``tensor_parallel.random._get_cuda_rng_state`` and
   ``_set_cuda_rng_state`` read and write the CPU generator (on a CPU-only torch the
   original setter queues a lazy CUDA call and silently does nothing). With (1)
   the tracker's ``add``/``fork`` and ``model_parallel_cuda_manual_seed`` then seed
   and swap the CPU generator: TP ranks get distinct states, as on GPU.
3. **Tied embeddings with PP > 1.** ``LanguageModule.setup_embeddings_and_output_layer``
   moves the last stage's copy of the embedding to CUDA before the all-reduce that
   syncs it with the first stage; the wrapper runs the original without that step
   and does the all-reduce on the CPU tensor.
4. **Grad clipping.** ``clip_grad_by_total_norm_fp32`` asserts grads are
   ``torch.cuda.FloatTensor``; the replacement scales CPU float32 grads in place.

The patches apply once per process, for a learner on the CPU (`init_parallel` with
a CPU device); a CUDA learner runs megatron-core unpatched.
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any

import torch

_LOCK = threading.Lock()
_APPLIED = False

_CUDA_MODULES: dict[str, str] = {
    # module -> what its hard-coded CUDA call is for
    "megatron.core.utils": "GlobalMemoryBuffer.get_tensor (attention's matmul buffer), "
    "local_multi_tensor_l2_norm (grad norm without apex)",
    "megatron.core.transformer.utils": "get_default_causal_mask / sliding-window mask",
    "megatron.core.models.common.embeddings.rotary_pos_embedding": "RoPE inv_freq placement "
    "at init and its move to the GPU on the first forward",
    "megatron.core.tensor_parallel.random": "RNG tracker: torch.cuda.get_rng_state / "
    "manual_seed in add() and model_parallel_cuda_manual_seed",
    "megatron.core.tensor_parallel.mappings": "all-gather/reduce-scatter output buffers "
    "(sequence parallel)",
    "megatron.core.tensor_parallel.layers": "sequence-parallel gather buffers, weight init "
    "on the current device",
    "megatron.core.pipeline_parallel.schedules": 'total_num_tokens = torch.zeros(device="cuda")',
    "megatron.core.pipeline_parallel.p2p_communication": "tensor-shape exchange buffers, "
    "receive buffers, torch.cuda.synchronize after p2p",
    "megatron.core.optimizer.clip_grads": "grad-norm reduction buffers and overflow flags",
}


def _to_cpu_device(device: Any) -> Any:
    """A CUDA device (string, torch.device or index) as the CPU; anything else as is."""
    if device is None:
        return None
    if isinstance(device, int):
        return torch.device("cpu")
    parsed = torch.device(device)
    return torch.device("cpu") if parsed.type == "cuda" else device


def _factory(fn):
    def on_cpu(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    on_cpu.__name__ = fn.__name__
    on_cpu.__doc__ = f"torch.{fn.__name__} with a CUDA device redirected to the CPU."
    return on_cpu


class _CpuCuda(types.ModuleType):
    """``torch.cuda`` as seen by a patched megatron module: device and RNG on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.set_rng_state(new_state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)


_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "randn", "rand")


class _CpuTorch(types.ModuleType):
    """``torch`` as seen by a patched megatron module (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _cpu_get_rng_state(
    device: Any = "cuda", clone: bool = False, graph_safe: bool = False
) -> torch.Tensor:
    """The CPU generator's state, standing in for the CUDA generator's."""
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _cpu_set_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False):
    """Set the CPU generator's state, standing in for the CUDA generator's."""
    torch.set_rng_state(new_state)


def _patch_embedding_sync() -> None:
    from megatron.core.models.common.language_module.language_module import LanguageModule

    original = LanguageModule.setup_embeddings_and_output_layer

    def setup_embeddings_and_output_layer(self) -> None:
        """The original, with the first/last stage embedding all-reduce done on the CPU."""
        # Shadow _is_in_embd_group so the original skips its `.cuda()` + all-reduce.
        in_group = self._is_in_embd_group
        self._is_in_embd_group = lambda: False
        try:
            original(self)
        finally:
            del self._is_in_embd_group
        shared = self.share_embeddings_and_output_weights or getattr(
            self.config, "mtp_num_layers", 0
        )
        if (
            shared
            and self.config.pipeline_model_parallel_size > 1
            and torch.distributed.is_initialized()
            and in_group()
        ):
            weight = self.shared_embedding_or_output_weight()
            torch.distributed.all_reduce(weight.data, group=self.embd_group)

    LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer


def _cpu_clip_grad_by_total_norm_fp32(
    parameters, max_norm, total_norm, use_decoupled_grad=False
) -> None:
    """Scale float32 CPU grads in place so their total norm is at most ``max_norm``."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for param in parameters:
            grad = getattr(param, attr, None)
            if grad is not None:
                grad.detach().mul_(clip_coeff)


def _patch_clip_grads() -> None:
    from megatron.core.optimizer import clip_grads

    # The code object is swapped rather than the module attribute, so that callers who
    # imported the function by name (megatron.core.optimizer.optimizer, or a learner that
    # imported it before this shim ran) get the CPU version too. The signature is the same;
    # the body only needs `torch`, which the clip_grads module has.
    clip_grads.clip_grad_by_total_norm_fp32.__code__ = _cpu_clip_grad_by_total_norm_fp32.__code__


def ensure_cpu_compat() -> None:
    """Make megatron-core 0.16 run on CPU (gloo); idempotent.

    `init_parallel` calls it for a learner on the CPU only (also on a machine with
    GPUs); a CUDA learner runs megatron-core as it is.

    Patches, in this module only, the CUDA-only paths listed in the module docstring:
    module-scoped ``torch`` in ``_CUDA_MODULES`` (device="cuda" allocations,
    ``current_device``, ``synchronize``, CUDA RNG calls), the RNG tracker's state
    get/set, the tied-embedding sync across pipeline stages and grad clipping.
    """
    global _APPLIED
    with _LOCK:
        if _APPLIED:
            return
        cpu_torch = _CpuTorch()
        for name in _CUDA_MODULES:
            module = importlib.import_module(name)
            if getattr(module, "torch", None) is not torch:
                raise RuntimeError(f"{name} has no module-level `import torch` to redirect")
            module.torch = cpu_torch
        from megatron.core.tensor_parallel import random as tp_random

        tp_random._get_cuda_rng_state = _cpu_get_rng_state
        tp_random._set_cuda_rng_state = _cpu_set_rng_state
        _patch_embedding_sync()
        _patch_clip_grads()
        _APPLIED = True

"""Where tensors live: the one place a device name becomes a ``torch.device``.

Every component that computes (the torch learner, the Megatron ranks, the
torch sampler engine) takes a device *name* from the run config and calls
:func:`resolve_device` once, at construction; everything it allocates later
follows the device of its own weights. Names:

- ``cpu``: the CPU (the default everywhere).
- ``cuda`` / ``cuda:N``: a CUDA GPU (``cuda`` = the current one, ``cuda:0`` unless set).
- ``auto``: ``cuda`` when torch sees a CUDA device, else ``cpu``.

:func:`device_problem` checks a name's *spelling* (config validation: a node
without a GPU may validate a config whose GPU roles run elsewhere);
:func:`resolve_device` also checks that the device is there and raises
:class:`DeviceUnavailable` with one clear line when it is not.

:func:`rank_device` is the device of one distributed rank: ``cuda:LOCAL_RANK``
(modulo the GPUs visible) for a CUDA learner, the CPU otherwise.

:func:`bfloat16_speed` says whether a device computes bfloat16 matrix products faster
than float32 ones, which decides ``learner.autocast: auto`` (`use_bfloat16`). CPUs differ
by a factor of several hundred: bfloat16 products ran ~8x float32's speed on a Xeon with
AMX, 2.1-2.8x on a Zen 4 EPYC (``avx512_bf16``), and 0.01-0.03x on a Zen 3 EPYC (AVX2
only: oneDNN has no bfloat16 path there and torch falls back to a reference kernel; 1-2
against 74-124 GFLOP/s, bench/results/learner-step/epyc-zen3-gemm.txt).
"""

from __future__ import annotations

import functools
import re
import time
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    import torch

__all__ = [
    "BFLOAT16_MIN_SPEEDUP",
    "DEVICE_NAMES",
    "DeviceUnavailable",
    "bfloat16_note",
    "bfloat16_speed",
    "device_problem",
    "rank_device",
    "resolve_device",
    "use_bfloat16",
]

log = structlog.get_logger(__name__)

DEVICE_NAMES = "cpu, cuda, cuda:N or auto"
"""How the accepted names are listed in error messages."""

_PATTERN = re.compile(r"^(cpu|auto|cuda(:\d+)?)$")


class DeviceUnavailable(RuntimeError):
    """Raised when a config asks for a device this process cannot see (no CUDA, bad index)."""


def device_problem(name: object) -> str | None:
    """Why ``name`` is not a device name agentrl accepts, or None (spelling only)."""
    if not isinstance(name, str) or not _PATTERN.match(name):
        return f"{name!r} is not a device (use {DEVICE_NAMES})"
    return None


def resolve_device(name: str | torch.device) -> torch.device:
    """The ``torch.device`` for ``name``; raises ValueError (spelling) or DeviceUnavailable."""
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    problem = device_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.__version__
        raise DeviceUnavailable(
            f"device {name!r}: torch {build} sees no CUDA device "
            "(a CPU build of torch, no GPU, or CUDA_VISIBLE_DEVICES empty); use cpu or auto"
        )
    device = torch.device(name)
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceUnavailable(f"device {name!r}: only {count} CUDA device(s) visible")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def rank_device(name: str, local_rank: int) -> torch.device:
    """The device of distributed rank ``local_rank`` on its node for a learner on ``name``.

    CPU learners: the CPU. CUDA learners: GPU ``local_rank`` modulo the GPUs
    visible (one rank per GPU is the intended layout; an explicit ``cuda:N``
    puts rank 0 on N and the others after it).
    """
    import torch

    base = resolve_device(name)
    if base.type != "cuda":
        return base
    count = torch.cuda.device_count()
    return torch.device("cuda", (base.index + local_rank) % count)


BFLOAT16_MIN_SPEEDUP = 1.2
"""``auto`` takes bfloat16 where its matrix products run at least this many times float32's
speed: below it, the lost precision buys too little time."""


def bfloat16_speed(device: str | torch.device) -> float:
    """How many times float32's speed bfloat16 matrix products run at on ``device`` (once per
    process and device). A CUDA device that supports bfloat16: ``inf`` (tensor cores; not
    timed); one that does not: 0. A CPU: measured on a 256 x 576 x 1,536 product (the shape
    of a SmolLM2 projection), the best of 3 after a warm-up each; 0 where torch's oneDNN has
    no bfloat16 path (AVX2-only x86), whose reference kernel runs 40-120x slower than float32."""
    return _bfloat16_speed(str(resolve_device(device)))


@functools.cache
def _bfloat16_speed(name: str) -> float:
    import torch

    device = torch.device(name)
    if device.type == "cuda":
        return float("inf") if torch.cuda.is_bf16_supported(including_emulation=False) else 0.0
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return 0.0
    seconds = {dtype: _matmul_seconds(dtype) for dtype in (torch.float32, torch.bfloat16)}
    return seconds[torch.float32] / seconds[torch.bfloat16]


def _matmul_seconds(dtype) -> float:
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 576, generator=gen).to(dtype)
    b = torch.randn(576, 1536, generator=gen).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.mm(a, b)
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(4):
                torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    return best


def bfloat16_note(speed: float) -> str:
    """`bfloat16_speed`'s value in words, for log lines and benchmarks."""
    if speed == 0.0:
        return (
            "no bfloat16 matrix path here (a CPU without AVX-512 or AMX: 40-120x slower; "
            "or a GPU without bfloat16)"
        )
    return f"bfloat16 matrix products at {speed:.2f}x float32's speed"


def use_bfloat16(setting: bool | str, device: str | torch.device, *, what: str) -> bool:
    """Whether ``what`` (``learner.autocast``, a sampler engine, ...) runs in bfloat16 on
    ``device`` under ``setting``: true, false or ``auto`` (true where `bfloat16_speed` is at
    least `BFLOAT16_MIN_SPEEDUP`). True on a device where bfloat16 is slower than float32
    is obeyed, with a warning saying by how much."""
    if setting is False:
        return False
    speed = bfloat16_speed(device)
    fast = speed >= BFLOAT16_MIN_SPEEDUP
    said = dict(what=what, device=str(device), speed_vs_float32=round(speed, 2))
    said["why"] = bfloat16_note(speed)
    if setting == "auto":
        log.info("bfloat16 auto", chosen="bfloat16" if fast else "float32", **said)
        return fast
    if speed < 1.0:
        log.warning("bfloat16 is slower than float32 here: set it to auto or false", **said)
    return True

"""GPU figures: the torch engine against HF `generate`, learner seconds per update, memory.

    python bench/gpu.py [--device cuda] [--model DIR | --model-source DIR] [--layers N]
    python bench/gpu.py --smoke     # tiny model on the CPU, seconds (CI)

Prints what it ran on (device, torch, CUDA), then:

1. **Sampler**: `bench/sampler_throughput.py` on the same device, model and dtype, once
   per ``--requests`` value in float32, and in bfloat16 at the largest: TorchEngine
   against `transformers` `generate` on the same prompts, every generation forced to
   full length, single-turn and agent-episode workloads (that script's docstring says
   how each side runs).
2. **Learner**: seconds per GRPO update of `TorchLearner` (policy forward and backward,
   the KL reference's forward, AdamW) in float32, in bfloat16 (weights, AdamW state and
   compute in bfloat16), under bfloat16 autocast (float32 masters), and under autocast on
   episodes whose groups of 4 share their first 70% (the shared prompt forwarded once,
   `learner.share_prefix`) at two batch sizes (``--batches``: EPISODESxTOKENS, 12% of
   each episode's tokens trained, as `bench/learner_step.py` builds them), the median
   of ``--repeats`` updates after one warm-up, and the peak GPU memory of each.
3. **Megatron**: seconds per update of `MegatronLearner` (TP = PP = DP = 1, float32) at
   the first batch size, and its peak memory.

The model: ``--model`` (a model directory or spec), or a randomly initialised model of
the shape and tokenizer in ``--model-source`` (config and tokenizer files; default the
converted ``smollm2``), built by `write_random_model`; ``--layers`` makes it shallower.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentrl.trainer import TorchLearner, resolve_device, resolve_model
from agentrl.trainer._models import write_random_model

sys.path.insert(0, str(Path(__file__).parent))
from learner_step import synthetic_batch

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or auto")
    parser.add_argument("--model", help="a model directory or spec (default: a random one)")
    parser.add_argument("--model-source", help="config + tokenizer of the random model")
    parser.add_argument("--layers", type=int, help="depth of the random model")
    parser.add_argument("--requests", default="16,64", help="sampler concurrency values")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="8x1100,64x2048", help="learner batch sizes")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--skip", default="", help="comma list of: sampler, learner, megatron")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.model, args.requests, args.new_tokens = "cpu", "tiny", "4", 8
        args.batches, args.repeats, args.micro_batch_tokens = "2x96,4x96", 1, 4096
    device = resolve_device(args.device)
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model(args, Path(tmp))
        _header(device, model_dir)
        if "sampler" not in skip:
            counts = [int(r) for r in args.requests.split(",")]
            for requests in counts:  # bfloat16 at the largest concurrency only
                for dtype in ("float32", "bfloat16") if requests == max(counts) else ("float32",):
                    _sampler(args, device, model_dir, requests, dtype)
        batches = [tuple(map(int, b.split("x"))) for b in args.batches.split(",")]
        if "learner" not in skip:
            for episodes, tokens in batches:
                for dtype in ("float32", "bfloat16", "autocast", "autocast+shared"):
                    _learner(args, device, model_dir, episodes, tokens, dtype)
        if "megatron" not in skip:
            _megatron(args, device, model_dir, *batches[0])


def _model(args, tmp: Path) -> Path:
    if args.model:
        return resolve_model(args.model)
    source = args.model_source or resolve_model("smollm2")
    return write_random_model(source, tmp / "model", seed=0, num_hidden_layers=args.layers)


def _header(device: torch.device, model_dir: Path) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        where = f"CPU, {os.cpu_count()} cores"
    print(f"device: {device} ({where}); torch {torch.__version__}", flush=True)
    print(
        f"model: {cfg.model_type}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}",
        flush=True,
    )


def _sampler(args, device, model_dir: Path, requests: int, dtype: str) -> None:
    argv = [
        sys.executable,
        str(HERE / "sampler_throughput.py"),
        "--model",
        str(model_dir),
        "--device",
        str(device),
        "--dtype",
        dtype,
        "--requests",
        str(requests),
        "--new-tokens",
        str(args.new_tokens),
    ]
    if args.smoke:
        argv.append("--smoke")
        argv[argv.index("--model") + 1] = "tiny"
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        if re.match(r"(single turn|agent episodes): ", line):
            print(f"sampler {dtype} {requests} requests, {line}", flush=True)


def _learner(args, device, model_dir: Path, episodes: int, tokens: int, mode: str) -> None:
    """``mode``: float32, bfloat16 (weights and AdamW), autocast (float32 masters, bfloat16
    compute), autocast+shared (autocast on episodes whose groups of 4 share their first 70%,
    each group's prompt forwarded once)."""
    vocab = _vocab(model_dir)
    shared = 0.7 if mode == "autocast+shared" else 0.0
    batch = synthetic_batch(episodes, tokens, 4, 0.12, vocab, shared=shared)
    _reset_peak(device)
    learner = TorchLearner(
        model_dir,
        device=str(device),
        dtype="bfloat16" if mode == "bfloat16" else "float32",
        autocast=mode.startswith("autocast"),
        micro_batch_tokens=args.micro_batch_tokens,
    )
    seconds = _time_steps(learner, batch, args.repeats, device)
    print(
        f"learner torch {mode} {episodes}x{tokens}: {seconds:.3f} s per update, "
        f"peak {_peak(device)}",
        flush=True,
    )
    del learner
    _release(device)


def _megatron(args, device, model_dir: Path, episodes: int, tokens: int) -> None:
    try:
        from agentrl.trainer.megatron import MegatronLearner
    except ImportError as exc:  # the megatron extra is optional
        print(f"megatron: not run ({exc})", flush=True)
        return
    batch = synthetic_batch(episodes, tokens, 4, 0.12, _vocab(model_dir))
    _reset_peak(device)
    learner = MegatronLearner(
        model_dir, device=str(device), micro_batch_tokens=args.micro_batch_tokens
    )
    try:
        seconds = _time_steps(learner, batch, args.repeats, device)
    finally:
        learner.close()
    print(
        f"learner megatron float32 {episodes}x{tokens}: {seconds:.3f} s per update, "
        f"peak {_peak(device)}",
        flush=True,
    )
    _release(device)


def _time_steps(learner, batch, repeats: int, device) -> float:
    learner.step(batch)  # warm-up (kernel selection, allocator)
    seconds = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        learner.step(batch)
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _vocab(model_dir: Path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir).vocab_size


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device) -> str:
    if device.type != "cuda":
        return "n/a (CPU)"
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"


def _release(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""The compute of a run's roles from its config: the sampler engines of its pools, the
learner backend, and the torch threads each compute process of a node gets.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from agentrl.actors import SamplerEngine, TorchEngine
from agentrl.actors.engines.vllm.engine import VLLMEngine
from agentrl.trainer import LearnerBackend, LoraSpec, TorchLearner, resolve_model

from ..config.schema import RunConfig
from ..sft.warm_start import kl_reference

__all__ = [
    "megatron_backend",
    "node_torch_threads",
    "torch_backend",
    "torch_engine",
    "torch_pool_engine",
    "vllm_pool_engine",
]


def torch_engine(
    weights: Path,
    version: int,
    max_batch: int,
    *,
    dtype: str,
    seed: int,
    prefix_cache_tokens: int = 16384,
    device: str = "cpu",
) -> SamplerEngine:
    """The torch sampler engine on `weights` and `device`, its generations labelled `version`.

    The signature (after the keywords are bound) is the `make_engine` of
    `Supervisor` and of `evaluate`.
    """
    return TorchEngine(
        weights,
        device=device,
        max_batch=max_batch,
        dtype=dtype,
        seed=seed,
        version=version,
        prefix_cache_tokens=prefix_cache_tokens,
    )


def torch_pool_engine(
    cfg: RunConfig,
    weights: Path,
    version: int,
    max_batch: int,
    *,
    prefix_cache_tokens: int,
    device: str,
) -> SamplerEngine:
    """A pool's torch engine (``engine: torch``), in the learner's engine dtype."""
    return torch_engine(
        weights,
        version,
        max_batch,
        device=device,
        dtype=cfg.learner.engine_dtype(device),
        seed=cfg.seed,
        prefix_cache_tokens=prefix_cache_tokens,
    )


def vllm_pool_engine(
    cfg: RunConfig, weights: Path, version: int, max_batch: int, *, device: str
) -> SamplerEngine:
    """A pool's vLLM engine (``engine: vllm``)."""
    ln = cfg.learner  # the learner's dtype (docs/engines.md)
    return VLLMEngine(
        weights,
        device=device,
        dtype=ln.engine_dtype(device),
        max_batch=max_batch,
        seed=cfg.seed,
        version=version,
    )


def _update_args(cfg: RunConfig, version: int) -> dict:
    """The settings every learner backend takes alike: the update's maths, the run's
    seed and version, the KL reference and where the optimiser state goes."""
    ln = cfg.learner
    return dict(
        lr=ln.lr,
        weight_decay=ln.weight_decay,
        grad_clip=ln.grad_clip,
        temperature=cfg.rollout.temperature,
        clip_low=ln.clip_low,
        clip_high=ln.clip_high,
        dual_clip=ln.dual_clip,
        kl_coef=ln.kl_coef,
        is_cap=ln.is_cap,
        warmup_steps=ln.warmup_steps,
        micro_batch_tokens=ln.micro_batch_tokens,
        device=ln.device,
        dtype=ln.dtype,
        seed=cfg.seed,
        version=version,
        reference_dir=kl_reference(cfg.run_dir, resolve_model(cfg.model)),
        state_dir=cfg.run_dir / "learner_state",  # AdamW state, for an exact resume
    )


def torch_backend(cfg: RunConfig, weights: Path, version: int) -> LearnerBackend:
    """The torch learner (``learner.backend: torch``) on `weights` at `version`."""
    ln = cfg.learner
    return TorchLearner(
        weights,
        gradient_checkpointing=ln.gradient_checkpointing,
        autocast=ln.autocast_on(),
        bf16_compute=ln.bf16_compute_on(),  # (it and bfloat16 weights warn where slow)
        share_prefix=ln.share_prefix,
        dedup_rows=ln.dedup_rows,
        lora=None if ln.lora is None else LoraSpec(**asdict(ln.lora)),
        **_update_args(cfg, version),
    )


def megatron_backend(
    cfg: RunConfig, weights: Path, version: int, *, threads: int
) -> LearnerBackend:
    """MegatronLearner: rank 0 here, the other TP x PP x DP ranks as worker processes."""
    from agentrl.trainer.megatron import MegatronLearner

    ln = cfg.learner
    return MegatronLearner(
        weights,
        tp=ln.megatron.tp,
        pp=ln.megatron.pp,
        dp=ln.megatron.dp,
        state_every=ln.megatron.state_every,
        keep_states=ln.megatron.keep_states,
        threads=threads,
        **_update_args(cfg, version),
    )


def node_torch_threads(cfg: RunConfig, roles: tuple[str, ...]) -> int:
    """Intra-op threads per compute process: this node's cores / (engines + learner ranks).

    torch's default (every core in every process) oversubscribes the cores as soon
    as an engine and the learner share a node, and each then runs several times slower.
    """
    engines = sum(p.replicas for p in cfg.pools.values()) if "sampler" in roles else 0
    ln = cfg.learner
    learners = ln.megatron.world if ln.backend == "megatron" else 1
    compute = engines + (learners if "learner" in roles else 0)
    return max(1, (os.cpu_count() or 1) // max(compute, 1))

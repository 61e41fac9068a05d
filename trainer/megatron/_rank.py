"""One rank of the Megatron backend: its model shard, frozen reference, AdamW and update.

Every process of the layout runs a `RankTrainer`: rank 0 inside `MegatronLearner`
(`._learner`), ranks 1.. in the worker processes (`._worker`), each on its shard of the
``tp * pp * dp`` layout. It loads the HF weights into a megatron-core GPTModel, resumes
from the state of its version (`._state`), runs the update (`._update`) and writes the HF
checkpoint (gathered to rank 0) and, every ``state_every`` updates, the resumable state.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

from .._backend import DIGEST_FILE, TOKENIZER_FILES
from .._batch import TrainBatch
from .._device import rank_device
from .._digest import checkpoint_digest
from .._learner_state import updates_done, warmup_lr
from ._convert import gather_hf_state, load_hf_into
from ._launch import MegatronSpec
from ._model import build_gpt_model, destroy_parallel, init_parallel
from ._state import latest_state, load_state, save_state, state_path
from ._update import LossSettings, MegatronUpdate

__all__ = ["RankTrainer"]

log = structlog.get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

CONFIG_FILES = ("config.json", "generation_config.json")
"""HF files copied from the source model directory into each checkpoint."""


def read_hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files of an HF model directory."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def _recompute_core_attention(model: torch.nn.Module) -> None:
    """Megatron's selective recompute of core attention, on every attention layer.

    The local (unfused) attention keeps its ``[b, heads, s, s]`` scores and
    probabilities for backward: ~4 GB per rank for SmolLM2 on a 4096-token
    micro-batch, most of the learner's memory. Recomputing them in backward
    (``recompute_granularity="selective"``, which layers read at build time)
    costs one more attention forward and changes no number.
    """
    from megatron.core.transformer.attention import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.checkpoint_core_attention = True


class RankTrainer:
    """One rank's model shard, frozen reference, AdamW and update (every rank has one).

    Expects the process group to exist; sets up Megatron's model-parallel groups.
    """

    def __init__(self, spec: MegatronSpec) -> None:
        from transformers import AutoConfig

        if spec.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {spec.dtype!r}")
        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.spec = spec
        self.model_dir = Path(spec.model_dir)
        self.version = spec.version
        self.steps = 0
        torch.manual_seed(spec.seed)
        self.device = rank_device(spec.device, dist.get_rank())
        init_parallel(spec.tp, spec.pp, seed=spec.seed, device=str(self.device))
        self.hf_config = AutoConfig.from_pretrained(self.model_dir)
        dtype = _DTYPES[spec.dtype]
        hf_state = read_hf_state(self.model_dir)
        self.model = build_gpt_model(self.hf_config, dtype=dtype, device=self.device)
        load_hf_into(self.model, hf_state, self.hf_config)
        self.model.train()
        _recompute_core_attention(self.model)
        reference = None
        if spec.kl_coef > 0 and spec.objective == "grpo":  # the SFT loss has no KL term
            if spec.reference_dir is not None and Path(spec.reference_dir) != self.model_dir:
                hf_state = read_hf_state(Path(spec.reference_dir))
            reference = build_gpt_model(self.hf_config, dtype=dtype, device=self.device)
            load_hf_into(reference, hf_state, self.hf_config)
            reference.eval().requires_grad_(False)
        del hf_state
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=spec.lr,
            betas=spec.betas,
            weight_decay=spec.weight_decay,
        )
        self.update = MegatronUpdate(
            self.model,
            reference,
            self.optimizer,
            LossSettings(
                temperature=spec.temperature,
                clip_low=spec.clip_low,
                clip_high=spec.clip_high,
                dual_clip=spec.dual_clip,
                kl_coef=spec.kl_coef,
                vocab_size=self.hf_config.vocab_size,
                objective=spec.objective,
                is_cap=spec.is_cap,
            ),
            grad_clip=spec.grad_clip,
            micro_batch_tokens=spec.micro_batch_tokens,
        )
        self._resume()

    def _resume(self) -> None:
        """Load the state of update ``version`` if there is one; drop newer (orphan) states."""
        if self.spec.state_dir is None:
            return
        root = Path(self.spec.state_dir)
        if dist.get_rank() == 0:
            root.mkdir(parents=True, exist_ok=True)
            for path in root.glob("v*"):
                newer = path.name[1:].split(".")[0]
                if newer.isdigit() and int(newer) > self.version:
                    # Written after the last HF checkpoint: that update was never
                    # announced, so its trajectories will be trained again.
                    log.warning("orphan learner state removed", path=str(path))
                    shutil.rmtree(path)
        dist.barrier()
        path = state_path(root, self.version)
        if (path / "metadata.json").exists():
            load_state(path, self.model, self.optimizer)
            return
        older = latest_state(root, at_most=self.version)
        if self.version > 0:
            log.warning(
                "no learner state for this version: AdamW moments start from zero",
                version=self.version,
                newest_state=older[0] if older else None,
            )

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """The GRPO update (collective); metrics are the same on every rank.

        An empty batch changes no weight but advances the version, as in TorchLearner.
        """
        lr = warmup_lr(self.spec.lr, updates_done(self.optimizer), self.spec.warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics, stepped = self.update.step(batch, self.version)
        self.version += 1
        if stepped:
            self.steps += 1
            metrics["learner/lr"] = lr
        else:
            log.warning("empty_batch", rows=batch.num_rows)
        return metrics

    def save(self, out_dir: str | Path) -> str | None:
        """HF checkpoint on rank 0 (+ the resumable state when due); digest on rank 0."""
        hf_state = gather_hf_state(self.model, self.hf_config)
        digest = None
        if hf_state is not None:
            digest = self._write_hf(Path(out_dir), hf_state)
        dist.barrier()
        spec = self.spec
        if spec.state_dir is not None and self.version % spec.state_every == 0:
            save_state(
                spec.state_dir, self.version, self.model, self.optimizer, keep=spec.keep_states
            )
        return digest

    def _write_hf(self, out: Path, state: dict[str, torch.Tensor]) -> str:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        tensors = {key: value.contiguous() for key, value in state.items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        for name in (*CONFIG_FILES, *TOKENIZER_FILES):
            source = self.model_dir / name
            if source.is_file() and not (out / name).exists():
                shutil.copy2(source, out / name)
        digest = checkpoint_digest(out)
        (out / DIGEST_FILE).write_text(digest + "\n")
        log.info("checkpoint_saved", out_dir=str(out), digest=digest, steps=self.steps)
        return digest

    def close(self) -> None:
        """Tear down Megatron's groups and this process's process group."""
        destroy_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()

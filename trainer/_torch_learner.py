"""The torch learner backend: one process, CPU or one GPU, an HF causal LM.

Metrics returned by ``step`` (documented here, and only here):

- ``learner/loss``: total loss of the update (pg + kl_coef * kl), token mean.
- ``learner/pg_loss``: PPO dual-clipped surrogate, token mean over the batch.
- ``learner/kl``: k3 KL to the frozen reference, token mean (only if kl_coef > 0).
- ``learner/approx_kl``: k3 estimate of KL(rollout || learner) on the trained tokens.
- ``learner/grad_norm``: global gradient norm before clipping.
- ``learner/clip_frac``: fraction of tokens where the clipped branch was taken.
- ``learner/dual_clip_frac``: fraction of tokens where the dual clip bound.
- ``learner/ratio_mean``: mean importance ratio exp(logp - rollout logp).
- ``learner/entropy``: mean entropy of softmax(logits / T) on trained tokens.
- ``learner/tokens``: number of trained tokens in the batch.
- ``learner/micro_batches``: number of forward/backward passes.
- ``rollout/logprob_gap``: mean |learner logp - rollout logp| on trained tokens,
  measured with the weights *before* the update. On stale tokens this includes
  the policy's own drift since they were sampled.
- ``rollout/logprob_gap_current``: the same on tokens sampled by the learner's
  current version only: pure sampler/learner mismatch (precision, kernels),
  ~0 when both run fp32 (absent when the batch has no such token).
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path
from typing import Protocol

import structlog
import torch

from ._batch import TrainBatch, micro_batches
from ._grpo import k3_kl, ppo_clip_loss, token_entropy, token_logprobs
from ._models import load_causal_lm

__all__ = ["LearnerBackend", "TorchLearner", "checkpoint_digest"]

log = structlog.get_logger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files copied from the source model directory next to each saved checkpoint."""

DIGEST_FILE = "DIGEST"
"""Name of the file in a checkpoint directory that holds its digest."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LearnerBackend(Protocol):
    """What the learner actor needs from a training backend."""

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser update on the whole batch; returns namespaced metrics."""
        ...

    def save(self, out_dir: str | Path) -> str:
        """Write an HF safetensors checkpoint directory; returns its digest."""
        ...


def checkpoint_digest(directory: str | Path) -> str:
    """sha256 (hex) over the ``*.safetensors`` files of a directory, by sorted name.

    Each file contributes its name and then its bytes, so renaming a shard
    changes the digest too.
    """
    sha = hashlib.sha256()
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for path in files:
        sha.update(path.name.encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                sha.update(chunk)
    return sha.hexdigest()


class TorchLearner:
    """GRPO learner on a Hugging Face causal LM (``AutoModelForCausalLM``).

    The update reads like DESIGN.md "The method": score the sampled tokens at
    temperature T, PPO dual-clip against the rollout logprobs with the
    batch's (already task-normalised) advantages, optional k3 KL to a frozen
    reference, token mean over the *whole* batch, clip the gradient norm,
    AdamW. Micro-batches only bound memory: each one's loss is divided by
    the token count of the whole batch, so accumulating them gives the same
    gradient as one big batch.

    Simplified: no learning-rate schedule, no entropy bonus, the model runs
    in ``train()`` mode (set dropout to 0 in the model config, as HF causal
    LMs ship, or the logprob gap will not be 0).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        grad_clip: float = 1.0,
        temperature: float = 0.8,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = 3.0,
        kl_coef: float = 0.0,
        micro_batch_tokens: int = 4096,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        gradient_checkpointing: bool = False,
        version: int = 0,
        reference_dir: str | Path | None = None,
    ) -> None:
        """``reference_dir``: the frozen KL reference (with ``kl_coef > 0``); default
        ``model_dir``. A run resumed from a checkpoint passes its initial model here, so
        the KL stays to the policy the run started from, not to the resumed weights."""

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.model_dir = Path(model_dir)
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.dual_clip = dual_clip
        self.kl_coef = kl_coef
        self.micro_batch_tokens = micro_batch_tokens
        self.device = torch.device(device)
        self.steps = 0  # optimiser updates done so far
        self.version = version  # policy version of the current weights (+1 per step)

        torch.manual_seed(seed)  # global RNG: only dropout (if any) draws from it
        self.model = load_causal_lm(self.model_dir, dtype=_DTYPES[dtype])
        self.model.to(self.device)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.reference: torch.nn.Module | None = None
        if kl_coef > 0 and reference_dir is not None and Path(reference_dir) != self.model_dir:
            reference = load_causal_lm(Path(reference_dir), dtype=_DTYPES[dtype])
            self.reference = reference.to(self.device).eval().requires_grad_(False)
        elif kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
        )
        log.info("learner_loaded", model_dir=str(self.model_dir), device=device, dtype=dtype)

    # --- the update -----------------------------------------------------------

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW update on the whole batch; returns the metrics listed above.

        A batch with no trained token changes nothing and reports zeros.
        """
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.accumulate_gradients(batch)
        if metrics["learner/tokens"] == 0:
            log.warning("empty_batch", rows=batch.num_rows)
            metrics["learner/grad_norm"] = 0.0
            return metrics
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.version += 1
        metrics["learner/grad_norm"] = float(grad_norm)
        return metrics

    def accumulate_gradients(self, batch: TrainBatch) -> dict[str, float]:
        """Forward/backward every micro-batch, adding into ``.grad``; no optimiser step.

        Each micro-batch's summed token loss is divided by the masked token
        count of the *whole* batch, so the accumulated gradient equals the
        gradient of the batch's token-mean loss.
        """
        total_tokens = batch.num_tokens
        sums = dict.fromkeys(
            (
                "pg",
                "kl",
                "gap",
                "gap_cur",
                "n_cur",
                "entropy",
                "clip",
                "dual",
                "ratio",
                "approx_kl",
            ),
            0.0,
        )
        count = 0
        for micro in micro_batches(batch, self.micro_batch_tokens):
            count += 1
            micro_tokens = micro.num_tokens
            if micro_tokens == 0:
                continue
            mask = micro.loss_mask.to(self.device)
            logits = self._logits(self.model, micro)
            logp = self._target_logprobs(logits, micro)
            old_logp = micro.old_logprobs.to(self.device)
            adv = micro.advantages.to(self.device)
            pg, stats = ppo_clip_loss(
                logp, old_logp, adv, mask, self.clip_low, self.clip_high, self.dual_clip
            )
            pg_sum = pg.sum()
            loss_sum = pg_sum
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp = self._target_logprobs(self._logits(self.reference, micro), micro)
                kl_sum = (k3_kl(logp, ref_logp) * mask).sum()
                loss_sum = loss_sum + self.kl_coef * kl_sum
                sums["kl"] += kl_sum.detach().item()
            (loss_sum / total_tokens).backward()

            with torch.no_grad():
                sums["pg"] += pg_sum.detach().item()
                gap = (logp.detach() - old_logp).abs() * mask
                sums["gap"] += gap.sum().item()
                current = micro.versions.to(self.device) == self.version
                sums["gap_cur"] += (gap * current).sum().item()
                sums["n_cur"] += (mask * current).sum().item()
                entropy = token_entropy(logits.detach(), self.temperature)
                sums["entropy"] += (entropy * mask).sum().item()
            # stats are token means over the micro-batch: weight them back to sums.
            sums["clip"] += float(stats["clip_frac"]) * micro_tokens
            sums["dual"] += float(stats["dual_clip_frac"]) * micro_tokens
            sums["ratio"] += float(stats["ratio_mean"]) * micro_tokens
            sums["approx_kl"] += float(stats["approx_kl"]) * micro_tokens

        denom = max(total_tokens, 1)
        metrics = {
            "learner/loss": (sums["pg"] + self.kl_coef * sums["kl"]) / denom,
            "learner/pg_loss": sums["pg"] / denom,
            "learner/approx_kl": sums["approx_kl"] / denom,
            "learner/clip_frac": sums["clip"] / denom,
            "learner/dual_clip_frac": sums["dual"] / denom,
            "learner/ratio_mean": sums["ratio"] / denom,
            "learner/entropy": sums["entropy"] / denom,
            "learner/tokens": float(total_tokens),
            "learner/micro_batches": float(count),
            "rollout/logprob_gap": sums["gap"] / denom,
        }
        if sums["n_cur"]:
            metrics["rollout/logprob_gap_current"] = sums["gap_cur"] / sums["n_cur"]
        if self.reference is not None:
            metrics["learner/kl"] = sums["kl"] / denom
        return metrics

    # --- scoring ----------------------------------------------------------------

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """``[B, L]`` float32 learner logprob of each target, 0 where ``loss_mask == 0``.

        Aligned like ``batch.old_logprobs``, so it can stand in for them.
        """
        out = torch.zeros_like(batch.loss_mask, dtype=torch.float32)
        per_chunk = max(1, self.micro_batch_tokens // max(1, batch.input_ids.shape[1]))
        for start in range(0, batch.num_rows, per_chunk):
            rows = torch.arange(start, min(start + per_chunk, batch.num_rows))
            micro = batch.select(rows)
            logp = self._target_logprobs(self._logits(self.model, micro), micro)
            out[rows] = logp.float().cpu() * micro.loss_mask
        return out

    def _target_logprobs(self, logits: torch.Tensor, micro: TrainBatch) -> torch.Tensor:
        """``[b, l]`` logprobs of the micro-batch's targets from its logits, at temperature T."""
        return token_logprobs(logits, micro.targets().to(self.device), self.temperature)

    def _logits(self, model: torch.nn.Module, micro: TrainBatch) -> torch.Tensor:
        """``[b, l, V]`` logits of ``model`` on a micro-batch."""
        return model(
            input_ids=micro.input_ids.to(self.device),
            attention_mask=micro.attention_mask.to(self.device),
            use_cache=False,
        ).logits

    # --- checkpoints --------------------------------------------------------------

    def save(self, out_dir: str | Path) -> str:
        """Write an HF safetensors checkpoint to ``out_dir``; return its digest.

        Copies the tokenizer files found in ``model_dir`` alongside, and
        writes the digest (see ``checkpoint_digest``) to ``out_dir/DIGEST``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        for name in TOKENIZER_FILES:
            source = self.model_dir / name
            if source.is_file() and not (out / name).exists():
                shutil.copy2(source, out / name)
        digest = checkpoint_digest(out)
        (out / DIGEST_FILE).write_text(digest + "\n")
        log.info("checkpoint_saved", out_dir=str(out), digest=digest, steps=self.steps)
        return digest

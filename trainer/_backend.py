"""The learner backend's contract: what the learner actor calls (`LearnerBackend`), the
metrics every backend's ``step`` returns and the checkpoint directory its ``save`` writes.

Metrics returned by ``step`` (documented here, and only here):

- ``learner/loss``: total loss of the update (pg + kl_coef * kl), token mean.
- ``learner/pg_loss``: PPO dual-clipped surrogate, token mean over the batch.
- ``learner/kl``: k3 KL to the frozen reference (with lora: the base, adapters disabled),
  token mean (only if kl_coef > 0).
- ``learner/approx_kl``: k3 estimate of KL(rollout || learner) on the trained tokens.
- ``learner/grad_norm``: global gradient norm before clipping.
- ``learner/lr``: learning rate of this update (after the linear warmup).
- ``learner/clip_frac``: fraction of tokens where the clipped branch was taken
  (ratio to the proximal policy: 0 with one optimiser step per batch).
- ``learner/dual_clip_frac``: fraction of tokens where the dual clip bound (0 likewise).
- ``learner/ratio_mean``: mean importance ratio exp(logp - rollout logp), untruncated.
- ``learner/is_weight_mean``: mean truncated importance weight min(w, is_cap) the
  loss multiplies each token by (``ppo_clip_loss``; 1 on-policy).
- ``learner/is_clip_frac``: fraction of tokens whose weight w exceeded ``is_cap``.
- ``learner/entropy``: mean entropy of softmax(logits / T) on trained tokens.
- ``learner/tokens``: number of trained tokens in the batch.
- ``learner/micro_batches``: number of forward/backward passes.
- ``learner/row_copies``: rows forwarded as a copy of another row of the batch, token for
  token (`._distinct_rows`; torch backend with ``dedup_rows``; 0 without it and on the
  megatron backend, which forwards every row).
- ``rollout/logprob_gap``: mean |learner logp - rollout logp| on trained tokens,
  measured with the weights *before* the update. On stale tokens this includes
  the policy's own drift since they were sampled.
- ``rollout/logprob_gap_current``: the same on tokens sampled by the learner's
  current version only: pure sampler/learner mismatch (precision, kernels),
  ~0 when both run fp32 (absent when the batch has no such token).

Checkpoints: ``save(out_dir)`` writes HF safetensors weights (with lora: the adapters
only), the tokenizer files found in the source model directory (`TOKENIZER_FILES`) and
the digest of the weights (`._digest.checkpoint_digest`) in ``DIGEST`` (`DIGEST_FILE`),
and returns that digest: what the samplers check before they load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ._batch import TrainBatch

__all__ = ["DIGEST_FILE", "TOKENIZER_FILES", "LearnerBackend"]

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


class LearnerBackend(Protocol):
    """What the learner actor needs from a training backend."""

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser update on the whole batch; returns namespaced metrics."""
        ...

    def save(self, out_dir: str | Path) -> str:
        """Write an HF safetensors checkpoint directory; returns its digest."""
        ...

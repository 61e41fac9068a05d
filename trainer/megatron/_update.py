"""One GRPO update on every rank, through Megatron's forward/backward schedule.

The maths is the torch backend's (``agentrl.trainer._grpo``): decoupled PPO with
the truncated importance weight to the rollout logprobs on the batch's
task-normalised advantages (one optimiser step per batch: the proximal policy
is the current weights), optional k3 KL to a frozen reference, token mean over
the *whole* batch. What changes is where the numbers live:

- logits are vocab-parallel (``[b, l, V / tp]`` on each TP rank), so target
  logprobs come from ``tensor_parallel.vocab_parallel_cross_entropy``
  (logp = -CE) and the entropy from three all-reduces over the TP group;
- the micro-batches of ``micro_batches`` are dealt round-robin to the DP
  ranks; each rank divides its summed token loss by the token count of the
  whole batch, and the gradients are summed over DP, so the update equals the
  DP = 1 one;
- the loss exists only on the last pipeline stage; the metric sums are added
  over the world (one contribution per DP replica) so every rank returns them.

Gradients are plain ``.grad`` (no Megatron DDP wrapper, no distributed
optimizer: they do not run on CPU): DP all-reduce, tied-embedding all-reduce
across pipeline stages, one global norm over the model-parallel group, clip.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._batch import TrainBatch, micro_batches
from .._grpo import LOSS_SUMS as _SUMS
from .._grpo import k3_kl, ppo_clip_loss
from .._sft import masked_nll
from ._model import mask_padded_logits

__all__ = ["LossSettings", "MegatronUpdate", "vocab_parallel_entropy", "vocab_parallel_logprobs"]


@dataclass(frozen=True)
class LossSettings:
    """The loss's hyper-parameters (the same fields as TorchLearner's)."""

    temperature: float
    clip_low: float
    clip_high: float
    dual_clip: float | None
    kl_coef: float
    vocab_size: int
    """The model's real vocabulary; logit columns beyond it are TP padding, masked out."""
    objective: str = "grpo"
    """``grpo``, or ``sft``: the warm start's token-mean NLL at T = 1 (``.._sft``)."""
    is_cap: float | None = 2.0
    """C of the truncated importance weight min(w, C) (``ppo_clip_loss``)."""


def _tp_group():
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def vocab_parallel_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, vocab_size: int
) -> torch.Tensor:
    """``[b, l]`` float32 logprob of ``targets`` under softmax(logits / T) over the full vocab.

    ``logits`` is this TP rank's ``[b, l, V / tp]`` slice; the cross entropy
    all-reduces the max, the target logit and the partition sum over TP.
    """
    from megatron.core import tensor_parallel

    scaled = mask_padded_logits(logits.float() / temperature, vocab_size)
    return -tensor_parallel.vocab_parallel_cross_entropy(scaled, targets)


@torch.no_grad()
def vocab_parallel_entropy(logits: torch.Tensor, temperature: float, vocab_size: int):
    """``[b, l]`` entropy of softmax(logits / T) over the full vocab, from vocab slices.

        z = logits / T - max,  s = Σ e^z,  H = log s - Σ e^z z / s

    with the max, ``s`` and ``Σ e^z z`` all-reduced over the TP group.
    """
    z = mask_padded_logits(logits.float() / temperature, vocab_size)
    top = z.max(dim=-1).values
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=_tp_group())
    z = z - top.unsqueeze(-1)
    e = z.exp()
    sums = torch.stack([e.sum(-1), torch.where(e > 0, e * z, 0.0).sum(-1)])
    dist.all_reduce(sums, group=_tp_group())
    return sums[0].log() - sums[1] / sums[0]


def causal_mask(length: int) -> torch.Tensor:
    """``[1, 1, L, L]`` bool, True where attention is *not* allowed (Megatron's convention)."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)[None, None]


def _empty_like(micro: TrainBatch) -> TrainBatch:
    """A one-row micro-batch that trains nothing (for a DP rank with no micro-batch)."""
    row = micro.select(torch.tensor([0]), 1)
    return TrainBatch(
        input_ids=row.input_ids,
        attention_mask=row.attention_mask,
        loss_mask=torch.zeros_like(row.loss_mask),
        old_logprobs=torch.zeros_like(row.old_logprobs),
        advantages=torch.zeros_like(row.advantages),
        versions=torch.full_like(row.versions, -1),
        task_index=row.task_index,
        group_index=row.group_index,
        rewards=row.rewards,
        tasks=row.tasks,
    )


def _pad_to(micro: TrainBatch, rows: int, length: int) -> TrainBatch:
    """``micro`` padded with untrained positions to ``[rows, length]`` (pipeline shapes)."""

    def grow(t: torch.Tensor, fill: float) -> torch.Tensor:
        out = torch.full((rows, length), fill, dtype=t.dtype)
        out[: t.shape[0], : t.shape[1]] = t
        return out

    def grow_rows(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t[:1].expand(rows - t.shape[0])])

    return TrainBatch(
        input_ids=grow(micro.input_ids, 0),
        attention_mask=grow(micro.attention_mask, 0),
        loss_mask=grow(micro.loss_mask, 0.0),
        old_logprobs=grow(micro.old_logprobs, 0.0),
        advantages=grow(micro.advantages, 0.0),
        versions=grow(micro.versions, -1),
        task_index=grow_rows(micro.task_index),
        group_index=grow_rows(micro.group_index),
        rewards=grow_rows(micro.rewards),
        tasks=micro.tasks,
    )


def dp_share(micros: list[TrainBatch], dp_rank: int, dp_size: int) -> list[TrainBatch]:
    """This DP rank's micro-batches: every ``dp_size``-th one, at least one (maybe empty)."""
    share = micros[dp_rank::dp_size]
    return share or [_empty_like(micros[0])]


class MegatronUpdate:
    """The GRPO update of one rank's model shard (every rank runs the same calls)."""

    def __init__(
        self,
        model: torch.nn.Module,
        reference: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        loss: LossSettings,
        *,
        grad_clip: float,
        micro_batch_tokens: int,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.model = model
        self.reference = reference
        self.optimizer = optimizer
        self.loss = loss
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        for m in (model, reference):
            if m is not None:
                # The loss function returns sums already divided by the batch's tokens.
                m.config.calculate_per_token_loss = True
        self._tp_rank = ps.get_tensor_model_parallel_rank()
        self._pp = ps.get_pipeline_model_parallel_world_size()
        self._dp = ps.get_data_parallel_world_size()
        self._dp_rank = ps.get_data_parallel_rank()
        self._last_stage = ps.is_pipeline_last_stage()
        self.device = next(model.parameters()).device  # batches arrive on the CPU

    # --- the update -------------------------------------------------------------------

    def step(self, batch: TrainBatch, version: int) -> tuple[dict[str, float], bool]:
        """Forward/backward the batch, sync and clip the grads, AdamW; returns (metrics, stepped).

        ``version`` is the policy version of the current weights (for the
        ``rollout/logprob_gap_current`` tokens). A batch with no trained token
        changes nothing (``stepped`` False).
        """
        micros = micro_batches(batch, self.micro_batch_tokens)
        total = batch.num_tokens
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=self.device)
        if total == 0:
            return self._metrics(sums, total, len(micros)), False
        share = dp_share(micros, self._dp_rank, self._dp)
        if self._pp > 1:
            rows = max(m.num_rows for m in share)
            length = max(m.input_ids.shape[1] for m in share)
            share = [_pad_to(m, rows, length) for m in share]
        ref_logps = self._reference_logprobs(share)
        self.optimizer.zero_grad(set_to_none=True)
        outputs = self._schedule(
            self.model,
            share,
            functools.partial(self._train_loss, total=total, version=version, refs=ref_logps),
            forward_only=False,
        )
        if self._last_stage and self._tp_rank == 0:
            for out in outputs:
                sums += out["sums"].to(self.device)
        dist.all_reduce(sums)  # one (last stage, TP rank 0) contribution per DP replica
        metrics = self._metrics(sums, total, len(micros))
        metrics["learner/grad_norm"] = self._sync_and_clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return metrics, True

    def _metrics(self, sums: torch.Tensor, total: int, count: int) -> dict[str, float]:
        s = dict(zip(_SUMS, sums.tolist(), strict=True))
        denom = max(total, 1)
        metrics = {
            "learner/loss": (s["pg"] + self.loss.kl_coef * s["kl"]) / denom,
            "learner/pg_loss": s["pg"] / denom,
            "learner/approx_kl": s["approx_kl"] / denom,
            "learner/clip_frac": s["clip"] / denom,
            "learner/dual_clip_frac": s["dual"] / denom,
            "learner/ratio_mean": s["ratio"] / denom,
            "learner/is_weight_mean": s["is_weight"] / denom,
            "learner/is_clip_frac": s["is_clip"] / denom,
            "learner/entropy": s["entropy"] / denom,
            "learner/tokens": float(total),
            "learner/micro_batches": float(count),
            "learner/row_copies": 0.0,  # every row forwarded (no dedup_rows here)
            "rollout/logprob_gap": s["gap"] / denom,
            "learner/grad_norm": 0.0,
        }
        if s["n_cur"]:
            metrics["rollout/logprob_gap_current"] = s["gap_cur"] / s["n_cur"]
        if self.reference is not None:
            metrics["learner/kl"] = s["kl"] / denom
        return metrics

    # --- the schedule -------------------------------------------------------------------

    def _schedule(self, model, share: list[TrainBatch], loss_fn, *, forward_only: bool):
        """Megatron's forward/backward over this rank's micro-batches (1F1B when pp > 1)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Iterator, module):
            index, micro = next(data_iterator)
            length = micro.input_ids.shape[1]
            positions = torch.arange(length, device=self.device).expand(micro.num_rows, length)
            ids = micro.input_ids.to(self.device)
            logits = module(ids, positions, causal_mask(length).to(self.device))
            return logits, functools.partial(loss_fn, index, micro)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(list(enumerate(share))),
            model=model,
            num_microbatches=len(share),
            seq_length=max(m.input_ids.shape[1] for m in share),
            micro_batch_size=max(m.num_rows for m in share),
            forward_only=forward_only,
        )

    def _reference_logprobs(self, share: list[TrainBatch]) -> list[torch.Tensor] | None:
        """Forward-only pass of the frozen reference: ``[b, l]`` logprobs per micro-batch
        (on the last pipeline stage; an empty list elsewhere)."""
        if self.reference is None:
            return None

        def ref_loss(index: int, micro: TrainBatch, logits: torch.Tensor):
            targets = micro.targets().to(self.device)
            logp = vocab_parallel_logprobs(
                logits, targets, self.loss.temperature, self.loss.vocab_size
            )
            tokens = torch.tensor(micro.num_tokens, device=self.device)
            return logits.new_zeros(()), tokens, {"logp": logp}

        with torch.no_grad():
            outputs = self._schedule(self.reference, share, ref_loss, forward_only=True)
        return [out["logp"] for out in outputs]

    def _train_loss(
        self,
        index: int,
        micro: TrainBatch,
        logits: torch.Tensor,
        *,
        total: int,
        version: int,
        refs: list[torch.Tensor] | None,
    ):
        """Loss of one micro-batch on the last stage: its summed token loss / batch tokens."""
        cfg = self.loss
        dev = self.device
        mask = micro.loss_mask.to(dev)
        if cfg.objective == "sft":  # the warm start (agentrl sft): token-mean NLL at T = 1
            logp = vocab_parallel_logprobs(logits, micro.targets().to(dev), 1.0, cfg.vocab_size)
            nll = masked_nll(logp, mask)
            sums = torch.zeros(len(_SUMS), dtype=torch.float64)
            sums[_SUMS.index("pg")] = nll.item()  # learner/loss = the NLL (no KL term)
            return nll / total, torch.tensor(int(mask.sum()), device=dev), {"sums": sums}
        tokens = float(mask.sum())
        targets = micro.targets().to(dev)
        logp = vocab_parallel_logprobs(logits, targets, cfg.temperature, cfg.vocab_size)
        old_logp = micro.old_logprobs.to(dev)
        adv = micro.advantages.to(dev)
        pg, stats = ppo_clip_loss(  # proximal policy = these weights (one step per batch)
            logp,
            old_logp,
            adv,
            mask,
            cfg.clip_low,
            cfg.clip_high,
            cfg.dual_clip,
            is_cap=cfg.is_cap,
        )
        pg_sum = pg.sum()
        loss_sum = pg_sum
        kl_sum = torch.zeros((), device=dev)
        if refs is not None:
            kl_sum = (k3_kl(logp, refs[index]) * mask).sum()
            loss_sum = loss_sum + cfg.kl_coef * kl_sum
        with torch.no_grad():
            gap = (logp.detach() - old_logp).abs() * mask
            current = micro.versions.to(dev) == version
            entropy = vocab_parallel_entropy(logits.detach(), cfg.temperature, cfg.vocab_size)
            sums = torch.tensor(
                [
                    pg_sum.item(),
                    kl_sum.item(),
                    gap.sum().item(),
                    (gap * current).sum().item(),
                    (mask * current).sum().item(),
                    (entropy * mask).sum().item(),
                    float(stats["clip_frac"]) * tokens,
                    float(stats["dual_clip_frac"]) * tokens,
                    float(stats["ratio_mean"]) * tokens,
                    float(stats["approx_kl"]) * tokens,
                    float(stats["is_weight_mean"]) * tokens,
                    float(stats["is_clip_frac"]) * tokens,
                ],
                dtype=torch.float64,
            )
        return loss_sum / total, torch.tensor(int(tokens), device=dev), {"sums": sums}

    # --- gradients ----------------------------------------------------------------------

    def _sync_and_clip(self) -> float:
        """Sum grads over DP, sync tied embeddings over PP, clip to the global norm; the norm.

        The norm counts each parameter once: TP-replicated ones (norms) on TP
        rank 0 only, the last stage's copy of a tied embedding not at all.
        """
        from megatron.core import parallel_state as ps

        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        if self._dp > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=ps.get_data_parallel_group())
            for grad, synced in zip(
                grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
            ):
                grad.copy_(synced)
        if self._pp > 1 and ps.is_rank_in_embedding_group():
            model = self.model
            if getattr(model, "share_embeddings_and_output_weights", False):
                weight = model.shared_embedding_or_output_weight()
                dist.all_reduce(weight.grad, group=ps.get_embedding_group())
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            parallel = getattr(p, "tensor_model_parallel", False)
            if getattr(p, "shared", False) or not (parallel or self._tp_rank == 0):
                continue
            squares += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(squares, group=ps.get_model_parallel_group())
        norm = math.sqrt(float(squares))
        coef = min(1.0, self.grad_clip / (norm + 1e-6))
        if coef < 1.0:
            for grad in grads:
                grad.mul_(coef)
        return norm

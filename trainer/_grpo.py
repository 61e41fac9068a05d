"""GRPO maths as pure functions: rewards, advantages, the clipped loss, KL.

Every function takes and returns torch tensors (or floats) and has no state.
Shapes: ``N`` episodes, ``B`` batch rows (one episode per row), ``L`` padded
length, ``V`` vocabulary size. A ``mask`` is ``1`` on tokens that train.

The order of operations is the one of DESIGN.md "The method":

1. ``episode_reward``  R = env reward if completed, else the penalty
2. ``group_advantages`` A = (R - mean_group) / (std_group + eps)
3. broadcast A to the assistant tokens (``build_batch``)
4. ``task_normalize``  Ã = (A - mean_task) / (std_task + eps), before the update
5. ``ppo_clip_loss`` on Ã against the rollout logprobs, plus ``k3_kl``
6. ``token_mean`` over every masked token of the batch
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "EPS",
    "episode_reward",
    "group_advantages",
    "k3_kl",
    "ppo_clip_loss",
    "task_normalize",
    "token_entropy",
    "token_logprobs",
    "token_mean",
]

EPS = 1e-6
"""Added to every standard deviation before dividing by it."""

COMPLETED = "completed"
"""The only episode status that keeps the environment's reward."""


def episode_reward(env_reward: float, status: str, penalty: float = -0.2) -> float:
    """The scalar reward of one episode.

    R = env_reward   if status == "completed"
    R = penalty      otherwise (turn limit, length limit, invalid action,
                     validation failure, task error, cancelled)
    """
    return float(env_reward) if status == COMPLETED else float(penalty)


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """GRPO advantage of each episode relative to its group.

        A_i = (R_i - mean_g) / (std_g + 1e-6)   for i in group g

    ``std_g`` is the sample standard deviation (Bessel-corrected, the torch
    default, as in common GRPO implementations). A group of one episode has
    no spread to compare against: its advantage is 0. A group whose rewards
    are all equal gets 0 too (R - mean = 0).

    Args:
        rewards: ``[N]`` float rewards.
        group_index: ``[N]`` long, the group of each episode (any non-negative ids).

    Returns:
        ``[N]`` advantages, dtype of ``rewards``.
    """
    if rewards.shape != group_index.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} "
            "must be equal 1-d shapes"
        )
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    _, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(
        0, inverse, torch.ones_like(rewards)
    )
    total = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    mean = total / count
    centred = rewards - mean[inverse]
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, inverse, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    adv = centred / (std[inverse] + EPS)
    return torch.where(count[inverse] > 1, adv, torch.zeros_like(adv))


def task_normalize(adv: torch.Tensor, mask: torch.Tensor, task_index: torch.Tensor) -> torch.Tensor:
    """Task advantage normalisation across the batch (AgentRL).

        Ã_t = (A_t - mean_task) / (std_task + 1e-6)

    where mean_task and std_task are the mean and sample standard deviation over
    every masked token of every row of that task. It keeps one task whose
    episodes are long (many tokens) or whose rewards are wide from dominating
    the update. Unmasked positions stay 0. A task with a single masked token
    has std 0 and A = mean, so its advantage becomes 0.

    Args:
        adv: ``[B, L]`` token advantages.
        mask: ``[B, L]`` 1 where the token trains.
        task_index: ``[B]`` long, the task of each row.

    Returns:
        ``[B, L]`` normalised advantages, 0 where ``mask == 0``.
    """
    if adv.shape != mask.shape or task_index.shape != adv.shape[:1]:
        raise ValueError(
            f"adv {tuple(adv.shape)}, mask {tuple(mask.shape)}, task_index "
            f"{tuple(task_index.shape)}: expected [B, L], [B, L], [B]"
        )
    keep = mask.bool()
    out = torch.zeros_like(adv)
    for task in torch.unique(task_index):
        sel = keep & (task_index == task)[:, None]
        values = adv[sel]
        if values.numel() == 0:
            continue
        mu = values.mean()
        sigma = values.std() if values.numel() > 1 else values.new_zeros(())
        out[sel] = (values - mu) / (sigma + EPS)
    return out


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip, per token.

        r   = exp(logp - old_logp)          old_logp: the rollout (behaviour) policy
        pg  = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        pg  = min(pg, -A c)                 only where A < 0 (dual clip, c = dual_clip)

    The dual clip bounds the loss of a negative-advantage token whose ratio
    exploded (a token the current policy likes far more than the stale one
    that sampled it). ``dual_clip=None`` turns it off.

    Args:
        logp, old_logp, adv, mask: ``[B, L]``.

    Returns:
        ``(loss [B, L], stats)``: the per-token loss (0 where ``mask == 0``) and
        detached masked means ``clip_frac`` (the clipped branch was taken),
        ``dual_clip_frac``, ``ratio_mean`` and ``approx_kl`` (k3 estimate of
        KL(old || new): (r - 1) - log r).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    dual = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual = (adv < 0) & (pg > bound)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    loss = pg * mask
    with torch.no_grad():
        stats = {
            "clip_frac": token_mean((pg_clipped > pg_unclipped).to(logp.dtype), mask),
            "dual_clip_frac": token_mean(dual.to(logp.dtype), mask),
            "ratio_mean": token_mean(ratio, mask),
            "approx_kl": token_mean((ratio - 1.0) - log_ratio, mask),
        }
    return loss, stats


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference) (Schulman, 2020).

    k3 = exp(ref - logp) - (ref - logp) - 1     >= 0, unbiased, low variance
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every masked token of the whole batch.

        token_mean = sum(x * mask) / max(sum(mask), 1)

    Each token weighs the same, whichever row it sits in (no per-row mean).
    """
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = 1024,
) -> torch.Tensor:
    """Log-probability of each target token under ``softmax(logits / T)``.

        logp[b, t] = log_softmax(logits[b, t] / T)[targets[b, t]]

    Computed as ``-cross_entropy`` over chunks of ``chunk_tokens`` positions,
    upcast to float32 one chunk at a time, so no full ``[B, L, V]`` float32
    copy of the logits is held at once outside autograd. T is the sampler's
    temperature so the learner scores tokens with the distribution that
    sampled them.

    Args:
        logits: ``[B, L, V]``.
        targets: ``[B, L]`` long.

    Returns:
        ``[B, L]`` float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    batch, length, vocab = logits.shape
    flat_logits = logits.reshape(-1, vocab)
    flat_targets = targets.reshape(-1)
    pieces = []
    for start in range(0, flat_targets.numel(), chunk_tokens):
        chunk = flat_logits[start : start + chunk_tokens].float() / temperature
        pieces.append(
            -F.cross_entropy(chunk, flat_targets[start : start + chunk_tokens], reduction="none")
        )
    if not pieces:
        return logits.new_zeros((batch, length), dtype=torch.float32)
    return torch.cat(pieces).reshape(batch, length)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / T)`` at each position: H = -Σ p log p.

    Args:
        logits: ``[B, L, V]``.

    Returns:
        ``[B, L]`` float32.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)

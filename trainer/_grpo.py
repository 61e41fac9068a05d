"""GRPO maths as pure functions: rewards, advantages, the decoupled clipped loss, KL.

Every function takes and returns torch tensors (or floats) and has no state.
Shapes: ``N`` episodes, ``B`` batch rows (one episode per row), ``L`` padded
length, ``V`` vocabulary size. A ``mask`` is ``1`` on tokens that train.

The order of operations is the one of DESIGN.md "The method":

1. ``episode_reward``  R = env reward if completed, else the penalty
2. ``group_advantages`` A = (R - mean_group) / (std_group + eps); exactly 0 in a
   group whose rewards are all equal (``group_spread`` False)
3. broadcast A to the assistant tokens (``build_batch``)
4. ``task_normalize``  Ã = A / (rms_task + eps) over the tokens of groups with
   spread, before the update (``learner.task_normalize``; every sign kept), or the
   paper's re-centred (A - mean_task) / (std_task + eps) (``learner.task_center``)
5. ``ppo_clip_loss``: decoupled PPO on Ã with the truncated importance weight
   to the rollout (behaviour) logprobs, plus ``k3_kl``
6. ``token_mean`` over every masked token of the batch
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "EPS",
    "KL_CLAMP",
    "LOG_RATIO_CLAMP",
    "LOSS_SUMS",
    "episode_reward",
    "group_advantages",
    "group_spread",
    "k3_kl",
    "ppo_clip_loss",
    "task_normalize",
    "token_entropy",
    "token_logprobs",
    "token_mean",
]

EPS = 1e-6
"""Added to every standard deviation before dividing by it."""

LOG_RATIO_CLAMP = 20.0
"""Every log-ratio is clamped to [-20, 20] before ``exp`` (e^20 ~ 5e8: no inf, no nan)."""

KL_CLAMP = 10.0
"""Each token's k3 KL value is clamped to [-10, 10] (verl's ``kl_penalty``, "low_var_kl"):
a token far from the reference (k3 > 10, δ = ref - logp above ~2.5 nats) adds 10 to the
KL and no gradient, instead of a gradient of e^δ - 1 (327x a typical policy-gradient
token's at δ = 15)."""

LOSS_SUMS = (
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
    "is_weight",
    "is_clip",
)
"""Per-token sums a learner backend adds up over an update's micro-batches; its metrics are
these over the batch's tokens (the torch and Megatron backends report the same ones)."""

COMPLETED = "completed"
"""The only episode status that keeps the environment's reward."""


def episode_reward(env_reward: float, status: str, penalty: float = -0.2) -> float:
    """The scalar reward of one episode.

    R = env_reward   if status == "completed"
    R = penalty      otherwise (turn limit, length limit, invalid action,
                     validation failure, task error, cancelled)
    """
    return float(env_reward) if status == COMPLETED else float(penalty)


def _check_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> None:
    if rewards.shape != group_index.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} "
            "must be equal 1-d shapes"
        )


def group_spread(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: True for an episode whose group's rewards are not all equal.

        spread_g = max_g R > min_g R

    A group of one episode has no spread. Only the episodes of groups with
    spread carry a learning signal (and take part in ``task_normalize``).
    """
    _check_groups(rewards, group_index)
    _, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    values = rewards.float()
    high = torch.full((num_groups,), -torch.inf).scatter_reduce(0, inverse, values, "amax")
    low = torch.full((num_groups,), torch.inf).scatter_reduce(0, inverse, values, "amin")
    return high[inverse] > low[inverse]


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """GRPO advantage of each episode relative to its group.

        A_i = (R_i - mean_g) / (std_g + 1e-6)   for i in group g with spread
        A_i = 0 exactly                          for i in a group with max_g R == min_g R

    ``std_g`` is the sample standard deviation (Bessel-corrected, the torch
    default, as in common GRPO implementations). A group of one episode, or
    one whose rewards are all equal, has nothing to compare against: its
    advantage is exactly 0 (computing R - mean in floating point would leave
    a residue, e.g. eight rewards of -0.2 gave +0.0147 each, and then
    ``task_normalize`` would blow that noise up to ~±1).

    Args:
        rewards: ``[N]`` float rewards.
        group_index: ``[N]`` long, the group of each episode (any non-negative ids).

    Returns:
        ``[N]`` advantages, dtype of ``rewards``.
    """
    spread = group_spread(rewards, group_index)
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
    return torch.where(spread, adv, torch.zeros_like(adv))


def task_normalize(
    adv: torch.Tensor,
    mask: torch.Tensor,
    task_index: torch.Tensor,
    has_spread: torch.Tensor,
    *,
    center: bool = False,
) -> torch.Tensor:
    """Task advantage normalisation across the batch (AgentRL), over groups with spread.

    Default, a per-task scale that keeps every sign:

        Ã_t = A_t / (rms_task + 1e-6)                 on rows whose group has spread
        Ã_t = 0                                       on rows of flat groups

    With ``center`` (the AgentRL paper's form, ``learner.task_center``):

        Ã_t = (A_t - mean_task) / (std_task + 1e-6)

    where rms_task = sqrt(mean(A²)), mean_task and std_task (sample) are over the
    masked tokens of the rows of that task whose group has spread (``has_spread``,
    from ``group_spread``). Either keeps one task whose episodes are long (many
    tokens) or whose rewards are wide from dominating the update.

    Why the scale is the default: re-centring moves zero. With more than two reward
    levels (1 solved, 0 completed but wrong, the penalty for a turn limit) a group's
    near-zero advantages change sign whenever the task's token mean is not 0, which
    it rarely is since episode lengths differ: rewards [1, 0, 0, -0.2 x 5] with 30, 40,
    40 and 5 x 300 tokens give A = [2.415, 0, 0, -0.483 x 5] and, re-centred,
    Ã = [+7.00, +1.01, +1.01, -0.19 x 5] (test_grpo): completed-but-wrong episodes
    reinforced. Dividing by the RMS gives [+4.23, 0, 0, -0.85 x 5]: the same
    directions, the task at unit scale.

    Flat groups (all rewards equal) carry no signal and stay out of the
    statistics: counted in, their zeros would shift mean_task (centred) or
    shrink rms_task, and a task with no mixed group at all would have its float
    residue scaled up to ~±1. A task with no row of a spread group gives all
    zeros; unmasked positions stay 0. Centred, a task with a single such token
    has std 0 and A = mean, so its advantage becomes 0.

    Args:
        adv: ``[B, L]`` token advantages.
        mask: ``[B, L]`` 1 where the token trains.
        task_index: ``[B]`` long, the task of each row.
        has_spread: ``[B]`` bool, the row's GRPO group has reward spread.
        center: subtract the task's mean first (the paper's form; can flip signs).

    Returns:
        ``[B, L]`` normalised advantages, 0 where ``mask == 0`` or on flat-group rows.
    """
    if (
        adv.shape != mask.shape
        or task_index.shape != adv.shape[:1]
        or has_spread.shape != adv.shape[:1]
    ):
        raise ValueError(
            f"adv {tuple(adv.shape)}, mask {tuple(mask.shape)}, task_index "
            f"{tuple(task_index.shape)}, has_spread {tuple(has_spread.shape)}: "
            "expected [B, L], [B, L], [B], [B]"
        )
    keep = mask.bool() & has_spread.bool()[:, None]
    out = torch.zeros_like(adv)
    for task in torch.unique(task_index):
        sel = keep & (task_index == task)[:, None]
        values = adv[sel]
        if values.numel() == 0:
            continue
        if center:
            mu = values.mean()
            sigma = values.std() if values.numel() > 1 else values.new_zeros(())
            out[sel] = (values - mu) / (sigma + EPS)
        else:
            out[sel] = values / (values.pow(2).mean().sqrt() + EPS)
    return out


def ppo_clip_loss(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    *,
    prox_logp: torch.Tensor | None = None,
    is_cap: float | None = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO with a truncated importance weight and dual clip, per token.

    Three policies: π_behav sampled the token (``behav_logp``, the rollout
    logprob: possibly several versions old, from a cross-policy pool or the
    staleness window), π_prox is the proximal policy the update stays close
    to, π_θ is the one being optimised (``logp``, with gradient):

        prox = sg(logp)                            unless ``prox_logp`` is given
        r    = exp(clamp(logp - prox, ±20))        π_θ / π_prox
        w    = exp(clamp(prox - behav_logp, ±20))  π_prox / π_behav (no gradient)
        w̄    = min(w, C)                           C = ``is_cap`` (None: no truncation)
        pg   = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        pg   = min(pg, -A c)                       only where A < 0 (c = ``dual_clip``)
        loss = w̄ · pg

    The learners take one optimiser step per batch (micro-batches and DP
    ranks only accumulate one gradient), so the proximal policy *is* the
    current parameters before that step: prox = sg(logp), r = 1 in value and

        loss = -min(w, C) · A · exp(logp - sg(logp)),   ∇loss = -min(w, C) · A · ∇logp

    with w = exp(sg(logp) - behav_logp). The clip and the dual clip cannot
    bind at r = 1 (``clip_frac`` = ``dual_clip_frac`` = 0); they are kept for
    several steps per batch, where ``prox_logp`` must be the logprobs of the
    parameters before the first step. The staleness is corrected by w and its
    variance bounded by C: a token the current policy likes far more than the
    old policy that sampled it weighs at most C (the job the dual clip did when
    the ratio was taken against the behaviour policy). On tokens sampled by the
    current weights w = 1 (up to sampler/learner numerics) and this is the
    plain policy gradient.

    References: Hilton, Cobbe, Schulman, "Batch size-invariance for policy
    optimization" (2021, arXiv:2110.00641), the decoupled objective
    E_behav[(π_prox / π_behav) · min(r A, clip(r) A)]; AReaL (Fu et al. 2025,
    arXiv:2505.24298, ``ppo_actor_loss_fn``) uses it for asynchronous RL, with
    the dual clip on r. AReaL *drops* tokens with w above its cap
    (``behav_imp_weight_cap``); here they are kept with weight C (truncated
    importance sampling, as V-trace's truncated rho).

    Args:
        logp, behav_logp, adv, mask: ``[B, L]``; ``prox_logp``: ``[B, L]`` or None.

    Returns:
        ``(loss [B, L], stats)``: the per-token loss (0 where ``mask == 0``) and
        detached masked means ``clip_frac`` (the clipped branch was taken),
        ``dual_clip_frac``, ``ratio_mean`` (π_θ / π_behav, untruncated),
        ``is_weight_mean`` (w̄), ``is_clip_frac`` (w > C) and ``approx_kl``
        (k3 estimate of KL(behav || θ): (q - 1) - log q with q = π_θ / π_behav).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if is_cap is not None and is_cap < 1.0:
        raise ValueError(f"is_cap must be >= 1 (on-policy tokens have weight 1), got {is_cap}")
    prox = logp.detach() if prox_logp is None else prox_logp.detach()
    ratio = torch.exp(torch.clamp(logp - prox, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = torch.exp(torch.clamp(prox - behav_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    truncated = weight if is_cap is None else torch.clamp(weight, max=is_cap)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    dual = torch.zeros_like(mask, dtype=torch.bool)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual = (adv < 0) & (pg > bound)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    loss = truncated * pg * mask
    with torch.no_grad():
        log_rho = torch.clamp(logp.detach() - behav_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        rho = torch.exp(log_rho)
        capped = torch.zeros_like(dual) if is_cap is None else weight > is_cap
        stats = {
            "clip_frac": token_mean((pg_clipped > pg_unclipped).to(logp.dtype), mask),
            "dual_clip_frac": token_mean(dual.to(logp.dtype), mask),
            "ratio_mean": token_mean(rho, mask),
            "is_weight_mean": token_mean(truncated, mask),
            "is_clip_frac": token_mean(capped.to(logp.dtype), mask),
            "approx_kl": token_mean((rho - 1.0) - log_rho, mask),
        }
    return loss, stats


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference) (Schulman, 2020), clamped.

    k3 = clamp(exp(δ) - δ - 1, ±KL_CLAMP),  δ = clamp(ref - logp, ±20)    >= 0, low variance

    The value clamp is verl's: a token with k3 > 10 adds 10 and no gradient
    (``KL_CLAMP``); below it ∂k3/∂logp = 1 - exp(δ).
    """
    delta = torch.clamp(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -KL_CLAMP, KL_CLAMP)


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
    sampled them. The sampler records the same quantity: ``log_softmax(logits
    / T)`` at the sampled token, *before* top-p truncation (actors/engines/torch/sampling.py).
    T = 0 (greedy) is refused: an argmax has no distribution to score (the
    sampler records ``log_softmax(logits)``, T = 1, for greedy tokens), so the
    run config requires ``rollout.temperature > 0``.

    Args:
        logits: ``[B, L, V]``.
        targets: ``[B, L]`` long.

    Returns:
        ``[B, L]`` float32.
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0, got {temperature}: greedy (T = 0) tokens have no "
            "sampling distribution for the learner to score; train with T > 0"
        )
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

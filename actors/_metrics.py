"""Per-batch rollout metrics computed by the learner from the trajectories it trains on.

Every metric name is documented in docs/metrics.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import fmean

import structlog

from agentrl.messages import Trajectory

log = structlog.get_logger(__name__)

__all__ = ["batch_metrics", "has_spread", "is_success", "turn_versions"]


def is_success(t: Trajectory) -> bool:
    """An episode succeeded when it completed with full reward (or its env says so)."""
    if "success" in t.metrics:
        return t.metrics["success"] >= 0.5
    return t.status == "completed" and t.env_reward >= 1.0


def batch_metrics(batch: list[Trajectory], version: int, wall: float) -> dict[str, float]:
    """Rollout, per-task and staleness metrics of one training batch.

    `version` is the version the batch produced (v + 1); staleness is measured
    against the version that trained on it (v).
    """
    trained_on = version - 1
    out: dict[str, float] = {
        "rollout/episodes": float(len(batch)),
        "rollout/episodes_per_s": len(batch) / max(wall, 1e-9),
        "rollout/reward": fmean(t.reward for t in batch),
        "rollout/success": fmean(is_success(t) for t in batch),
        "rollout/turns": fmean(t.num_turns for t in batch),
        "rollout/malformed_turns": fmean(t.metrics.get("malformed_turns", 0.0) for t in batch),
        "rollout/tokens": fmean(len(t.token_ids) for t in batch),
        "rollout/assistant_tokens": fmean(sum(t.loss_mask) for t in batch),
        "rollout/episode_time": fmean(t.timings.get("episode", 0.0) for t in batch),
    }
    for status, n in Counter(t.status for t in batch).items():
        out[f"rollout/status/{status}"] = n / len(batch)
    out.update(_signal_metrics(batch))
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in batch:
        by_task[t.task].append(t)
    for task, ts in by_task.items():
        out[f"env/{task}/reward"] = fmean(t.reward for t in ts)
        out[f"env/{task}/success"] = fmean(is_success(t) for t in ts)
        out[f"env/{task}/episodes"] = float(len(ts))
        out[f"env/{task}/malformed_turns"] = fmean(
            t.metrics.get("malformed_turns", 0.0) for t in ts
        )
        for status, n in Counter(t.status for t in ts).items():
            out[f"env/{task}/status/{status}"] = n / len(ts)
        # what the task itself reported on its finishing step (``env/<name>``), averaged
        # over the episodes that report it
        reported: dict[str, list[float]] = defaultdict(list)
        for t in ts:
            for key, value in t.metrics.items():
                if key.startswith("env/"):
                    reported[key.removeprefix("env/")].append(float(value))
        for name, values in reported.items():
            out.setdefault(f"env/{task}/{name}", fmean(values))
    issue_lag = [trained_on - t.issued_version for t in batch]
    token_lag = [
        trained_on - v for t in batch for v, m in zip(t.versions, t.loss_mask, strict=True) if m
    ]
    out["staleness/issue_lag_mean"] = fmean(issue_lag)
    out["staleness/issue_lag_max"] = float(max(issue_lag))
    if token_lag:
        out["staleness/token_lag_mean"] = fmean(token_lag)
        out["staleness/token_lag_max"] = float(max(token_lag))
    turns: list[tuple[str, int]] = []
    for t in batch:
        try:
            turns += turn_versions(t)
        except ValueError as exc:  # a malformed record must not stop training
            log.warning("trajectory left out of the turn metrics", reason=str(exc))
    pools = Counter(pool for pool, _ in turns)
    for pool, n in pools.items():
        out[f"rollout/pool_share/{pool}"] = n / len(turns)
        lags = [trained_on - v for p, v in turns if p == pool]
        out[f"staleness/turn_lag/{pool}"] = fmean(lags)
        out[f"staleness/turn_lag_max/{pool}"] = float(max(lags))
    return out


def has_spread(group: list[Trajectory]) -> bool:
    """A GRPO group's rewards differ (max > min): the trajectory-side twin of
    ``trainer.group_spread``; without spread the group's advantage is exactly 0."""
    return max(t.reward for t in group) > min(t.reward for t in group)


def _signal_metrics(batch: list[Trajectory]) -> dict[str, float]:
    """How much of the batch carries a GRPO learning signal.

    A group whose rewards are all equal gets advantage exactly 0 (``group_advantages``):
    its sampled tokens are trained on (forward, backward, KL) but move the policy only
    through the KL term. ``rollout/groups_with_spread`` is the share of the batch's groups
    with reward spread (max > min); ``rollout/signal_tokens`` the share of its sampled
    (``loss_mask``) tokens in those groups; ``env/<task>/groups_with_spread`` per task.
    """
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in batch:
        groups[t.group_id].append(t)
    spread = {g: has_spread(ts) for g, ts in groups.items()}
    tokens = sum(sum(t.loss_mask) for t in batch)
    signal = sum(sum(t.loss_mask) for t in batch if spread[t.group_id])
    out = {
        "rollout/groups_with_spread": fmean(spread.values()),
        "rollout/signal_tokens": signal / tokens if tokens else 0.0,
    }
    by_task: dict[str, list[bool]] = defaultdict(list)
    for g, ts in groups.items():
        by_task[ts[0].task].append(spread[g])
    for task, flags in by_task.items():
        out[f"env/{task}/groups_with_spread"] = fmean(flags)
    return out


def turn_versions(t: Trajectory) -> list[tuple[str, int]]:
    """(pool, version) of each assistant turn of a trajectory.

    Turns are the runs of sampled tokens (``loss_mask == 1``) in order; turn i was
    sampled by pool ``t.pools[i]`` with the version of its first token.
    """
    versions = []
    previous = 0
    for m, v in zip(t.loss_mask, t.versions, strict=True):
        if m and not previous:
            versions.append(v)
        previous = m
    if len(versions) != len(t.pools):
        raise ValueError(
            f"trajectory {t.episode_id}: {len(versions)} sampled turns but {len(t.pools)} pools"
        )
    return list(zip(t.pools, versions, strict=True))

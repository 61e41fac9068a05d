"""One Trajectory builder for the tests: bookkeeping fields defaulted, the rest given."""

from __future__ import annotations

from agentrl.messages import Trajectory


def trajectory(
    loss_mask: list[int],
    *,
    group: str = "g",
    reward: float = 0.0,
    logprob: float = -1.0,
    version: int = 0,
    **fields,
) -> Trajectory:
    """A trajectory whose assistant tokens (mask 1) carry `logprob` and `version`.

    Every other Trajectory field may be given in `fields`; the defaults describe a
    completed one-turn episode of task `t` with token ids 1..n.
    """
    n = len(loss_mask)
    values = {
        "episode_id": f"{group}-{reward}-{n}",
        "group_id": group,
        "task": "t",
        "index": 0,
        "sample_idx": 0,
        "group_size": 2,
        "issued_version": 0,
        "token_ids": list(range(1, n + 1)),
        "loss_mask": loss_mask,
        "logprobs": [logprob * m for m in loss_mask],
        "versions": [version if m else -1 for m in loss_mask],
        "pools": ["current"],
        "reward": reward,
        "env_reward": reward,
        "status": "completed",
        "num_turns": 1,
        "timings": {},
        "metrics": {},
    }
    values.update(fields)
    return Trajectory(**values)

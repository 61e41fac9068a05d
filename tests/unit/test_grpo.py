"""GRPO maths and batch building, against hand-computed values.

Equations are the ones in the docstrings of agentrl.trainer._grpo (DESIGN.md
"The method"); each expected value is worked out in the comment beside it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.messages import Trajectory
from agentrl.trainer import (
    build_batch,
    episode_reward,
    group_advantages,
    group_spread,
    k3_kl,
    micro_batches,
    ppo_clip_loss,
    task_normalize,
    token_logprobs,
    token_mean,
)
from tests.unit.records import trajectory

SQRT3 = math.sqrt(3.0)


def traj(
    group: str,
    task: str,
    reward: float,
    loss_mask: list[int],
    *,
    status: str = "completed",
    **fields,
) -> Trajectory:
    """A trajectory with only the fields build_batch reads set to something meaningful."""
    return trajectory(
        loss_mask, group=group, reward=reward, logprob=-0.5, task=task, status=status, **fields
    )


# --- episode_reward ---------------------------------------------------------------


def test_episode_reward_keeps_env_reward_only_when_completed() -> None:
    assert episode_reward(1.0, "completed") == 1.0
    assert episode_reward(0.37, "completed") == 0.37
    for status in ("task_limit_reached", "agent_context_limit", "agent_invalid_action"):
        assert episode_reward(1.0, status) == -0.2  # any other end: the penalty
    assert episode_reward(1.0, "agent_validation_failed", penalty=-0.5) == -0.5


# --- group_advantages ---------------------------------------------------------------


def test_group_advantages_hand_values() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.7, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 5, 5, 5, 9, 2, 2])
    adv = group_advantages(rewards, groups)
    # group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3) -> A = ±0.5 * sqrt(3) = ±0.866025
    expected0 = [0.5 * SQRT3, -0.5 * SQRT3, 0.5 * SQRT3, -0.5 * SQRT3]
    # group 5: mean 1/3, deviations (2/3, -1/3, -1/3), sum sq 2/3, /2 -> var 1/3, std 1/sqrt(3)
    #   A = (2/3)*sqrt(3) = 1.154701, (-1/3)*sqrt(3) = -0.577350
    expected5 = [2 / 3 * SQRT3, -1 / 3 * SQRT3, -1 / 3 * SQRT3]
    # group 9: a single episode -> 0; group 2: equal rewards (max == min) -> exactly 0
    expected = torch.tensor([*expected0, *expected5, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    assert group_spread(rewards, groups).tolist() == [True] * 7 + [False] * 3  # groups 9, 2 flat


def test_a_flat_group_gets_exactly_zero_advantage() -> None:
    rewards = torch.full((8,), -0.2)  # eight failures: every reward is the penalty
    groups = torch.zeros(8, dtype=torch.long)
    # In float32 mean(8 x -0.2) != -0.2, so (R - mean) / (std + 1e-6) used to leave
    # +0.0147 on every episode; max == min now gives exact zeros.
    assert torch.equal(group_advantages(rewards, groups), torch.zeros(8))
    assert not group_spread(rewards, groups).any()
    # A spread group keeps an episode that sits exactly on the mean: (0, 0.5, 1) has
    # mean 0.5, sample std 0.5 -> A = (-1, 0, 1) (/ (0.5 + 1e-6)), all three "spread".
    mixed = group_advantages(torch.tensor([0.0, 0.5, 1.0]), torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(mixed, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5, rtol=0)
    assert group_spread(torch.tensor([0.0, 0.5, 1.0]), torch.zeros(3, dtype=torch.long)).all()


def test_group_advantages_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


# --- task_normalize ---------------------------------------------------------------


def test_task_normalize_scale_hand_values() -> None:
    adv = torch.tensor([[2.0, 2.0, 9.0], [-1.0, 7.0, 7.0], [5.0, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    task = torch.tensor([0, 0, 1])
    out = task_normalize(adv, mask, task, torch.tensor([True, True, True]))
    # task 0 masked values (2, 2, -1): rms sqrt((4 + 4 + 1) / 3) = sqrt(3)
    #   -> (2/sqrt3, 2/sqrt3, -1/sqrt3) = (1.154701, 1.154701, -0.577350): signs kept
    # task 1 has one masked token 5: rms 5 -> 1. Unmasked stay 0 (the 9s and 7s).
    expected = torch.tensor([[2 / SQRT3, 2 / SQRT3, 0.0], [-1 / SQRT3, 0.0, 0.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_task_normalize_centred_hand_values() -> None:
    adv = torch.tensor([[2.0, 2.0, 9.0], [-1.0, 7.0, 7.0], [5.0, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    task = torch.tensor([0, 0, 1])
    out = task_normalize(adv, mask, task, torch.tensor([True, True, True]), center=True)
    # task 0 masked values (2, 2, -1): mean 1, sample std sqrt((1 + 1 + 4) / 2) = sqrt(3)
    #   -> (1/sqrt3, 1/sqrt3, -2/sqrt3) = (0.577350, 0.577350, -1.154701)
    # task 1 has one masked token: sigma 0 and A == mu -> 0. Unmasked stay 0 (the 9s and 7s).
    expected = torch.tensor([[1 / SQRT3, 1 / SQRT3, 0.0], [-2 / SQRT3, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_task_normalize_uses_only_rows_of_groups_with_spread() -> None:
    adv = torch.tensor(
        [
            [3.0, 1.0, 0.0],  # task 0, spread group
            [-1.0, 0.0, 0.0],  # task 0, spread group
            [0.2, 0.2, 0.2],  # task 0, flat group (a float residue)
            [0.01, 0.01, 0.0],  # task 1, flat group only
            [-0.01, 0.0, 0.0],  # task 1, flat group only
        ]
    )
    mask = torch.tensor(
        [
            [1.0, 1.0, 0.0],
            [1.0, 0.0, 0.0],
            [1.0, 1.0, 1.0],
            [1.0, 1.0, 0.0],
            [1.0, 0.0, 0.0],
        ]
    )
    task = torch.tensor([0, 0, 0, 1, 1])
    spread = torch.tensor([True, True, False, False, False])
    scaled = task_normalize(adv, mask, task, spread)
    # scaled, over the spread rows only: (3, 1, -1), rms sqrt(11 / 3) = 1.914854
    #   -> (1.566699, 0.522233, -0.522233); flat rows and task 1 exactly 0.
    r = math.sqrt(11 / 3)
    torch.testing.assert_close(
        scaled[:2], torch.tensor([[3 / r, 1 / r, 0.0], [-1 / r, 0.0, 0.0]]), atol=1e-5, rtol=1e-5
    )
    assert torch.equal(scaled[2:], torch.zeros(3, 3))
    out = task_normalize(adv, mask, task, spread, center=True)
    # task 0 over the spread rows only: (3, 1, -1), mean 1, sample std sqrt((4 + 0 + 4) / 2) = 2
    #   -> (1, 0, -1); the flat row stays exactly 0 (counted in, its three 0.2s would move
    #   the mean to 3.6 / 6 = 0.6, std sqrt(8.96 / 5) = 1.3387: (0.2 - 0.6) / 1.3387 = -0.299).
    # task 1 has no spread group: all exactly 0 (before: its ±0.01 residue became ~±1).
    expected = torch.tensor(
        [
            [1.0, 0.0, 0.0],
            [-1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[2:], torch.zeros(3, 3))  # exact zeros, not merely small


# --- ppo_clip_loss ------------------------------------------------------------------


def _ppo_case() -> tuple[torch.Tensor, ...]:
    ratio = torch.tensor([[1.5, 0.5, 1.1, 5.0, 0.5, 9.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    old = torch.full_like(ratio, -2.0)
    logp = (old + ratio.log()).requires_grad_(True)
    return logp, old, adv, mask


def test_ppo_clip_loss_with_dual_clip_hand_values() -> None:
    # Several optimiser steps per batch: the proximal policy is `old`, which here also
    # sampled the tokens (w = 1), so this is plain PPO on r = pi / pi_old.
    logp, old, adv, mask = _ppo_case()
    loss, stats = ppo_clip_loss(logp, old, adv, mask, prox_logp=old)
    # pg = max(-A r, -A clip(r, 0.8, 1.2)); where A < 0: min(pg, -3A)
    # 1: A= 1, r=1.5: max(-1.5, -1.2) = -1.2            (clipped branch)
    # 2: A= 1, r=0.5: max(-0.5, -0.8) = -0.5
    # 3: A=-1, r=1.1: max( 1.1,  1.1) =  1.1, min(1.1, 3) = 1.1
    # 4: A=-1, r=5.0: max( 5.0,  1.2) =  5.0, min(5.0, 3) = 3.0   (dual clip)
    # 5: A=-2, r=0.5: max( 1.0,  1.6) =  1.6, min(1.6, 6) = 1.6   (clipped branch)
    # 6: masked -> 0
    expected = torch.tensor([[-1.2, -0.5, 1.1, 3.0, 1.6, 0.0]])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)  # tokens 1 and 5
    assert stats["dual_clip_frac"].item() == pytest.approx(1 / 5)  # token 4
    assert stats["ratio_mean"].item() == pytest.approx(8.6 / 5, rel=1e-5)  # (1.5+.5+1.1+5+.5)/5
    # approx_kl = mean(r - 1 - ln r) = (0.094535 + 0.193147 + 0.004690 + 2.390562 + 0.193147) / 5
    assert stats["approx_kl"].item() == pytest.approx(2.876081 / 5, rel=1e-5)
    assert stats["is_weight_mean"].item() == pytest.approx(1.0)  # behaviour == proximal: w = 1
    assert stats["is_clip_frac"].item() == 0.0

    # Gradient d pg / d logp = d pg / d r * r: 0 on clipped and dual-clipped tokens,
    # -A r on unclipped: token 2: -0.5, token 3: 1.1.
    loss.sum().backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, -0.5, 1.1, 0.0, 0.0, 0.0]]), atol=1e-5, rtol=1e-5
    )


def test_ppo_clip_loss_without_dual_clip() -> None:
    logp, old, adv, mask = _ppo_case()
    loss, stats = ppo_clip_loss(logp, old, adv, mask, dual_clip=None, prox_logp=old)
    assert loss[0, 3].item() == pytest.approx(5.0, rel=1e-5)  # -A r = 5, no bound
    assert stats["dual_clip_frac"].item() == 0.0


def test_ppo_clip_loss_asymmetric_clip() -> None:
    logp, old, adv, mask = _ppo_case()
    loss, _ = ppo_clip_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.4, prox_logp=old)
    # token 1: A=1, r=1.5: max(-1.5, -1.4) = -1.4; token 5: A=-2, r=0.5: max(1.0, 1.8) = 1.8
    assert loss[0, 0].item() == pytest.approx(-1.4, rel=1e-5)
    assert loss[0, 4].item() == pytest.approx(1.8, rel=1e-5)


def test_ppo_clip_loss_rejects_dual_clip_below_one() -> None:
    logp, old, adv, mask = _ppo_case()
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, old, adv, mask, dual_clip=0.9)
    with pytest.raises(ValueError, match="is_cap"):
        ppo_clip_loss(logp, old, adv, mask, is_cap=0.5)


def _decoupled_case() -> tuple[torch.Tensor, ...]:
    """Current logprobs and behaviour logprobs with w = pi / pi_behav = 0.5, 1.5, 4, 10, 1."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]], requires_grad=True)
    weight = torch.tensor([[0.5, 1.5, 4.0, 10.0, 1.0]])
    behav = logp.detach() - weight.log()
    adv = torch.tensor([[1.0, -1.0, 2.0, -2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return logp, behav, adv, mask


def test_decoupled_loss_with_truncated_importance_weight_hand_values() -> None:
    # One optimiser step per batch: proximal = current weights, r = exp(logp - sg(logp)) = 1,
    # loss = -min(w, C) A exp(logp - sg(logp)) with C = 2 (the default is_cap).
    logp, behav, adv, mask = _decoupled_case()
    loss, stats = ppo_clip_loss(logp, behav, adv, mask)
    # 1: w = 0.5,          A =  1 -> -0.5 * 1  = -0.5
    # 2: w = 1.5,          A = -1 -> -1.5 * -1 =  1.5
    # 3: w = 4 -> min 2,   A =  2 -> -2 * 2    = -4.0   (truncated)
    # 4: w = 10 -> min 2,  A = -2 -> -2 * -2   =  4.0   (truncated)
    # 5: masked -> 0
    expected = torch.tensor([[-0.5, 1.5, -4.0, 4.0, 0.0]])
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    # d loss / d logp = -min(w, C) A: the same numbers (d exp(logp - sg(logp)) / d logp = 1)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, expected, atol=1e-5, rtol=1e-5)
    assert stats["clip_frac"].item() == 0.0  # r = 1 never reaches a clip bound
    assert stats["dual_clip_frac"].item() == 0.0
    assert stats["is_weight_mean"].item() == pytest.approx(1.5)  # (0.5 + 1.5 + 2 + 2) / 4
    assert stats["is_clip_frac"].item() == pytest.approx(0.5)  # tokens 3 and 4 of 4
    assert stats["ratio_mean"].item() == pytest.approx(4.0, rel=1e-5)  # (0.5 + 1.5 + 4 + 10) / 4
    # approx_kl = mean(w - 1 - ln w) = (0.193147 + 0.094535 + 1.613706 + 6.697415) / 4
    assert stats["approx_kl"].item() == pytest.approx(8.598803 / 4, rel=1e-5)

    untruncated, _ = ppo_clip_loss(logp, behav, adv, mask, is_cap=None)
    assert untruncated[0, 3].item() == pytest.approx(20.0, rel=1e-5)  # -10 * -2, no cap


def test_decoupled_loss_with_a_proximal_policy_apart_from_both() -> None:
    # Several steps per batch: r = pi / pi_prox is clipped as in PPO, then weighted by
    # min(pi_prox / pi_behav, C).
    prox = torch.tensor([[-1.0, -1.0]])
    logp = prox + torch.tensor([[1.5, 5.0]]).log()  # r = 1.5, 5
    behav = prox - torch.tensor([[0.5, 4.0]]).log()  # w = 0.5, 4 (-> 2)
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = ppo_clip_loss(logp, behav, adv, torch.ones(1, 2), prox_logp=prox)
    # 1: A =  1, r = 1.5: max(-1.5, -1.2) = -1.2 (clipped), * 0.5 = -0.6
    # 2: A = -1, r = 5:   max(5, 1.2) = 5, min(5, 3) = 3 (dual clip), * min(4, 2) = 6
    torch.testing.assert_close(loss, torch.tensor([[-0.6, 6.0]]), atol=1e-5, rtol=1e-5)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["dual_clip_frac"].item() == pytest.approx(0.5)


def test_log_ratios_are_clamped_before_exp() -> None:
    logp = torch.tensor([[-1.0, -50.0]], requires_grad=True)
    behav = torch.tensor([[-51.0, -1.0]])  # log w = +50 and -49: clamped to +20 and -20
    adv = torch.tensor([[1.0, 1.0]])
    loss, stats = ppo_clip_loss(logp, behav, adv, torch.ones(1, 2), is_cap=None)
    # w = e^20 = 4.851652e8 and e^-20 = 2.061154e-9 (not inf and not 0 * nan)
    torch.testing.assert_close(
        loss, -torch.tensor([[math.exp(20.0), math.exp(-20.0)]]), rtol=1e-5, atol=0
    )
    assert torch.isfinite(stats["approx_kl"])
    # k3 KL: delta = ref - logp = 30 -> clamped 20: e^20 - 20 - 1 = 4.851652e8, finite,
    #   then the value clamp (KL_CLAMP) -> 10
    assert k3_kl(torch.tensor([-40.0]), torch.tensor([-10.0])).item() == pytest.approx(10.0)


def test_task_normalize_keeps_signs_where_recentring_flips_them() -> None:
    """Three reward levels, lengths that differ (issue 24's example): rewards [1, 0, 0,
    -0.2 x 5] with 30, 40, 40, 5 x 300 tokens."""
    trajectories = [traj("g", "os", r, [0] + [1] * n) for r, n in [(1.0, 30), (0.0, 40)]]
    trajectories += [traj("g", "os", 0.0, [0] + [1] * 40)]
    trajectories += [traj("g", "os", -0.2, [0] + [1] * 300) for _ in range(5)]
    # group: mean 0, sample std sqrt(1.2 / 7) = 0.414039 -> A = (2.415224, 0, 0, -0.483045 x 5)
    # scaled: token rms sqrt((30 * 2.415224^2 + 1500 * 0.483045^2) / 1610) = 0.571035
    #   -> (4.229518, 0, 0, -0.845904): same directions
    # centred: token mean -0.405034, std 0.402787 -> (7.004153, +1.005916, +1.005916, -0.193732):
    #   the two completed-but-wrong episodes reinforced
    first = [0, 1, 2, 3]
    scaled = build_batch(trajectories, pad_id=0).advantages[first, 1]
    centred = build_batch(trajectories, pad_id=0, task_center=True).advantages[first, 1]
    torch.testing.assert_close(
        scaled, torch.tensor([4.229518, 0.0, 0.0, -0.845904]), atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(
        centred, torch.tensor([7.004153, 1.005916, 1.005916, -0.193732]), atol=1e-4, rtol=1e-4
    )


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda rows: st.tuples(
            st.lists(
                st.floats(-5, 5, width=32, allow_subnormal=False),
                min_size=rows * 4,
                max_size=rows * 4,
            ),
            st.lists(st.booleans(), min_size=rows * 4, max_size=rows * 4),
            st.lists(st.integers(0, 2), min_size=rows, max_size=rows),
            st.lists(st.booleans(), min_size=rows, max_size=rows),
        )
    )
)
def test_task_normalize_never_changes_an_advantages_sign(case) -> None:
    values, masked, tasks, spreads = case
    rows = len(tasks)
    adv = torch.tensor(values).reshape(rows, 4)
    mask = torch.tensor(masked, dtype=torch.float32).reshape(rows, 4)
    spread = torch.tensor(spreads)
    out = task_normalize(adv, mask, torch.tensor(tasks), spread)
    kept = mask.bool() & spread[:, None]
    assert torch.equal(torch.sign(out[kept]), torch.sign(adv[kept]))
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))
    assert torch.isfinite(out).all()


# --- k3_kl, token_mean, token_logprobs -----------------------------------------------


def test_k3_kl_hand_values() -> None:
    logp = torch.tensor([math.log(0.5), math.log(0.3)])
    ref = torch.tensor([math.log(0.25), math.log(0.3)])
    # delta = ln(0.25 / 0.5) = -0.693147: exp(delta) - delta - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # identical policies -> 0
    torch.testing.assert_close(k3_kl(logp, ref), torch.tensor([0.193147, 0.0]), atol=1e-5, rtol=0)


def test_k3_kl_is_clamped_at_10_with_no_gradient_beyond() -> None:
    logp = torch.tensor([-1.0, -12.0, -2.0], requires_grad=True)
    ref = torch.tensor([0.0, -2.0, -2.0])
    kl = k3_kl(logp, ref)
    # delta = ref - logp: 1 -> e - 2 = 0.718282, gradient d/dlogp = 1 - e = -1.718282
    # delta = 10 -> e^10 - 11 = 22015.47, clamped to 10 (KL_CLAMP), gradient 0
    # delta = 0 -> 0, gradient 0
    torch.testing.assert_close(kl.detach(), torch.tensor([0.718282, 10.0, 0.0]), atol=1e-5, rtol=0)
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-1.718282, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_token_mean_weighs_every_token_equally() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert token_mean(x, mask).item() == pytest.approx(3.0)  # (1 + 2 + 6) / 3, not mean of rows
    assert token_mean(x, torch.zeros_like(mask)).item() == 0.0  # sum 0 / max(0, 1)


def test_token_logprobs_hand_values_and_temperature() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    targets = torch.tensor([[1, 0]])
    # softmax([0, ln 3]) = (0.25, 0.75): ln 0.75 = -0.287682, ln 0.25 = -1.386294
    torch.testing.assert_close(
        token_logprobs(logits, targets, 1.0),
        torch.tensor([[-0.287682, -1.386294]]),
        atol=1e-5,
        rtol=0,
    )
    # T = 0.5: logits / T = [0, ln 9] -> (0.1, 0.9): ln 0.9 = -0.105361, ln 0.1 = -2.302585
    torch.testing.assert_close(
        token_logprobs(logits, targets, 0.5),
        torch.tensor([[-0.105361, -2.302585]]),
        atol=1e-5,
        rtol=0,
    )


def test_token_logprobs_refuses_greedy_temperature() -> None:
    logits = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="greedy"):
        token_logprobs(logits, torch.zeros(1, 2, dtype=torch.long), 0.0)


def test_token_logprobs_chunks_match_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    reference = torch.log_softmax(logits / 0.8, dim=-1).gather(-1, targets[..., None])[..., 0]
    got = token_logprobs(logits, targets, 0.8, chunk_tokens=4)  # 15 positions: 4 chunks
    torch.testing.assert_close(got, reference, atol=1e-6, rtol=1e-6)


# --- build_batch ---------------------------------------------------------------------


def test_build_batch_aligns_everything_to_targets() -> None:
    t = traj(
        "g",
        "os",
        1.0,
        [0, 0, 1, 1],
        token_ids=[10, 11, 12, 13],
        logprobs=[0.0, 0.0, -0.5, -0.7],
        versions=[-1, -1, 3, 4],
    )
    short = traj("g", "os", 0.0, [0, 1], token_ids=[20, 21], logprobs=[0.0, -0.1])
    batch = build_batch([t, short], pad_id=0)
    # Position t predicts token t + 1: token 12 (sampled) is the target of position 1.
    assert batch.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert batch.targets().tolist() == [[11, 12, 13, 0], [21, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    torch.testing.assert_close(
        batch.old_logprobs, torch.tensor([[0.0, -0.5, -0.7, 0.0], [-0.1, 0.0, 0.0, 0.0]])
    )
    assert batch.versions.tolist() == [[-1, 3, 4, -1], [0, -1, -1, -1]]
    assert batch.num_tokens == 3
    assert batch.tasks == ("os",)


def test_build_batch_does_not_repenalise() -> None:
    # status says "limit", but reward is what the rollout decided (already penalised or not)
    a = traj("g", "kg", 0.3, [0, 1], status="task_limit_reached")
    b = traj("g", "kg", 1.0, [0, 1])
    batch = build_batch([a, b], pad_id=0)
    torch.testing.assert_close(batch.rewards, torch.tensor([0.3, 1.0]))


def test_build_batch_advantages_are_task_normalised_before_the_loss() -> None:
    trajectories = [
        # task "alf", group g1: rewards 1 / 0 -> A = ±0.707107 (sample std 0.707107)
        traj("g1", "alf", 1.0, [0, 1, 1]),  # two masked tokens
        traj("g1", "alf", 0.0, [0, 1]),  # one masked token
        # task "db", group g2: rewards -0.2 / 1.0 -> A = ∓0.707107
        traj("g2", "db", -0.2, [0, 1, 1, 1]),  # three masked tokens
        traj("g2", "db", 1.0, [0, 1]),  # one masked token
    ]
    scaled = build_batch(trajectories, pad_id=0)
    # scaled (the default): alf tokens (0.7071, 0.7071, -0.7071), rms 0.7071 -> (1, 1, -1);
    #   db tokens (-0.7071 x3, 0.7071), rms 0.7071 -> (-1, -1, -1, 1)
    torch.testing.assert_close(
        scaled.advantages,
        torch.tensor(
            [[1.0, 1.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0], [1.0, 0, 0, 0]]
        ),
        atol=1e-5,
        rtol=1e-5,
    )
    batch = build_batch(trajectories, pad_id=0, task_center=True)
    assert batch.tasks == ("alf", "db")
    assert batch.task_index.tolist() == [0, 0, 1, 1]
    assert batch.group_index.tolist() == [0, 0, 1, 1]
    # centred: alf tokens (0.7071, 0.7071, -0.7071): mean 0.2357, sample std 0.8165
    #   -> (0.57735, 0.57735, -1.154701)
    # db tokens (-0.7071 x3, 0.7071): mean -0.35355, sample std 0.70711
    #   -> (-0.5, -0.5, -0.5, 1.5)
    expected = torch.tensor(
        [
            [1 / SQRT3, 1 / SQRT3, 0.0, 0.0],
            [-2 / SQRT3, 0.0, 0.0, 0.0],
            [-0.5, -0.5, -0.5, 0.0],
            [1.5, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(batch.advantages, expected, atol=1e-5, rtol=1e-5)
    # The loss consumes the normalised advantages as they are: at ratio 1 the
    # per-token loss is exactly -Ã, and (centred) the batch token mean of Ã per task is 0.
    loss, _ = ppo_clip_loss(
        batch.old_logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask
    )
    torch.testing.assert_close(loss, -batch.advantages)
    for task in range(2):
        rows = batch.task_index == task
        assert token_mean(batch.advantages[rows], batch.loss_mask[rows]).item() == pytest.approx(
            0.0, abs=1e-6
        )


def test_build_batch_does_not_reinforce_a_long_all_fail_group() -> None:
    trajectories = [
        # group g1 (spread): the success is short, the failure long
        traj("g1", "os", 1.0, [0, 1]),  # 1 token, A = +0.707107
        traj("g1", "os", 0.0, [0, 1, 1, 1]),  # 3 tokens, A = -0.707107
        # group g2 (flat): two long failures, every reward the penalty
        traj("g2", "os", -0.2, [0, 1, 1, 1, 1]),
        traj("g2", "os", -0.2, [0, 1, 1, 1, 1]),
    ]
    batch = build_batch(trajectories, pad_id=0)
    # task statistics over g1's tokens only: (0.7071, -0.7071 x3): rms 0.707107
    #   -> (1, -1, -1, -1) (centred: mean -0.353553, std 0.707107 -> (1.5, -0.5, -0.5, -0.5))
    # g2 stays exactly 0. Had its 8 zero tokens entered the centred statistics (12 values:
    #   mean -0.117851, std 0.408248) each would get +0.288675: the failures reinforced.
    expected = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [-1.0, -1.0, -1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(batch.advantages, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.advantages[2:], torch.zeros(2, 5))
    assert batch.num_tokens == 12  # the flat group still counts in the token-mean denominator


def test_build_batch_gives_zeros_to_a_task_without_a_mixed_group() -> None:
    trajectories = [
        traj("g1", "alf", 1.0, [0, 1, 1]),
        traj("g1", "alf", 0.0, [0, 1]),
        traj("g2", "db", -0.2, [0, 1, 1, 1]),  # "db": one group, all failed
        traj("g2", "db", -0.2, [0, 1]),
    ]
    batch = build_batch(trajectories, pad_id=0)
    # alf as in the test above: (0.7071, 0.7071, -0.7071) -> (1, 1, -1)
    # db: no group with spread -> exactly 0 (before: float residue normalised to ~±1)
    assert torch.equal(batch.advantages[2:], torch.zeros(2, 4))
    torch.testing.assert_close(
        batch.advantages[0, :2], torch.tensor([1.0, 1.0]), atol=1e-5, rtol=1e-5
    )


def test_build_batch_without_task_normalisation_keeps_group_advantages() -> None:
    trajectories = [
        traj("g1", "alf", 1.0, [0, 1, 1]),
        traj("g1", "alf", 0.0, [0, 1]),
        traj("g2", "db", -0.2, [0, 1, 1, 1]),
        traj("g2", "db", 1.0, [0, 1]),
    ]
    batch = build_batch(trajectories, pad_id=0, task_normalize=False)
    a = 1 / math.sqrt(2.0)  # two rewards, sample std |R1 - R2| / sqrt(2): A = ±1/sqrt(2)
    expected = torch.tensor(
        [[a, a, 0.0, 0.0], [-a, 0.0, 0.0, 0.0], [-a, -a, -a, 0.0], [a, 0.0, 0.0, 0.0]]
    )
    torch.testing.assert_close(batch.advantages, expected, atol=1e-5, rtol=1e-5)


def test_build_batch_masks_tokens_older_than_max_token_lag() -> None:
    old = traj(
        "g",
        "os",
        1.0,
        [0, 1, 1, 1],
        logprobs=[0.0, -0.1, -0.2, -0.3],
        versions=[-1, 5, 6, 7],
    )
    fresh = traj("g", "os", 0.0, [0, 1], versions=[-1, 9])
    batch = build_batch([old, fresh], pad_id=0, version=10, max_token_lag=4)
    # lags 10 - (5, 6, 7) = 5, 4, 3 and 10 - 9 = 1: only the version-5 token (lag 5 > 4) goes
    assert batch.masked_old_tokens == 1
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert batch.versions.tolist() == [[-1, 6, 7, -1], [9, -1, -1, -1]]
    torch.testing.assert_close(
        batch.old_logprobs, torch.tensor([[0.0, -0.2, -0.3, 0.0], [-0.5, 0.0, 0.0, 0.0]])
    )
    assert batch.advantages[0, 0].item() == 0.0  # the masked token trains on nothing
    # task statistics over the 3 remaining tokens (0.7071, 0.7071, -0.7071): rms 0.7071
    #   -> (1, 1, -1)
    torch.testing.assert_close(
        batch.advantages[:, :3],
        torch.tensor([[0.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]),
        atol=1e-5,
        rtol=1e-5,
    )
    # without the learner's version (or the bound) nothing is masked
    assert build_batch([old, fresh], pad_id=0, max_token_lag=4).masked_old_tokens == 0
    assert build_batch([old, fresh], pad_id=0, version=10).num_tokens == 4


def test_build_batch_rejects_bad_trajectories() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build_batch([], pad_id=0)
    with pytest.raises(ValueError, match="first token"):
        build_batch([traj("g", "os", 1.0, [1, 1])], pad_id=0)
    bad = traj("g", "os", 1.0, [0, 1], logprobs=[0.0])
    with pytest.raises(ValueError, match="lengths differ"):
        build_batch([bad], pad_id=0)


def test_micro_batches_bound_tokens_and_keep_every_row() -> None:
    lengths = [3, 9, 5, 2, 7, 4]
    batch = build_batch(
        [traj(f"g{i % 2}", "os", float(i % 2), [0] + [1] * (n - 1)) for i, n in enumerate(lengths)],
        pad_id=0,
    )
    micros = micro_batches(batch, max_tokens=12)
    # sorted lengths 9, 7, 5, 4, 3, 2; a chunk holds rows * its longest <= 12:
    #   [9] (2 * 9 > 12), [7] (2 * 7 > 12), [5, 4] (3 * 5 > 12), [3, 2] -> widths 9, 7, 5, 3
    assert [m.input_ids.shape for m in micros] == [(1, 9), (1, 7), (2, 5), (2, 3)]
    assert all(m.input_ids.numel() <= 12 for m in micros)
    assert sum(m.num_tokens for m in micros) == batch.num_tokens  # 2 + 8 + 4 + 1 + 6 + 3 = 24
    assert sorted(r for m in micros for r in m.rewards.tolist()) == sorted(batch.rewards.tolist())
    # a single row longer than the budget still gets its own micro-batch
    assert micro_batches(batch, max_tokens=4)[0].input_ids.shape == (1, 9)

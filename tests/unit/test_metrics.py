"""batch_metrics by hand: per-task, status, staleness and per-pool turn figures."""

from __future__ import annotations

import pytest

from agentrl.actors import batch_metrics
from agentrl.actors._metrics import turn_versions
from tests.unit.records import trajectory


def two_turns(pools, versions, **fields):
    """prompt(2) turn(2) observation(1) turn(3), the turns from `pools` at `versions`."""
    mask = [0, 0, 1, 1, 0, 1, 1, 1]
    t = trajectory(mask, pools=list(pools), num_turns=2, **fields)
    per_token = [-1, -1, versions[0], versions[0], -1, versions[1], versions[1], versions[1]]
    return type(t)(**{**{f: getattr(t, f) for f in t.__slots__}, "versions": per_token})


def test_turn_versions_split_the_sampled_runs():
    t = two_turns(["current", "stale"], [5, 2])
    assert turn_versions(t) == [("current", 5), ("stale", 2)]
    with pytest.raises(ValueError, match="2 sampled turns but 1 pools"):
        turn_versions(two_turns(["current"], [5, 2]))


def test_batch_metrics_by_hand():
    batch = [
        two_turns(["current", "stale"], [5, 2], task="a", reward=1.0, issued_version=4),
        two_turns(["current", "current"], [4, 5], task="a", reward=0.0, issued_version=5),
        two_turns(["stale", "stale"], [4, 4], task="b", reward=1.0, issued_version=5,
                  status="agent_validation_failed"),
    ]  # fmt: skip
    m = batch_metrics(batch, version=7, wall=2.0)  # trained on v6
    assert m["rollout/episodes"] == 3 and m["rollout/episodes_per_s"] == 1.5
    assert m["env/a/episodes"] == 2 and m["env/b/episodes"] == 1
    assert m["env/a/success"] == 0.5
    assert m["rollout/status/agent_validation_failed"] == pytest.approx(1 / 3)
    assert m["staleness/issue_lag_mean"] == pytest.approx((2 + 1 + 1) / 3)
    assert m["staleness/issue_lag_max"] == 2
    # turns: current@5, stale@2, current@4, current@5, stale@4, stale@4
    assert m["rollout/pool_share/current"] == pytest.approx(3 / 6)
    assert m["rollout/pool_share/stale"] == pytest.approx(3 / 6)
    assert m["staleness/turn_lag/current"] == pytest.approx((1 + 2 + 1) / 3)
    assert m["staleness/turn_lag_max/current"] == 2
    assert m["staleness/turn_lag/stale"] == pytest.approx((4 + 2 + 2) / 3)
    assert m["staleness/turn_lag_max/stale"] == 4
    # token lag weights turns by their length: 2 tokens of turn 1, 3 of turn 2
    lags = [1, 1, 4, 4, 4, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2]
    assert m["staleness/token_lag_mean"] == pytest.approx(sum(lags) / len(lags))


def test_a_trajectory_with_inconsistent_pools_is_left_out_of_turn_metrics_only():
    good = two_turns(["current", "current"], [6, 6])
    bad = two_turns(["current"], [6, 6])
    m = batch_metrics([good, bad], version=7, wall=1.0)
    assert m["rollout/episodes"] == 2
    assert m["rollout/pool_share/current"] == 1.0
    assert m["staleness/turn_lag/current"] == 0.0


def test_per_task_statuses_and_the_tasks_own_metrics():
    batch = [
        two_turns(["current"] * 2, [6, 6], task="db", metrics={"env/sql_errors": 2.0}),
        two_turns(["current"] * 2, [6, 6], task="db", metrics={"env/sql_errors": 0.0},
                  status="task_limit_reached"),
        two_turns(["current"] * 2, [6, 6], task="db", metrics={}),
        two_turns(["current"] * 2, [6, 6], task="kg", metrics={"env/f1": 0.5, "infra": 1.0}),
    ]  # fmt: skip
    m = batch_metrics(batch, version=7, wall=1.0)
    assert m["env/db/status/completed"] == pytest.approx(2 / 3)
    assert m["env/db/status/task_limit_reached"] == pytest.approx(1 / 3)
    assert m["env/db/sql_errors"] == 1.0  # (2 + 0) / 2: the episode without it is left out
    assert m["env/kg/f1"] == 0.5 and "env/kg/infra" not in m
    assert "env/db/f1" not in m


def test_malformed_turns_are_averaged_per_batch_and_per_task():
    batch = [
        two_turns(["current"] * 2, [5, 5], task="a", metrics={"malformed_turns": 2.0}),
        two_turns(["current"] * 2, [5, 5], task="a", metrics={"malformed_turns": 0.0}),
        two_turns(["current"] * 2, [5, 5], task="b"),  # a record without the metric: 0
    ]
    m = batch_metrics(batch, version=6, wall=1.0)
    assert m["rollout/malformed_turns"] == pytest.approx(2 / 3)  # (2 + 0 + 0) / 3
    assert m["env/a/malformed_turns"] == 1.0 and m["env/b/malformed_turns"] == 0.0


def test_the_share_of_groups_and_tokens_with_a_learning_signal_by_hand():
    """Group g1 (task a) has spread, g2 (task a) and g3 (task b) are flat: 1 of 3 groups;
    sampled tokens 5 + 5 in g1 against 5 + 5 in g2 and 5 in g3: 10 of 25."""
    batch = [
        two_turns(["current"] * 2, [6, 6], task="a", group="g1", reward=1.0),
        two_turns(["current"] * 2, [6, 6], task="a", group="g1", reward=-0.2),
        two_turns(["current"] * 2, [6, 6], task="a", group="g2", reward=-0.2),
        two_turns(["current"] * 2, [6, 6], task="a", group="g2", reward=-0.2),
        two_turns(["current"] * 2, [6, 6], task="b", group="g3", reward=1.0),
    ]
    m = batch_metrics(batch, version=7, wall=1.0)
    assert m["rollout/groups_with_spread"] == pytest.approx(1 / 3)
    assert m["rollout/signal_tokens"] == pytest.approx(10 / 25)
    assert m["env/a/groups_with_spread"] == 0.5
    assert m["env/b/groups_with_spread"] == 0.0

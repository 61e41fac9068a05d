"""Task interleaving by weight (actors/_mix.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.actors._mix import TaskMixer, idle_version, schedule_problems, scheduled_weight


def test_every_window_holds_the_weighted_share_within_one_group():
    mixer = TaskMixer({"db": 1.0, "os": 1.0, "kg": 2.0}, {"db": 60, "os": 26, "kg": 20})
    picks = [mixer.next_task() for _ in range(400)]
    for start in range(0, 400 - 8):
        window = Counter(picks[start : start + 8])
        # 8 groups at weights 1:1:2 -> 2, 2, 4 each, within one group
        assert abs(window["db"] - 2) <= 1 and abs(window["os"] - 2) <= 1
        assert abs(window["kg"] - 4) <= 1
    assert Counter(picks) == {"db": 100, "os": 100, "kg": 200}


def test_uneven_weights_converge_exactly():
    mixer = TaskMixer({"a": 0.7, "b": 0.2, "c": 0.1}, {"a": 5, "b": 5, "c": 5})
    counts = Counter(mixer.next_task() for _ in range(1000))
    assert counts == {"a": 700, "b": 200, "c": 100}


def test_a_small_set_is_replayed_evenly_to_its_share():
    mixer = TaskMixer({"big": 1.0, "small": 1.0}, {"big": 1000, "small": 3})
    picks = [mixer.next() for _ in range(60)]
    small = Counter(i for t, i in picks if t == "small")
    assert small == {0: 10, 1: 10, 2: 10}  # 30 groups over 3 instances, 10 epochs
    assert mixer.epochs["small"] == 10 and mixer.epochs["big"] == 1
    big = [i for t, i in picks if t == "big"]
    assert len(set(big)) == 30  # no repeat inside an epoch


def test_the_order_is_seeded():
    a = TaskMixer({"x": 1.0, "y": 2.0}, {"x": 9, "y": 9}, seed=5)
    b = TaskMixer({"x": 1.0, "y": 2.0}, {"x": 9, "y": 9}, seed=5)
    assert [a.next() for _ in range(50)] == [b.next() for _ in range(50)]


def test_bad_catalogues_are_refused():
    with pytest.raises(ValueError, match="same, non-empty"):
        TaskMixer({"x": 1.0}, {"y": 1})
    with pytest.raises(ValueError, match=r"\['x', 'y'\]"):
        TaskMixer({"x": 0.0, "y": 1.0}, {"x": 1, "y": 0})


def test_scheduled_weight_is_piecewise_linear_and_constant_outside():
    schedule = [(2, 0.0), (6, 2.0), (10, 1.0)]
    # before the first point: its weight; between points: linear; after the last: its weight
    assert [scheduled_weight(schedule, v) for v in (0, 2, 4, 6, 8, 10, 50)] == [
        0.0, 0.0, 1.0, 2.0, 1.5, 1.0, 1.0
    ]  # fmt: skip


def test_shares_follow_the_schedule_of_the_current_version():
    """`a` is paused at version 0, ramps to 1 at version 2 and 2 at version 4; `b` is 1."""
    mixer = TaskMixer({"a": 1.0, "b": 1.0}, {"a": 9, "b": 9}, schedules={"a": [(0, 0), (4, 2)]})
    assert mixer.weights(2) == {"a": 1.0, "b": 1.0}
    # v0: weights 0:1 -> only b; credits stay a=0, b=0
    assert [mixer.next_task(0) for _ in range(2)] == ["b", "b"]
    # v2: 1:1 -> credits (1,1) tie -> a (a=-1); (0,2) -> b (b=0)
    assert [mixer.next_task(2) for _ in range(2)] == ["a", "b"]
    # v4: 2:1 -> (2,1) a (a=-1); (1,2) b (b=-1); (3,0) a (a=0): shares 2/3, 1/3
    assert [mixer.next_task(4) for _ in range(3)] == ["a", "b", "a"]
    counts = Counter(mixer.next_task(7) for _ in range(300))
    assert counts == {"a": 200, "b": 100}


def test_a_version_where_every_schedule_is_zero_is_refused():
    mixer = TaskMixer({"a": 1.0}, {"a": 3}, schedules={"a": [(0, 0.0), (2, 1.0)]})
    with pytest.raises(ValueError, match="no task has a weight > 0 at version 0"):
        mixer.next_task(0)
    assert mixer.next_task(1) == "a"
    assert idle_version([[(0, 0.0), (2, 1.0)], [(0, 0.0), (1, 0.0)]]) == 0
    assert idle_version([[(0, 0.0), (2, 1.0)], [(0, 1.0), (1, 0.0)]]) is None
    assert schedule_problems([(3, 1.0), (1, -1.0)]) == [
        "versions must be >= 0 and strictly increasing: [3, 1]",
        "weights must be >= 0",
    ]

"""Task interleaving by weight (actors/_mix.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.actors._mix import TaskMixer


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

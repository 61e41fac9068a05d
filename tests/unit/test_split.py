"""Train/test splits: disjoint, complete, seeded, independent of the other items."""

import pytest

from agentrl.environments.tasks.toolkit.split import (
    check_disjoint,
    check_split,
    in_split,
    split_items,
)


def test_train_and_test_partition_the_items():
    keys = [f"item-{i}" for i in range(200)]
    train = split_items(keys, keys, "train")
    test = split_items(keys, keys, "test")
    assert set(train).isdisjoint(test)
    assert sorted(train + test) == sorted(keys)
    # the fraction is near 25 % on 200 items (binomial sd ~ 3 %)
    assert 0.15 < len(test) / len(keys) < 0.35
    assert split_items(keys, keys, "all") == keys


def test_assignment_depends_on_the_key_and_seed_only():
    keys = [f"q{i}" for i in range(50)]
    test = set(split_items(keys, keys, "test"))
    # dropping half the items moves none of the others across
    half = keys[::2]
    assert set(split_items(half, half, "test")) == test & set(half)
    assert all(in_split(k, "test") == (k in test) for k in keys)
    # another seed gives another split
    assert set(split_items(keys, keys, "test", seed=1)) != test


def test_tiny_sets_give_each_side_an_item():
    for n in (2, 3):
        keys = [f"k{i}" for i in range(n)]
        assert split_items(keys, keys, "test") and split_items(keys, keys, "train")


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unique"):
        split_items([1, 2], ["a", "a"], "train")
    with pytest.raises(ValueError, match="split must be one of"):
        check_split("dev", "db")
    with pytest.raises(ValueError, match="1 instance"):
        check_disjoint(["a", "b"], ["b", "c"], "db")

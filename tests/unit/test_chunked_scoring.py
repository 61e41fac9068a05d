"""The trained targets scored in chunks from the final hidden states (`_scoring.score`): the
logprobs, entropy and gradients of the logits taken whole, and nothing as wide as the
vocabulary kept for the backward pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import LoraSpec, TorchLearner, _scoring
from agentrl.trainer._grpo import token_entropy, token_logprobs
from agentrl.trainer._scoring import AtTargets, outputs_at, score, trained_positions
from tests.unit.test_shared_prefix import grouped_batch

VOCAB = 97
"""Prime, unlike every other size of the model: a tensor as wide as the vocabulary is one
of logits."""

CHUNK = 7
"""Targets per chunk in these tests: several chunks, the last one short."""

BF16_EPS = 2**-7
"""bfloat16's machine epsilon: the relative gap between two of its neighbouring values."""


def save_model(path: Path, *, tied: bool) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("chunked"), tied=False)


def unchunked_score(at: AtTargets, targets, temperature, *, entropy=False, chunk=None):
    """The scoring before chunks: ``[N, V]`` logits at once, `token_logprobs` over them and
    `token_entropy` of them (what the learner computed from ``logits_at``)."""
    logits = at.logits()
    logp = token_logprobs(logits[None], targets[None], temperature)[0]
    return logp, (token_entropy(logits.detach(), temperature) if entropy else None)


def _scored(model, batch, way, *, autocast=False):
    """``way``'s logprobs and entropy of ``batch``'s trained targets, and each parameter's
    gradient of a weighted sum of the logprobs."""
    model.zero_grad(set_to_none=True)
    kept = trained_positions(batch, torch.device("cpu"))
    targets = batch.targets()[kept.rows, kept.cols]
    at = outputs_at(model, batch, kept, torch.device("cpu"), autocast=autocast)
    logp, entropy = way(at, targets, 0.8, entropy=True, chunk=CHUNK)
    weights = torch.linspace(-1.0, 2.0, logp.numel())  # every target its own weight
    (logp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, grads


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
def test_chunks_give_the_logprobs_entropy_and_gradient_of_the_whole_logits(tmp_path, tied):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(save_model(tmp_path, tied=tied)).train()
    batch = grouped_batch()
    count = int(batch.loss_mask.sum())
    assert count > 3 * CHUNK and count % CHUNK, count  # several chunks, the last one short
    got_logp, got_entropy, got_grads = _scored(model, batch, score)
    want_logp, want_entropy, want_grads = _scored(model, batch, unchunked_score)
    # the head's products at another batch size round otherwise: a few float32 units
    torch.testing.assert_close(got_logp, want_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-6, rtol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    assert "lm_head.weight" in got_grads or tied  # the head's own gradient, once recomputed
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_chunks_under_autocast_give_the_whole_logits_logprobs(model_dir):
    """Under autocast the logprobs and entropy are those of the whole logits; so are the
    gradients, but the head's, within bfloat16's rounding: taken whole, its bfloat16
    gradient sums every target in bfloat16, here each chunk's is added in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    batch = grouped_batch()
    got_logp, got_entropy, got_grads = _scored(model, batch, score, autocast=True)
    want_logp, want_entropy, want_grads = _scored(model, batch, unchunked_score, autocast=True)
    torch.testing.assert_close(got_logp, want_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_entropy, want_entropy, atol=1e-6, rtol=1e-6)
    for name, grad in want_grads.items():
        if name != "lm_head.weight":
            torch.testing.assert_close(got_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    head, whole = got_grads["lm_head.weight"], want_grads["lm_head.weight"]
    assert (head - whole).norm() <= BF16_EPS * whole.norm()


def test_a_model_whose_head_does_not_run_apart_is_scored_from_its_logits(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    batch = grouped_batch()
    kept = trained_positions(batch, torch.device("cpu"))
    apart = outputs_at(model, batch, kept, torch.device("cpu"))
    monkeypatch.setattr(_scoring, "slices_logits", lambda model: False)
    whole = outputs_at(model, batch, kept, torch.device("cpu"))
    assert whole.head is None and whole.values.shape == (kept.count, VOCAB)
    assert apart.head is not None and apart.values.shape == (kept.count, 32)
    targets = batch.targets()[kept.rows, kept.cols]
    with torch.no_grad():
        got = score(whole, targets, 0.8, entropy=True, chunk=CHUNK)
        want = score(apart, targets, 0.8, entropy=True, chunk=CHUNK)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=1e-6)


def test_score_refuses_a_target_count_other_than_its_outputs_and_greedy_temperature():
    at = AtTargets(torch.zeros(3, VOCAB), None)
    with pytest.raises(ValueError, match="3 outputs for 2 targets"):
        score(at, torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        score(at, torch.zeros(3, dtype=torch.long), 0.0)


def test_chunk_positions_hold_one_float32_copy_in_the_budget():
    # 2**28 bytes / (4 bytes x 151,936) = 441.7 -> 441; / (4 x 49,152) = 1,365.3 -> 1,365
    assert _scoring.chunk_positions(151_936) == 441
    assert _scoring.chunk_positions(49_152) == 1_365
    assert _scoring.chunk_positions(1 << 40) == 1  # never 0


def test_no_tensor_as_wide_as_the_vocabulary_is_kept_for_the_backward_pass(model_dir):
    """The learner's update keeps, for its backward pass, no logits and no log-softmax of
    the trained targets (each chunk's are computed again there): what the head's part of
    a micro-batch holds does not grow with its targets times the vocabulary."""
    learner = TorchLearner(model_dir, kl_coef=0.1)
    batch = grouped_batch()
    wide: list[tuple[int, ...]] = []

    def pack(tensor):
        if tensor.dim() and tensor.shape[-1] == VOCAB:
            wide.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        metrics = learner.accumulate_gradients(batch)
    assert metrics["learner/tokens"] == batch.num_tokens > 0
    assert any(p.grad is not None for p in learner.model.lm_head.parameters())
    assert wide == []


def _gradients(learner, batch):
    metrics = learner.accumulate_gradients(batch)
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return metrics, grads


WAYS = {
    "float32": {},
    "unshared": {"share_prefix": False},
    "autocast": {"autocast": True},
    "bf16_compute": {"bf16_compute": True},
    "lora": {"lora": LoraSpec(rank=2, alpha=4.0, dropout=0.0, target_modules=("q_proj",))},
}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_chunked_update_equals_the_update_from_whole_logits(model_dir, monkeypatch, way):
    """The learner's gradient (and its loss, KL and entropy metrics) with chunks of 3 targets
    equals the one scored from ``[N, V]`` logits at once, every way the learner runs."""
    batch = grouped_batch()
    kw = {"kl_coef": 0.1, "temperature": 0.8, **WAYS[way]}
    monkeypatch.setattr(_scoring, "HEAD_CHUNK_BYTES", 4 * VOCAB * 3)
    assert _scoring.chunk_positions(VOCAB) == 3
    got_metrics, got = _gradients(TorchLearner(model_dir, **kw), batch)
    monkeypatch.setattr(_scoring, "score", unchunked_score)
    want_metrics, want = _gradients(TorchLearner(model_dir, **kw), batch)
    for key in ("learner/loss", "learner/kl", "learner/entropy", "learner/pg_loss"):
        assert got_metrics[key] == pytest.approx(want_metrics[key], abs=1e-6, rel=1e-5), key
    assert got.keys() == want.keys() and got
    for name, grad in want.items():
        if way in ("autocast", "bf16_compute"):  # bfloat16 gradients: summed in other orders
            assert (got[name] - grad).norm() <= BF16_EPS * grad.norm(), name
        else:
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)

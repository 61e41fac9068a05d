"""The learners on the device: the torch learner's update against the same update on the
CPU, and the Megatron learner's update against the torch learner's on the device."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer import TorchLearner

from .helpers import hf_weights, relative_difference, synthetic_batch

HYPER = dict(lr=1e-4, kl_coef=0.05, temperature=0.8, warmup_steps=0, is_cap=2.0)
"""KL on (the reference's forward runs), truncated importance weights."""

METRICS = ("learner/loss", "learner/pg_loss", "learner/kl", "learner/entropy", "learner/grad_norm")

UPDATE_TOLERANCE = 0.02
"""Largest ||W_a - W_b|| / ||W_a - W_0|| between two learners' updates of the same weights on
the same batches. AdamW's first steps move each weight by about lr * sign(grad), so a
gradient entry near 0 whose sign differs in the last bits between two kernels moves its
weight the other way: the updates agree in direction and size, not bit for bit."""

METRIC_TOLERANCE = 1e-3
"""Largest relative difference of a loss metric between two learners (float32)."""


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-4)  # KL at the first step is ~0 on both


def _updates(learner, batches, out):
    metrics = [learner.step(b) for b in batches]
    learner.save(out)
    return metrics


def test_the_torch_learner_updates_on_the_device_as_on_the_cpu(
    device, model_dir, tokenizer, tmp_path, report
):
    batches = [synthetic_batch(len(tokenizer), seed=s) for s in (1, 2)]
    on_device = TorchLearner(model_dir, device=device, **HYPER)
    assert next(on_device.model.parameters()).device.type == torch.device(device).type
    assert next(on_device.reference.parameters()).device.type == torch.device(device).type
    got = _updates(on_device, batches, tmp_path / "device")
    state = on_device.optimizer.state[next(iter(on_device.model.parameters()))]
    assert state["exp_avg"].device.type == torch.device(device).type  # AdamW state there too
    del on_device
    want = _updates(TorchLearner(model_dir, device="cpu", **HYPER), batches, tmp_path / "cpu")

    base = hf_weights(model_dir)
    diff = relative_difference(hf_weights(tmp_path / "cpu"), hf_weights(tmp_path / "device"), base)
    worst = max(_rel(w[k], g[k]) for w, g in zip(want, got, strict=True) for k in METRICS)
    report(update_rel_diff_vs_cpu=diff, metric_rel_diff_vs_cpu=worst)
    assert diff < UPDATE_TOLERANCE and worst < METRIC_TOLERANCE, (diff, worst, want, got)


def test_copies_forwarded_once_update_as_every_row_on_the_device(
    device, model_dir, tokenizer, tmp_path, report
):
    """`learner.dedup_rows` (`trainer._distinct_rows`) on the device: half the rows copy
    the others, and the update is the one that forwards every row."""
    batches = [synthetic_batch(len(tokenizer), seed=s, copies=True) for s in (1, 2)]
    merged = TorchLearner(model_dir, device=device, **HYPER)
    got = _updates(merged, batches, tmp_path / "merged")
    del merged
    plain = TorchLearner(model_dir, device=device, dedup_rows=False, **HYPER)
    want = _updates(plain, batches, tmp_path / "plain")
    assert [m["learner/row_copies"] for m in got] == [4.0, 4.0]
    assert [m["learner/row_copies"] for m in want] == [0.0, 0.0]
    plain_w, merged_w = hf_weights(tmp_path / "plain"), hf_weights(tmp_path / "merged")
    diff = relative_difference(plain_w, merged_w, hf_weights(model_dir))
    worst = max(_rel(w[k], g[k]) for w, g in zip(want, got, strict=True) for k in METRICS)
    report(update_rel_diff_copies_once=diff, metric_rel_diff_copies_once=worst)
    assert diff < UPDATE_TOLERANCE and worst < METRIC_TOLERANCE, (diff, worst, want, got)


def test_the_megatron_learner_updates_on_the_device_as_the_torch_learner(
    device, model_dir, tokenizer, tmp_path, report
):
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from agentrl.trainer.megatron import MegatronLearner

    batches = [synthetic_batch(len(tokenizer), seed=s) for s in (1, 2)]
    torch_learner = TorchLearner(model_dir, device=device, micro_batch_tokens=640, **HYPER)
    want = _updates(torch_learner, batches, tmp_path / "torch")
    del torch_learner
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    learner = MegatronLearner(model_dir, device=device, micro_batch_tokens=640, **HYPER)
    try:
        rank = learner._trainer()
        assert next(rank.model.parameters()).device.type == torch.device(device).type
        assert rank.update.reference is not None
        assert next(rank.update.reference.parameters()).device.type == rank.device.type
        got = _updates(learner, batches, tmp_path / "megatron")
        moments = rank.optimizer.state[next(iter(rank.model.parameters()))]["exp_avg"]
        assert moments.device.type == torch.device(device).type
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    finally:
        learner.close()

    base = hf_weights(model_dir)
    diff = relative_difference(
        hf_weights(tmp_path / "torch"), hf_weights(tmp_path / "megatron"), base
    )
    worst = max(_rel(w[k], g[k]) for w, g in zip(want, got, strict=True) for k in METRICS)
    report(update_rel_diff_vs_torch=diff, metric_rel_diff_vs_torch=worst, megatron_peak_gib=peak)
    assert diff < UPDATE_TOLERANCE and worst < METRIC_TOLERANCE, (diff, worst, want, got)


def test_shared_prompts_and_autocast_on_the_device(device, model_dir, tokenizer, report):
    """A group's shared prompt forwarded once gives the per-row gradients on the device, and
    bfloat16 autocast the float32 update's direction."""
    from agentrl.trainer import build_batch
    from tests.unit.records import trajectory

    gen = torch.Generator().manual_seed(3)
    rows = []
    for g in range(2):
        prompt = torch.randint(1, len(tokenizer), (96,), generator=gen).tolist()
        for m in range(4):
            rest = torch.randint(1, len(tokenizer), (24 + 8 * m,), generator=gen).tolist()
            mask = [0] * 96 + [1] * len(rest)
            rows.append(
                trajectory(
                    mask,
                    group=f"g{g}",
                    reward=float(m % 2),
                    logprob=-2.0,
                    episode_id=f"{g}-{m}",
                    token_ids=prompt + rest,
                    group_size=4,
                )
            )
    batch = build_batch(rows, 0)
    settings = dict(device=device, micro_batch_tokens=2048, **HYPER)
    plain = TorchLearner(model_dir, share_prefix=False, **settings)
    want = plain.accumulate_gradients(batch)
    want_grads = [p.grad.clone() for p in plain.model.parameters()]
    del plain
    shared = TorchLearner(model_dir, share_prefix=True, **settings)
    assert shared.share_prefix
    got = shared.accumulate_gradients(batch)
    num = sum(
        float((p.grad - w).double().pow(2).sum())
        for p, w in zip(shared.model.parameters(), want_grads, strict=True)
    )
    den = sum(float(w.double().pow(2).sum()) for w in want_grads)
    grad_diff = (num / den) ** 0.5
    del shared, want_grads
    auto = TorchLearner(model_dir, autocast=True, **settings)
    auto_metrics = auto.accumulate_gradients(batch)
    worst = max(_rel(want[k], got[k]) for k in ("learner/loss", "learner/kl", "learner/entropy"))
    report(
        shared_grad_rel_diff=grad_diff,
        shared_metric_rel_diff=worst,
        autocast_entropy_rel_diff=_rel(want["learner/entropy"], auto_metrics["learner/entropy"]),
        autocast_pg_loss_rel_diff=_rel(want["learner/pg_loss"], auto_metrics["learner/pg_loss"]),
    )
    assert grad_diff < 1e-4 and worst < 1e-4, (grad_diff, worst)
    assert _rel(want["learner/entropy"], auto_metrics["learner/entropy"]) < 1e-2


def test_bf16_compute_on_the_device(device, model_dir, tokenizer, tmp_path, report):
    """The bfloat16 copy, its gradients and the float32 masters all on the device; two
    updates land where float32's do, within bfloat16's rounding."""
    batches = [synthetic_batch(len(tokenizer), seed=s) for s in (1, 2)]
    bf16 = TorchLearner(model_dir, device=device, bf16_compute=True, **HYPER)
    kind = torch.device(device).type
    assert all(
        p.device.type == kind and p.dtype == torch.bfloat16 for p in bf16.compute.parameters()
    )
    assert all(p.device.type == kind and p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(p.device.type == kind for p in bf16.reference.parameters())
    got = _updates(bf16, batches, tmp_path / "bf16")
    assert all(p.grad is None for p in bf16.compute.parameters())
    del bf16
    want = _updates(TorchLearner(model_dir, device=device, **HYPER), batches, tmp_path / "fp32")
    base = hf_weights(model_dir)
    diff = relative_difference(hf_weights(tmp_path / "fp32"), hf_weights(tmp_path / "bf16"), base)
    entropy = max(
        _rel(w["learner/entropy"], g["learner/entropy"]) for w, g in zip(want, got, strict=True)
    )
    report(bf16_compute_update_rel_diff=diff, bf16_compute_entropy_rel_diff=entropy)
    assert got[0]["learner/kl"] == 0.0  # the copy and the reference hold the same weights
    assert diff < 0.6 and entropy < 2e-2, (diff, entropy, want, got)


def test_chunked_scoring_on_the_device_gives_the_update_from_whole_logits(
    device, model_dir, tokenizer, monkeypatch, report
):
    """The trained targets scored in chunks of 100 (`_scoring.score`: the head, float32
    log-softmax and entropy per chunk, the backward pass computing each chunk's logits
    again) give the gradient and metrics of ``[N, V]`` logits taken at once, on the device."""
    from agentrl.trainer import _scoring
    from agentrl.trainer._grpo import token_entropy, token_logprobs

    def whole_logits(at, targets, temperature, *, entropy=False, chunk=None):
        logits = at.logits()
        logp = token_logprobs(logits[None], targets[None], temperature)[0]
        return logp, (token_entropy(logits.detach(), temperature) if entropy else None)

    batch = synthetic_batch(len(tokenizer), seed=4)
    assert int(batch.loss_mask.sum()) > 200  # three chunks or more
    settings = dict(device=device, micro_batch_tokens=4096, **HYPER)
    cuda = device.startswith("cuda")

    def gradients():
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        learner = TorchLearner(model_dir, **settings)
        metrics = learner.accumulate_gradients(batch)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return metrics, [p.grad.clone() for p in learner.model.parameters()], peak

    monkeypatch.setattr(_scoring, "HEAD_CHUNK_BYTES", 4 * len(tokenizer) * 100)
    got, got_grads, got_peak = gradients()
    monkeypatch.setattr(_scoring, "score", whole_logits)
    want, want_grads, want_peak = gradients()
    num = sum(
        float((g - w).double().pow(2).sum()) for g, w in zip(got_grads, want_grads, strict=True)
    )
    grad_diff = (num / sum(float(w.double().pow(2).sum()) for w in want_grads)) ** 0.5
    worst = max(_rel(want[k], got[k]) for k in ("learner/loss", "learner/kl", "learner/entropy"))
    report(
        chunked_grad_rel_diff=grad_diff,
        chunked_metric_rel_diff=worst,
        chunked_peak_gib=got_peak,
        whole_logits_peak_gib=want_peak,
    )
    assert grad_diff < 1e-4 and worst < 1e-4, (grad_diff, worst)

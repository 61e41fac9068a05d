"""TorchLearner on a tiny random Llama (hidden 32, 2 layers, vocab 64), CPU float32."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import torch

from agentrl.messages import Trajectory
from agentrl.trainer import TorchLearner, TrainBatch, build_batch, checkpoint_digest
from tests.unit.records import trajectory

VOCAB = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    (path / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    return path


def make_traj(group: str, task: str, reward: float, tokens: list[int], prompt: int) -> Trajectory:
    """``prompt`` leading tokens are context; the rest are sampled assistant tokens."""
    mask = [0] * prompt + [1] * (len(tokens) - prompt)
    return trajectory(
        mask,
        group=group,
        reward=reward,
        logprob=-3.0,
        episode_id=f"{group}-{len(tokens)}-{reward}",
        task=task,
        token_ids=tokens,
    )


def make_batch() -> TrainBatch:
    gen = torch.Generator().manual_seed(7)

    def tokens(n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=gen).tolist()

    return build_batch(
        [
            make_traj("g1", "os", 1.0, tokens(12), prompt=5),
            make_traj("g1", "os", 0.0, tokens(7), prompt=3),
            make_traj("g2", "db", 1.0, tokens(10), prompt=4),
            make_traj("g2", "db", -0.2, tokens(5), prompt=2),
        ],
        pad_id=0,
    )


def on_policy(learner: TorchLearner, batch: TrainBatch) -> TrainBatch:
    """The batch with old logprobs recomputed by the learner itself (ratio 1)."""
    return dataclasses.replace(batch, old_logprobs=learner.logprobs(batch))


def test_logprobs_are_target_aligned_and_tempered(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, temperature=0.8)
    batch = make_batch()
    got = learner.logprobs(batch)
    with torch.no_grad():
        logits = learner.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).logits
    # logits at t score input_ids[t + 1], divided by T
    manual = torch.log_softmax(logits[:, :-1] / 0.8, dim=-1)
    manual = manual.gather(-1, batch.input_ids[:, 1:, None])[..., 0] * batch.loss_mask[:, :-1]
    torch.testing.assert_close(got[:, :-1], manual, atol=1e-5, rtol=1e-5)
    assert got[:, -1].abs().sum().item() == 0.0
    assert (got[batch.loss_mask == 0] == 0).all()


def test_step_raises_logprob_of_positive_advantage_tokens(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-2)
    batch = on_policy(learner, make_batch())
    batch = dataclasses.replace(batch, advantages=batch.loss_mask.clone())  # A = +1 everywhere
    before = learner.logprobs(batch)
    metrics = learner.step(batch)
    after = learner.logprobs(batch)
    mask = batch.loss_mask.bool()
    # at ratio 1 the loss is -mean(A) = -1 exactly
    assert metrics["learner/pg_loss"] == pytest.approx(-1.0, abs=1e-5)
    assert after[mask].mean() > before[mask].mean()
    # the same batch scored again: ratio > 1 on average, so the surrogate loss went down
    next_metrics = learner.accumulate_gradients(batch)
    assert next_metrics["learner/pg_loss"] < metrics["learner/pg_loss"]
    assert metrics["learner/tokens"] == float(batch.num_tokens)  # 7 + 4 + 6 + 3 = 20
    assert metrics["learner/tokens"] == 20.0
    assert metrics["learner/grad_norm"] > 0.0
    assert learner.steps == 1


def test_logprob_gap_is_zero_on_policy_and_measured_before_update(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-2)
    batch = on_policy(learner, make_batch())
    metrics = learner.step(batch)
    assert metrics["rollout/logprob_gap"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["learner/clip_frac"] == 0.0
    assert metrics["learner/entropy"] > 0.0
    # the rollout logprobs of make_traj are -3.0: the gap is the mean |logp + 3| before the update
    stale = make_batch()
    fresh = learner.logprobs(stale)
    mask = stale.loss_mask.bool()
    expected_gap = (fresh[mask] + 3.0).abs().mean().item()
    assert learner.step(stale)["rollout/logprob_gap"] == pytest.approx(expected_gap, rel=1e-4)


def test_logprob_gap_current_counts_only_tokens_of_the_learners_version(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-2)  # weights are version 0
    batch = on_policy(learner, make_batch())  # every trained token sampled by version 0
    metrics = learner.step(batch)
    assert metrics["rollout/logprob_gap_current"] == pytest.approx(0.0, abs=1e-5)
    assert learner.version == 1
    # now at version 1, a batch sampled by version 0 has no current tokens: no such metric
    assert "rollout/logprob_gap_current" not in learner.step(make_batch())
    resumed = TorchLearner(model_dir, lr=1e-2, version=7)
    assert "rollout/logprob_gap_current" not in resumed.step(on_policy(resumed, make_batch()))


def test_micro_batches_give_the_gradient_of_one_big_batch(model_dir: Path) -> None:
    batch = make_batch()
    whole = TorchLearner(model_dir, micro_batch_tokens=10_000)
    split = TorchLearner(model_dir, micro_batch_tokens=12)
    batch = on_policy(whole, batch)
    batch = dataclasses.replace(batch, old_logprobs=batch.old_logprobs - 0.1)  # ratio != 1

    m_whole = whole.accumulate_gradients(batch)
    m_split = split.accumulate_gradients(batch)
    assert m_whole["learner/micro_batches"] == 1.0
    assert m_split["learner/micro_batches"] == 4.0  # every row alone: 2 * 10 > 12 etc.
    assert m_split["learner/pg_loss"] == pytest.approx(m_whole["learner/pg_loss"], abs=1e-6)
    for (name, a), b in zip(whole.model.named_parameters(), split.model.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_checkpointing_gives_the_same_update(model_dir: Path) -> None:
    plain = TorchLearner(model_dir)
    recomputed = TorchLearner(model_dir, gradient_checkpointing=True)
    assert recomputed.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    batch = on_policy(plain, make_batch())
    batch = dataclasses.replace(batch, old_logprobs=batch.old_logprobs - 0.1)
    m_plain, m_recomputed = plain.step(batch), recomputed.step(batch)
    assert m_recomputed["learner/loss"] == pytest.approx(m_plain["learner/loss"], abs=1e-6)
    for (name, a), b in zip(
        plain.model.named_parameters(), recomputed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_logits_only_at_trained_positions_give_the_same_update(
    model_dir: Path, monkeypatch
) -> None:
    """The LM head runs on each row's own trained targets only (rows with prompts 5, 3, 4, 2
    and lengths 12, 7, 10, 5: 7 + 4 + 6 + 3 = 20 of the 48 positions, where the union of
    the rows' positions would be 10 x 4 = 40), and the update, its metrics and the scored
    logprobs equal those of logits at every position."""
    from agentrl.trainer import _scoring

    # the full learner unshared: a shared prompt runs the body and the head apart
    sliced, full = TorchLearner(model_dir), TorchLearner(model_dir, share_prefix=False)
    batch = on_policy(full, make_batch())
    batch = dataclasses.replace(batch, old_logprobs=batch.old_logprobs - 0.1)
    assert batch.input_ids.shape[1] == 12
    assert sliced.reference is not None  # the KL reference is scored the same way
    seen: list[tuple[str, int]] = []
    hooks = [
        model.lm_head.register_forward_hook(
            lambda m, i, o, name=name: seen.append((name, tuple(o.shape[:-1])))
        )
        for name, model in (("policy", sliced.model), ("reference", sliced.reference))
    ]
    m_sliced = sliced.step(batch)
    scored_sliced = sliced.logprobs(batch)
    for hook in hooks:
        hook.remove()
    assert int(batch.loss_mask.sum()) == 20
    # the step's forward, the reference's, the backward's (`_scoring.score` recomputes each
    # chunk's logits there), then the scoring
    assert seen == [("policy", (20,)), ("reference", (20,)), ("policy", (20,)), ("policy", (20,))]
    monkeypatch.setattr(_scoring, "slices_logits", lambda model: False)
    m_full = full.step(batch)
    for key, value in m_full.items():
        assert m_sliced[key] == pytest.approx(value, abs=1e-6), key
    for (name, a), b in zip(full.model.named_parameters(), sliced.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    torch.testing.assert_close(scored_sliced, full.logprobs(batch), atol=1e-5, rtol=1e-5)


def test_kl_to_reference_starts_at_zero(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-2, kl_coef=0.5)
    batch = on_policy(learner, make_batch())
    first = learner.step(batch)
    assert first["learner/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference
    second = learner.step(batch)
    assert second["learner/kl"] > 0.0  # the policy moved, the reference did not
    assert second["learner/loss"] == pytest.approx(
        second["learner/pg_loss"] + 0.5 * second["learner/kl"], rel=1e-5
    )


def test_a_resumed_learner_keeps_the_kl_to_the_initial_model(model_dir: Path, tmp_path) -> None:
    first = TorchLearner(model_dir, lr=1e-2, kl_coef=0.5)
    batch = on_policy(first, make_batch())
    first.step(batch)
    first.save(tmp_path / "v1")
    resumed = TorchLearner(
        tmp_path / "v1", lr=1e-2, kl_coef=0.5, reference_dir=model_dir, version=1
    )
    again = TorchLearner(tmp_path / "v1", lr=1e-2, kl_coef=0.5, version=1)
    # the resumed policy is one step away from the initial model: KL > 0 against it,
    # 0 against itself (what a resume without reference_dir would measure)
    assert resumed.step(batch)["learner/kl"] > 1e-6
    assert again.step(batch)["learner/kl"] == pytest.approx(0.0, abs=1e-6)


def test_save_writes_loadable_safetensors_and_a_stable_digest(
    model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    learner = TorchLearner(model_dir, lr=1e-2)
    digest_a = learner.save(tmp_path / "a")
    digest_b = learner.save(tmp_path / "b")
    assert digest_a == digest_b  # same weights, same bytes
    assert len(digest_a) == 64
    assert (tmp_path / "a" / "DIGEST").read_text().strip() == digest_a
    assert checkpoint_digest(tmp_path / "a") == digest_a
    assert (tmp_path / "a" / "tokenizer_config.json").is_file()
    assert list((tmp_path / "a").glob("*.safetensors"))

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    for (name, p), q in zip(
        learner.model.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)

    learner.step(on_policy(learner, make_batch()))
    assert learner.save(tmp_path / "c") != digest_a  # weights changed


def test_empty_batch_changes_nothing(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-2)
    batch = make_batch()
    batch = dataclasses.replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
    before = [p.detach().clone() for p in learner.model.parameters()]
    metrics = learner.step(batch)
    assert metrics["learner/tokens"] == 0.0
    assert learner.steps == 0
    assert learner.version == 1  # the actor checkpoints the unchanged weights as v1
    for p, q in zip(before, learner.model.parameters(), strict=True):
        assert torch.equal(p, q)


def grads(learner: TorchLearner) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in learner.model.parameters()])


def test_stale_tokens_are_weighted_by_the_truncated_importance_weight(model_dir: Path) -> None:
    fresh, stale = TorchLearner(model_dir, kl_coef=0.0), TorchLearner(model_dir, kl_coef=0.0)
    batch = on_policy(fresh, make_batch())
    batch = dataclasses.replace(batch, advantages=batch.loss_mask.clone())  # A = +1
    # sampled by a policy that gave each token a quarter of the current probability:
    # w = pi / pi_behav = 4 on every token, truncated to min(4, C = 2) = 2
    old = dataclasses.replace(
        batch, old_logprobs=batch.old_logprobs - math.log(4.0) * batch.loss_mask
    )
    m_fresh = fresh.accumulate_gradients(batch)
    m_stale = stale.accumulate_gradients(old)
    assert m_fresh["learner/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy: w = 1
    assert m_fresh["learner/is_clip_frac"] == 0.0
    assert m_stale["learner/is_weight_mean"] == pytest.approx(2.0)  # min(4, 2)
    assert m_stale["learner/is_clip_frac"] == 1.0  # every token above the cap
    assert m_stale["learner/ratio_mean"] == pytest.approx(4.0, rel=1e-4)  # untruncated w
    assert m_fresh["learner/pg_loss"] == pytest.approx(-1.0, abs=1e-5)  # -w A = -1
    assert m_stale["learner/pg_loss"] == pytest.approx(-2.0, abs=1e-5)  # -2 A = -2
    assert m_stale["learner/clip_frac"] == m_stale["learner/dual_clip_frac"] == 0.0  # r = 1
    # the loss is linear in the (detached) weight: the gradient exactly doubles
    torch.testing.assert_close(grads(stale), 2 * grads(fresh), atol=1e-7, rtol=1e-5)


def test_linear_warmup_of_the_learning_rate(model_dir: Path) -> None:
    learner = TorchLearner(model_dir, lr=1e-3, warmup_steps=4, kl_coef=0.0)
    batch = on_policy(learner, make_batch())
    lrs = [learner.step(batch)["learner/lr"] for _ in range(5)]
    # lr * min(1, (k + 1) / 4) for updates k = 0..4
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert TorchLearner(model_dir, lr=1e-3, kl_coef=0.0).step(batch)["learner/lr"] == 1e-3


def test_a_resumed_learner_updates_exactly_like_an_uninterrupted_one(
    model_dir: Path, tmp_path: Path
) -> None:
    hyper = dict(lr=1e-2, kl_coef=0.1, warmup_steps=3, weight_decay=0.01)
    first = make_batch()
    second = dataclasses.replace(first, advantages=-first.advantages)
    state = tmp_path / "learner_state"
    straight = TorchLearner(model_dir, state_dir=state, **hyper)
    straight.step(first)
    straight.save(tmp_path / "v1")  # + learner_state/v000001 (AdamW moments, step 1)
    expected = straight.step(second)

    resumed = TorchLearner(
        tmp_path / "v1", version=1, reference_dir=model_dir, state_dir=state, **hyper
    )
    assert resumed.steps == 1
    got = resumed.step(second)
    assert got == expected  # every metric, learner/lr = 1e-2 * 2 / 3 included
    assert got["learner/lr"] == pytest.approx(1e-2 * 2 / 3)
    for (name, a), b in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name

    # Without the state AdamW starts afresh (moments 0, warmup from 1/3): another update.
    fresh = TorchLearner(tmp_path / "v1", version=1, reference_dir=model_dir, **hyper)
    assert fresh.step(second)["learner/lr"] == pytest.approx(1e-2 / 3)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(straight.model.parameters(), fresh.model.parameters(), strict=True)
    )


def test_resuming_drops_states_newer_than_the_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "learner_state"
    learner = TorchLearner(model_dir, lr=1e-2, kl_coef=0.0, state_dir=state)
    batch = on_policy(learner, make_batch())
    for v in (1, 2):
        learner.step(batch)
        learner.save(tmp_path / f"v{v}")
    assert sorted(p.name for p in state.iterdir()) == ["v000001", "v000002"]
    # the checkpoint v2 was never announced: resume from v1, v2's state is an orphan
    TorchLearner(tmp_path / "v1", version=1, kl_coef=0.0, state_dir=state)
    assert sorted(p.name for p in state.iterdir()) == ["v000001"]


def test_greedy_temperature_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="greedy"):
        TorchLearner(model_dir, temperature=0.0)


def test_the_learner_scores_a_top_p_token_as_the_sampler_recorded_it(model_dir: Path) -> None:
    from agentrl.actors.engines.torch.sampling import sample_tokens

    learner = TorchLearner(model_dir, temperature=0.7, kl_coef=0.0)
    prompt = [5, 9, 14, 3]
    with torch.no_grad():
        logits = learner.model(input_ids=torch.tensor([prompt])).logits[:, -1]  # [1, V]
    (token,), (recorded,) = sample_tokens(
        logits, temperatures=[0.7], top_ps=[0.5], generators=[torch.Generator().manual_seed(0)]
    )
    # the sampler records log_softmax(logits / T) at the token, *before* the nucleus cut
    full = torch.log_softmax(logits[0] / 0.7, dim=-1)
    assert recorded == pytest.approx(full[token].item(), abs=1e-6)
    probs = full.exp().sort(descending=True).values
    nucleus = probs[(probs.cumsum(0) - probs) < 0.5].sum().item()  # mass Z of the top-p set
    assert nucleus < 0.9  # so the truncated distribution's logprob, log p - log Z, differs
    assert abs((full[token].item() - math.log(nucleus)) - recorded) > 0.1
    # ... and the learner scores the same untruncated distribution (position 3 -> token 4)
    batch = build_batch(
        [trajectory([0, 0, 0, 0, 1], logprob=recorded, token_ids=[*prompt, token])], pad_id=0
    )
    assert learner.logprobs(batch)[0, 3].item() == pytest.approx(recorded, abs=1e-5)


def test_constructor_defaults_are_the_run_configs() -> None:
    from agentrl.ops.config.schema import LearnerConfig

    config = LearnerConfig()
    defaults = inspect.signature(TorchLearner.__init__).parameters
    for name in ("lr", "kl_coef", "is_cap", "warmup_steps", "weight_decay", "grad_clip"):
        assert defaults[name].default == getattr(config, name), name
    assert config.lr == 2e-5  # the calculator demo's learning rate
    assert config.kl_coef == 1e-4  # DESIGN.md "Loss": k3 KL to a frozen reference, coef 1e-4
    assert config.task_normalize is True

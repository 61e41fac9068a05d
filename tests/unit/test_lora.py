"""LoRA RL (trainer/_lora.py): adapters train, the base is the KL reference, checkpoints hold
the adapters, the engines merge them exactly, a resume continues exactly, the config refuses
what cannot run. Tiny random Llama (hidden 32, 2 layers, vocab 64), CPU float32."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from agentrl.actors.engines.base import WeightsMismatch
from agentrl.actors.engines.torch import TorchEngine
from agentrl.trainer import LoraError, LoraSpec, TorchLearner, build_batch, checkpoint_digest
from agentrl.trainer._grpo import token_logprobs
from agentrl.trainer._lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, merged_state
from agentrl.trainer._models import load_causal_lm
from agentrl.trainer._scoring import Kept
from agentrl.trainer._shared_prefix import can_share
from tests.unit.records import trajectory
from tests.unit.test_torch_learner import make_batch, model_dir, on_policy

__all__ = ["model_dir"]  # the fixture, shared with test_torch_learner

SPEC = LoraSpec(rank=2, alpha=4.0, target_modules=("q_proj", "v_proj", "o_proj", "down_proj"))
"""Small adapters on four of the seven linear layers (the rest stay the base's)."""

HYPER = dict(lr=5e-2, kl_coef=0.1, temperature=0.8, seed=3)
"""A large lr so one update moves the adapters visibly; KL on (the base's forward runs)."""


def lora_learner(model_dir: Path, **kw) -> TorchLearner:
    return TorchLearner(model_dir, lora=SPEC, **{**HYPER, **kw})


def stepped(learner: TorchLearner, steps: int = 1) -> TorchLearner:
    """``learner`` after ``steps`` on-policy updates with advantage +1 on every token."""
    for _ in range(steps):
        batch = on_policy(learner, make_batch())
        learner.step(dataclasses.replace(batch, advantages=batch.loss_mask.clone()))
    return learner


def adapter_names(learner: TorchLearner) -> set[str]:
    return {n for n, _ in learner.model.named_parameters() if ".lora_" in n}


def test_only_the_adapters_get_gradients_and_move(model_dir: Path) -> None:
    learner = lora_learner(model_dir)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    batch = on_policy(learner, make_batch())
    learner.accumulate_gradients(dataclasses.replace(batch, advantages=batch.loss_mask.clone()))
    with_grad = {n for n, p in learner.model.named_parameters() if p.grad is not None}
    assert with_grad == adapter_names(learner)
    assert len(with_grad) == 2 * 4 * 2  # A and B, 4 targets, 2 layers
    optimised = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert optimised == {id(p) for n, p in learner.model.named_parameters() if ".lora_" in n}
    stepped(learner)
    moved = {n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= adapter_names(learner)
    assert {n for n in moved if ".lora_B" in n}  # B starts at 0 and leaves it


def test_the_policy_starts_as_the_base_and_the_kl_reference_is_the_base(model_dir: Path) -> None:
    learner = lora_learner(model_dir)
    full = TorchLearner(model_dir, **HYPER)
    batch = make_batch()
    # B = 0: the adapted policy is the base exactly
    torch.testing.assert_close(learner.logprobs(batch), full.logprobs(batch), atol=0, rtol=0)
    assert learner.reference is None  # no second copy of the model
    base_params = sum(p.numel() for p in full.model.parameters())
    lora_params = sum(p.numel() for n, p in learner.model.named_parameters() if ".lora_" in n)
    assert sum(p.numel() for p in learner.model.parameters()) == base_params + lora_params
    stepped(learner)
    mask = batch.loss_mask.bool()
    # the policy moved away from the base, and the KL term measures it against the base
    assert (learner.logprobs(batch) - full.logprobs(batch))[mask].abs().max() > 1e-3
    rows, cols = torch.ones_like(batch.input_ids).nonzero(as_tuple=True)  # every position
    with torch.no_grad():
        ref = learner._reference_logprobs(batch, Kept(rows, cols))
        want = full.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    want = token_logprobs(want, batch.targets(), HYPER["temperature"])
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)
    assert learner.accumulate_gradients(on_policy(learner, batch))["learner/kl"] > 1e-6


def test_a_checkpoint_holds_the_adapters_only(model_dir: Path, tmp_path: Path) -> None:
    learner = stepped(lora_learner(model_dir))
    digest = learner.save(tmp_path / "v1")
    files = {p.name for p in (tmp_path / "v1").iterdir()}
    assert files == {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "DIGEST", "tokenizer_config.json"}
    assert digest == checkpoint_digest(tmp_path / "v1") == (tmp_path / "v1/DIGEST").read_text()[:-1]
    full = (model_dir / "model.safetensors").stat().st_size
    adapter = (tmp_path / "v1" / ADAPTER_WEIGHTS).stat().st_size
    # 2 layers x (q, v, o: 2 * (32 + 32); down: 2 * (64 + 32)) = 960 floats, against
    # 2 * 64 * 32 embeddings + 2 layers of 4 * 32 * 32 + 3 * 64 * 32 weights + norms: ~25k
    assert adapter < full / 10, (adapter, full)


def test_the_engine_merges_the_adapter_and_scores_as_the_learner(
    model_dir: Path, tmp_path: Path
) -> None:
    learner = stepped(lora_learner(model_dir), steps=2)
    learner.save(tmp_path / "v2")
    engine = TorchEngine(model_dir, max_batch=4, seed=0)
    try:
        engine.load(tmp_path / "v2", version=2).result(timeout=60)
        prompts = [[5, 9, 11, 3, 7], [5, 9, 11, 3, 8, 2, 40], [17, 1, 1]]
        futures = [
            engine.submit(p, max_new_tokens=12, temperature=0.8, top_p=1.0, stop_ids=[], seed=i)
            for i, p in enumerate(prompts)
        ]
        generations = [f.result(timeout=60) for f in futures]
    finally:
        engine.close()
    assert {g.version for g in generations} == {2}
    batch = build_batch(
        [
            trajectory(
                [0] * len(p) + [1] * len(g.token_ids),
                group=f"g{i // 2}",
                reward=float(i % 2),
                token_ids=p + g.token_ids,
                logprobs=[0.0] * len(p) + g.logprobs,
                versions=[-1] * len(p) + [2] * len(g.token_ids),
                episode_id=f"e{i}",
            )
            for i, (p, g) in enumerate(zip(prompts, generations, strict=True))
        ],
        pad_id=0,
    )
    mask = batch.loss_mask.bool()
    gap = (learner.logprobs(batch) - batch.old_logprobs)[mask].abs()
    assert gap.max() < 1e-4, gap  # W + (alpha / r) B A merged == the learner's W x + B A x
    # what the learner reports on such a batch: tokens of its own version, gap ~0
    assert learner.step(batch)["rollout/logprob_gap_current"] < 1e-4


def test_a_model_built_from_an_adapter_checkpoint_is_base_plus_adapter(
    model_dir: Path, tmp_path: Path
) -> None:
    learner = stepped(lora_learner(model_dir))
    learner.save(tmp_path / "v1")
    state = merged_state(tmp_path / "v1")
    model = load_causal_lm(tmp_path / "v1", dtype=torch.float32)  # engines at start, eval
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    # the merged weight of one target, by hand: W + (alpha / r) B A
    module = learner.model.model.layers[0].self_attn.q_proj
    by_hand = module.base_layer.weight + 2.0 * module.lora_B.default.weight @ (
        module.lora_A.default.weight
    )
    torch.testing.assert_close(state["model.layers.0.self_attn.q_proj.weight"], by_hand)
    untouched = "model.layers.0.self_attn.k_proj.weight"  # not a target
    base = load_causal_lm(model_dir, dtype=torch.float32).state_dict()
    assert torch.equal(state[untouched], base[untouched])


def test_a_resumed_lora_learner_updates_exactly_like_an_uninterrupted_one(
    model_dir: Path, tmp_path: Path
) -> None:
    first, second = make_batch(), make_batch()
    second = dataclasses.replace(second, advantages=-second.advantages)
    straight = lora_learner(model_dir, state_dir=tmp_path / "state")
    straight.step(first)
    straight.save(tmp_path / "v1")
    want = straight.step(second)
    resumed = lora_learner(
        tmp_path / "v1", version=1, reference_dir=model_dir, state_dir=tmp_path / "state"
    )
    assert resumed.steps == 1 and resumed.base_dir == model_dir.resolve()
    got = resumed.step(second)
    for key in ("learner/loss", "learner/kl", "learner/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    for (name, a), b in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_shared_prompt_and_autocast_keep_working_with_adapters(model_dir: Path) -> None:
    learner = lora_learner(model_dir, share_prefix=True)
    assert can_share(learner.model) and learner.share_prefix
    # one group sharing a 10-token prompt, so the prefix path runs
    prompt = list(range(3, 13))
    batch = build_batch(
        [
            trajectory(
                [0] * 10 + [1] * 4,
                group="g",
                reward=float(i),
                logprob=-3.0,
                token_ids=[*prompt, 20 + i, 30, 40 + i, 50],
                episode_id=f"e{i}",
            )
            for i in range(2)
        ],
        pad_id=0,
    )
    stepped(learner)  # B != 0, so the adapters' gradients are not trivially B-only

    def grads(share: bool, autocast: bool = False) -> dict[str, torch.Tensor]:
        learner.share_prefix, learner.autocast = share, autocast
        learner.optimizer.zero_grad(set_to_none=True)
        learner.accumulate_gradients(batch)
        return {
            n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None
        }

    alone, shared = grads(False), grads(True)
    assert set(shared) == adapter_names(learner)
    for name in alone:
        torch.testing.assert_close(shared[name], alone[name], atol=1e-6, rtol=1e-4)
    cast = grads(True, autocast=True)
    assert set(cast) == adapter_names(learner)
    num = sum(float((cast[n] - alone[n]).norm() ** 2) for n in alone) ** 0.5
    den = sum(float(alone[n].norm() ** 2) for n in alone) ** 0.5
    assert num < 0.1 * den, (num, den)  # bfloat16 products, the same gradient within 10%


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients(model_dir: Path) -> None:
    plain = stepped(lora_learner(model_dir))
    ckpt = lora_learner(model_dir, gradient_checkpointing=True)
    ckpt.model.load_state_dict(plain.model.state_dict())
    batch = on_policy(plain, make_batch())
    for learner in (plain, ckpt):
        learner.optimizer.zero_grad(set_to_none=True)
        learner.accumulate_gradients(batch)
    grads = {n: p.grad for n, p in ckpt.model.named_parameters() if p.grad is not None}
    assert set(grads) == adapter_names(plain)
    for name, p in plain.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5)


def test_a_warm_start_copy_of_the_base_is_accepted_and_another_model_refused(
    model_dir: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(model_dir, tmp_path / "v8"))  # checkpoints/v8 beside its copy
    learner = lora_learner(copy, reference_dir=model_dir)
    assert learner.base_dir == model_dir.resolve()  # the copy that outlives pruning
    full = TorchLearner(model_dir, lr=1e-2, kl_coef=0.0)
    stepped(full)
    full.save(tmp_path / "v9")
    with pytest.raises(LoraError, match="is a full checkpoint, not the base"):
        lora_learner(tmp_path / "v9", reference_dir=model_dir)


def test_refusals(model_dir: Path, tmp_path: Path) -> None:
    stepped(lora_learner(model_dir)).save(tmp_path / "v1")
    with pytest.raises(ValueError, match=r"is a LoRA adapter checkpoint: set learner\.lora"):
        TorchLearner(tmp_path / "v1")
    other = dataclasses.replace(SPEC, rank=4)
    with pytest.raises(LoraError, match="the adapter is LoraSpec\\(rank=2"):
        TorchLearner(tmp_path / "v1", lora=other, reference_dir=model_dir)
    with pytest.raises(LoraError, match="not of the KL reference"):
        TorchLearner(tmp_path / "v1", lora=SPEC, reference_dir=tmp_path)
    with pytest.raises(ValueError, match="SFT warm start trains the whole model"):
        TorchLearner(model_dir, lora=SPEC, objective="sft")
    with pytest.raises(ValueError, match="lora: rank: must be >= 1, got 0; dropout"):
        LoraSpec(rank=0, dropout=1.0)
    from agentrl.actors.engines.vllm.engine import _refuse_adapter

    with pytest.raises(WeightsMismatch, match="VLLMEngine loads full checkpoints only"):
        _refuse_adapter(tmp_path / "v1")
    engine = TorchEngine(model_dir, max_batch=1)
    try:  # an adapter whose base is gone: refused at load, the engine keeps serving
        moved = Path(shutil.copytree(tmp_path / "v1", tmp_path / "v1b"))
        config = (moved / ADAPTER_CONFIG).read_text().replace(str(model_dir.resolve()), "/nope")
        (moved / ADAPTER_CONFIG).write_text(config)
        with pytest.raises(WeightsMismatch, match="its base model '/nope' is not a model dir"):
            engine.load(moved, 2)
        assert engine.version == 0
    finally:
        engine.close()
    dora = Path(shutil.copytree(tmp_path / "v1", tmp_path / "v1d"))  # what the merge lacks
    config = (dora / ADAPTER_CONFIG).read_text().replace('"use_dora": false', '"use_dora": true')
    (dora / ADAPTER_CONFIG).write_text(config)
    with pytest.raises(LoraError, match=r"plain LoRA adapters load here \(it uses \['use_dora'"):
        merged_state(dora)


def test_the_config_takes_lora_and_lists_what_it_cannot_run_with() -> None:
    from agentrl.ops import ConfigError, parse_config

    cfg = parse_config({"run": "r", "model": "tiny", "learner": {"lora": {"rank": 8}}})
    assert cfg.learner.lora.rank == 8 and cfg.learner.lora.alpha == 32.0
    assert len(cfg.learner.lora.target_modules) == 7
    assert parse_config({"run": "r", "model": "tiny"}).learner.lora is None
    raw = {
        "run": "r",
        "model": "tiny",
        "learner": {
            "backend": "megatron",
            "lora": {"rank": 0, "alpha": -1, "dropout": 1.5, "target_modules": []},
        },
        "pools": {"current": {"engine": "vllm"}},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    problems = err.value.problems
    for line in (
        "learner.lora.rank: must be >= 1, got 0",
        "learner.lora.alpha: must be > 0, got -1.0",
        "learner.lora.dropout: must be in [0, 1), got 1.5",
        "learner.lora.target_modules: must be a non-empty list of module names",
        "learner.lora: needs learner.backend torch (megatron trains full models)",
        "pools.current.engine: LoRA adapter checkpoints load in torch only",
    ):
        assert line in problems, problems
    with pytest.raises(ConfigError, match=r"learner\.lora\.rank: expected int"):
        parse_config({"run": "r", "model": "tiny", "learner": {"lora": {"rank": "big"}}})

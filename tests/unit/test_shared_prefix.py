"""A group's shared prompt forwarded once: the same logits and gradients as per row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.trainer import TorchLearner, build_batch, micro_batches
from agentrl.trainer._scoring import logits_at, trained_positions
from agentrl.trainer._shared_prefix import (
    SHARED_TYPES,
    GroupPrefixes,
    can_share,
    common_prefix,
    group_micro_batches,
    share_lengths,
    shared_logits_at,
)
from tests.unit.records import trajectory

VOCAB = 64


def save_tiny(path: Path, kind: str = "llama", seed: int = 5) -> Path:
    """A two-layer model of HF type ``kind`` (grouped-query attention) with random weights."""
    import transformers

    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}[kind]
    torch.manual_seed(seed)
    config = getattr(transformers, f"{name}Config")(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    if kind != "llama":
        config.sliding_window = None
    getattr(transformers, f"{name}ForCausalLM")(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("shared"))


def grouped_batch(seed: int = 0):
    """Three groups: two of three members sharing a 20-token prompt (then each its own
    assistant turns, a tool result, more turns), one group of a single member."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(1, VOCAB, (n,), generator=gen).tolist()

    rows = []
    for g, members in (("a", 3), ("b", 3), ("c", 1)):
        prompt = ids(20)
        for m in range(members):
            turn1, tool, turn2 = ids(4 + m), ids(6), ids(3 + 2 * m)
            tokens = prompt + turn1 + tool + turn2
            mask = [0] * 20 + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
            rows.append(
                trajectory(
                    mask,
                    group=g,
                    reward=float(m % 2) if members > 1 else 1.0,
                    logprob=-2.0,
                    episode_id=f"{g}{m}",
                    token_ids=tokens,
                    group_size=members,
                )
            )
    return build_batch(rows, pad_id=0)


def test_common_prefix_stops_at_the_first_difference_and_the_shortest_row():
    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 5, 6], [1, 2, 3, 4, 7]])
    assert common_prefix(ids, torch.tensor([4, 5, 5])) == 3
    assert common_prefix(ids[[0, 2]], torch.tensor([4, 5])) == 4
    assert common_prefix(ids[[0, 2]], torch.tensor([2, 5])) == 2


def test_group_micro_batches_keep_groups_together_and_within_the_budget():
    batch = grouped_batch()
    lengths = batch.attention_mask.sum(1)
    micros = group_micro_batches(batch, 80)
    seen = sorted(int(r) for m in micros for r in m.rewards.new_tensor(range(m.num_rows)))
    assert sum(m.num_rows for m in micros) == batch.num_rows and len(seen) == batch.num_rows
    for m in micros:
        assert computed_positions(batch, m) <= 80 or m.num_rows == 1
    # a group of three with a 20-token prompt and rests of 13-20 tokens: 20 + 3 x 20 = 80 fits
    assert any(m.num_rows == 3 and len(torch.unique(m.group_index)) == 1 for m in micros)
    assert int(lengths.max()) <= 40


def computed_positions(batch, micro) -> int:
    """Positions `shared_logits_at` computes for ``micro`` (of ``batch``): each group's
    prompt as `GroupPrefixes` computes it, then every row to its group's longest."""
    share = share_lengths(batch)
    cost = 0
    for g in torch.unique(micro.group_index).tolist():
        rows = (micro.group_index == g).nonzero().squeeze(-1)
        width = int(micro.attention_mask[rows].sum(1).max())
        cost += share[g] + len(rows) * (width - share[g])
    return cost


def test_rows_alike_past_their_first_trained_target_count_each_in_the_budget():
    # members that are one episode token for token (or start their answers alike): the
    # prompt is computed once only up to the first trained target, every later position
    # row by row; the budget must count those positions, not the common prefix as free
    gen = torch.Generator().manual_seed(3)
    prompt, turn, tool = (torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in (20, 6, 8))
    mask = [0] * 20 + [1] * 6 + [0] * 8 + [1] * 6
    rows = [
        trajectory(mask, group="same", reward=float(m % 2), logprob=-2.0, episode_id=f"s{m}",
                   token_ids=prompt + turn + tool + turn, group_size=4)
        for m in range(4)
    ]  # fmt: skip
    batch = build_batch(rows, pad_id=0)
    assert share_lengths(batch) == {0: 19}  # before the first trained target, not all 40
    micros = group_micro_batches(batch, 60)  # 19 + 2 x 21 = 61 > 60: a row at a time
    assert [computed_positions(batch, m) for m in micros] == [40, 40, 40, 40]
    assert len(group_micro_batches(batch, 61)) == 2  # two rows a micro-batch


def test_shared_logits_equal_the_per_row_logits(model_dir):
    model = TorchLearner(model_dir, kl_coef=0.0).model
    assert can_share(model)
    batch = grouped_batch()
    keep = trained_positions(batch, torch.device("cpu"))
    want = logits_at(model, batch, keep, torch.device("cpu"))
    got = shared_logits_at(model, batch, keep, torch.device("cpu"))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "mistral"])
def test_every_shared_model_type_gives_the_per_row_logits(kind, tmp_path):
    """Each type of `SHARED_TYPES` beside Llama, built tiny: the same logits shared."""
    save_tiny(tmp_path, kind, seed=6)
    model = TorchLearner(tmp_path, kl_coef=0.0).model
    assert model.config.model_type == kind in SHARED_TYPES
    assert can_share(model)
    batch = grouped_batch(2)
    keep = trained_positions(batch, torch.device("cpu"))
    want = logits_at(model, batch, keep, torch.device("cpu"))
    got = shared_logits_at(model, batch, keep, torch.device("cpu"))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_an_update_with_shared_prompts_has_the_unshared_gradients_and_metrics(model_dir):
    batch = grouped_batch(1)
    settings = dict(kl_coef=0.1, temperature=0.8, micro_batch_tokens=80)
    plain = TorchLearner(model_dir, share_prefix=False, **settings)
    shared = TorchLearner(model_dir, share_prefix=True, **settings)
    assert shared.share_prefix and not plain.share_prefix
    # the shared learner's micro-batches differ (whole groups), the sums must not
    assert len(group_micro_batches(batch, 80)) != len(micro_batches(batch, 80))
    want = plain.accumulate_gradients(batch)
    got = shared.accumulate_gradients(batch)
    for key in ("learner/loss", "learner/pg_loss", "learner/kl", "learner/entropy"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    for (name, p), q in zip(plain.model.named_parameters(), shared.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)
    assert any(float(p.grad.abs().sum()) > 0 for p in shared.model.parameters())


def _prompt_forwards(model: torch.nn.Module) -> tuple[list[int], object]:
    """Counts the body's forwards that compute a prompt's cache (no cache given)."""
    calls: list[int] = []

    def hook(module, args, kwargs):
        if kwargs.get("use_cache") and kwargs.get("past_key_values") is None:
            calls.append(int(kwargs["input_ids"].shape[1]))

    return calls, model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def test_a_group_split_across_micro_batches_forwards_its_prompt_once(model_dir):
    # a budget of 45 positions splits each group of three (a 20-token prompt, rests of
    # 13-20) into a micro-batch per member; the prompt is still computed once per group
    # for the policy and once for the reference, and the gradients are the unshared ones
    batch = grouped_batch(1)
    settings = dict(kl_coef=0.1, temperature=0.8, micro_batch_tokens=45)
    plain = TorchLearner(model_dir, share_prefix=False, **settings)
    shared = TorchLearner(model_dir, share_prefix=True, **settings)
    micros = group_micro_batches(batch, 45)
    assert len(micros) >= 6  # groups a and b split, member by member
    calls, handles = [], []
    for model in (shared.model, shared.reference):
        got, handle = _prompt_forwards(model)
        calls.append(got)
        handles.append(handle)
    try:
        want = plain.accumulate_gradients(batch)
        got = shared.accumulate_gradients(batch)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [[19, 19], [19, 19]]  # groups a and b, each once per model
    for key in ("learner/loss", "learner/pg_loss", "learner/kl", "learner/entropy"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    for (name, p), q in zip(plain.model.named_parameters(), shared.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_a_groups_prompt_is_let_go_after_its_last_micro_batch(model_dir):
    model = TorchLearner(model_dir, kl_coef=0.0).model
    batch = grouped_batch(1)
    micros = group_micro_batches(batch, 45)
    store = GroupPrefixes(batch, micros, grad=True)
    held = []
    for micro in micros:
        keep = trained_positions(micro, torch.device("cpu"))
        shared_logits_at(model, micro, keep, torch.device("cpu"), prefixes=store).sum().backward()
        store.done(micro)
        held.append(len(store._kv))
    # a group's prompt is held from its first micro-batch to its last, then released
    assert max(held) == 1 and held[-1] == 0
    assert all(p.grad is not None for p in model.get_decoder().layers[0].parameters())


def test_gradient_checkpointing_turns_sharing_off(model_dir):
    learner = TorchLearner(model_dir, gradient_checkpointing=True, share_prefix=True)
    assert not learner.share_prefix
    assert learner.step(grouped_batch())["learner/tokens"] > 0  # the unshared path trains


def test_sharing_is_on_by_default_on_the_cpu(model_dir):
    assert TorchLearner(model_dir).share_prefix
    assert not TorchLearner(model_dir, share_prefix=False).share_prefix


def test_groups_without_a_shared_prompt_run_in_one_batched_forward(model_dir):
    model = TorchLearner(model_dir, kl_coef=0.0).model
    batch = grouped_batch()
    # scramble every row's first token: no group shares a prefix any more
    ids = batch.input_ids.clone()
    ids[:, 0] = torch.arange(1, batch.num_rows + 1)
    import dataclasses

    batch = dataclasses.replace(batch, input_ids=ids)
    calls = []
    handle = model.get_decoder().register_forward_hook(lambda module, args, out: calls.append(1))
    try:
        keep = trained_positions(batch, torch.device("cpu"))
        got = shared_logits_at(model, batch, keep, torch.device("cpu"))
    finally:
        handle.remove()
    assert len(calls) == 1
    want = logits_at(model, batch, keep, torch.device("cpu"))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_each_group_runs_to_its_own_longest_row_not_the_micro_batchs(model_dir):
    # one micro-batch packs a long group with a short one: the short group's rows must not
    # be computed over the long group's width (the micro-batch budget counts each group's
    # rows padded to its own longest; padding to the widest cost up to 4x the activations)
    import dataclasses

    model = TorchLearner(model_dir, kl_coef=0.0).model
    batch = grouped_batch(3)
    long_rows = batch.group_index == batch.group_index[0]
    lengths = batch.attention_mask.sum(dim=1)
    width = int(lengths.max()) + 30
    pad = batch.input_ids.new_zeros((batch.num_rows, width - batch.input_ids.shape[1]))
    grown = {}
    for name in ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "advantages",
                 "versions"):  # fmt: skip
        value = getattr(batch, name)
        grown[name] = torch.cat([value, pad.to(value.dtype)], dim=1)
    # the first group's rows get 30 more context tokens at their ends (real, untrained)
    for row in long_rows.nonzero().squeeze(-1).tolist():
        end = int(lengths[row])
        grown["input_ids"][row, end : end + 30] = torch.arange(1, 31)
        grown["attention_mask"][row, end : end + 30] = 1
    batch = dataclasses.replace(batch, **grown)
    lengths = batch.attention_mask.sum(dim=1)
    widths = []
    handle = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape),
        with_kwargs=True,
    )
    keep = trained_positions(batch, torch.device("cpu"))
    try:
        got = shared_logits_at(model, batch, keep, torch.device("cpu"))
    finally:
        handle.remove()
    computed = sum(rows * cols for rows, cols in widths)
    groups = [batch.group_index == g for g in torch.unique(batch.group_index)]
    padded_to_own = sum(int(g.sum()) * int(lengths[g].max()) for g in groups)
    assert computed <= padded_to_own  # the prefixes are counted once, so fewer
    assert computed < int(long_rows.sum()) * width + 2 * width  # not every row at the widest
    want = logits_at(model, batch, keep, torch.device("cpu"))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def _graph_nodes(tensor: torch.Tensor) -> set[str]:
    seen, names, todo = set(), set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def test_the_attention_over_a_shared_prompt_keeps_no_probabilities(model_dir):
    # the continuation attends the cached prompt under an explicit mask: torch's CPU
    # attention must still run its flash kernel (which saves a row's log-sum-exp, not the
    # [rows, heads, query, key] probabilities): memory stays a micro-batch's activations
    model = TorchLearner(model_dir, kl_coef=0.0, share_prefix=True).model
    batch = grouped_batch()
    keep = trained_positions(batch, torch.device("cpu"))
    for autocast in (False, True):
        nodes = _graph_nodes(
            shared_logits_at(model, batch, keep, torch.device("cpu"), autocast=autocast)
        )
        assert "ScaledDotProductFlashAttentionForCpuBackward0" in nodes
        assert not {"SoftmaxBackward0", "ScaledDotProductAttentionMathBackward0"} & nodes

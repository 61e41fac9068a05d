"""Rows alike token for token, forwarded once: the update of the per-row computation."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer import TorchLearner, build_batch
from agentrl.trainer._distinct_rows import distinct_rows
from tests.unit.records import trajectory
from tests.unit.test_shared_prefix import VOCAB, save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("distinct"))


def batch_with_copies(seed: int = 0):
    """Two groups of four after a 20-token prompt each. In group a, members 0 and 2 are
    one episode token for token, sampled by other versions with other logprobs and given
    other rewards (so other advantages); member 3 has member 1's tokens with one trained
    token fewer (a kind of its own). In group b, members 1, 2 and 3 are alike."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(1, VOCAB, (n,), generator=gen).tolist()

    rows = []
    for g, alike in (("a", {2: 0}), ("b", {2: 1, 3: 1})):
        prompt = ids(20)
        episodes: list[tuple[list[int], list[int]]] = []
        for m in range(4):
            if m in alike:
                tokens, mask = episodes[alike[m]]
            elif g == "a" and m == 3:
                tokens, mask = episodes[1][0], [*episodes[1][1][:-1], 0]
            else:
                turn1, tool, turn2 = ids(5 + m), ids(6), ids(4 + m)
                tokens = prompt + turn1 + tool + turn2
                mask = [0] * 20 + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
            episodes.append((tokens, mask))
            rows.append(
                trajectory(
                    mask,
                    group=g,
                    reward=[1.0, 0.0, 0.5, -0.2][m],
                    logprob=-1.0 - 0.3 * m,
                    version=m % 2,
                    episode_id=f"{g}{m}",
                    token_ids=tokens,
                    group_size=4,
                    sample_idx=m,
                )
            )
    return build_batch(rows, pad_id=0)


def test_rows_are_one_kind_only_when_their_tokens_and_trained_mask_agree():
    batch = batch_with_copies()
    got = distinct_rows(batch)
    assert got.rows == [0, 1, 3, 4, 5]
    assert got.of_row == [0, 1, 0, 2, 3, 4, 4, 4]
    assert got.copies == 3
    # a row's kind is its original: the same tokens and mask over its real length
    for b, kind in enumerate(got.of_row):
        original = got.rows[kind]
        assert torch.equal(batch.input_ids[b], batch.input_ids[original])
        assert torch.equal(batch.loss_mask[b], batch.loss_mask[original])
    # row 3 has row 1's tokens but not its mask: its own kind
    assert torch.equal(batch.input_ids[3], batch.input_ids[1])
    assert got.of_row[3] != got.of_row[1]
    every = distinct_rows(batch, merge=False)
    assert every.rows == every.of_row == list(range(8)) and every.copies == 0


def test_a_prefix_of_a_row_is_not_a_copy_of_it():
    rows = [
        trajectory([0, 1, 1], group="g", reward=1.0, token_ids=[4, 5, 6]),
        trajectory([0, 1, 1, 0], group="g", reward=0.0, token_ids=[4, 5, 6, 0]),
    ]
    assert distinct_rows(build_batch(rows, pad_id=0)).copies == 0


def _forwarded_rows(model: torch.nn.Module) -> tuple[list[tuple[int, ...]], object]:
    """Every row of token ids the model's embedding sees, padding included."""
    seen: list[tuple[int, ...]] = []

    def hook(module, args):
        seen.extend(tuple(row) for row in args[0].tolist())

    return seen, model.get_input_embeddings().register_forward_pre_hook(hook)


@pytest.mark.parametrize("share", [False, True], ids=["per-row", "shared-prompt"])
def test_an_update_with_copies_forwarded_once_has_the_per_row_update(model_dir, share):
    batch = batch_with_copies(1)
    settings = dict(kl_coef=0.1, temperature=0.8, micro_batch_tokens=90, share_prefix=share)
    plain = TorchLearner(model_dir, dedup_rows=False, **settings)
    merged = TorchLearner(model_dir, **settings)
    assert merged.dedup_rows and not plain.dedup_rows
    assert len(set(batch.advantages[[0, 2]].sum(dim=1).tolist())) == 2  # copies differ
    seen = {}
    handles = []
    for name, learner in (("plain", plain), ("merged", merged)):
        for model in (learner.model, learner.reference):
            rows, handle = _forwarded_rows(model)
            seen[name, model is learner.reference] = rows
            handles.append(handle)
    try:
        want = plain.step(batch)
        got = merged.step(batch)
    finally:
        for handle in handles:
            handle.remove()
    assert got["learner/row_copies"] == 3.0 and want["learner/row_copies"] == 0.0
    for key in (
        "learner/loss",
        "learner/pg_loss",
        "learner/kl",
        "learner/entropy",
        "learner/approx_kl",
        "learner/ratio_mean",
        "learner/is_weight_mean",
        "learner/tokens",
        "rollout/logprob_gap",
        "rollout/logprob_gap_current",
        "learner/grad_norm",
    ):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    for (name, p), q in zip(plain.model.named_parameters(), merged.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
    # what each computed: the merged learner's policy and reference each forwarded the
    # tokens of 5 kinds, the per-row learner those of 8 rows (after each group's prompt
    # when it is shared), so 3 rows' positions fewer
    for reference in (False, True):
        names = ("plain", "merged")
        rows = {k: len(seen[k, reference]) for k in names}
        positions = {k: sum(sum(1 for t in r if t) for r in seen[k, reference]) for k in names}
        assert rows["plain"] - rows["merged"] == 3, reference
        assert positions["merged"] < positions["plain"], reference


def test_a_model_with_dropout_forwards_every_row(tmp_path):
    import transformers

    path = save_tiny(tmp_path / "m")
    config = transformers.AutoConfig.from_pretrained(path)
    config.attention_dropout = 0.1
    config.save_pretrained(path)
    assert not TorchLearner(path).dedup_rows
    assert TorchLearner(save_tiny(tmp_path / "n")).dedup_rows


def test_the_config_reaches_the_learner(tmp_path, monkeypatch):
    from agentrl.ops import parse_config
    from agentrl.ops.run import engines
    from tests.unit.test_bfloat16_auto import BASE

    seen = {}
    monkeypatch.setattr(engines, "TorchLearner", lambda weights, **kw: seen.update(kw))
    monkeypatch.setattr(engines, "kl_reference", lambda run_dir, model: model)
    monkeypatch.setattr(engines, "resolve_model", lambda model: tmp_path)
    assert parse_config(BASE).learner.dedup_rows is True  # on by default
    for value in (False, True):
        engines.torch_backend(parse_config({**BASE, "learner": {"dedup_rows": value}}), tmp_path, 0)
        assert seen["dedup_rows"] is value

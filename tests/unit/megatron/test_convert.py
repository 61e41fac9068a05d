"""HF <-> Megatron weight conversion as pure functions: layouts, round trips, errors."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.megatron import hf_to_megatron, megatron_to_hf
from agentrl.trainer.megatron._convert import ConversionError, _fuse_qkv, _split_qkv

from .tiny import MODELS, VOCAB, hf_state


def _shards(state, config, tp, pp):
    return [
        [
            hf_to_megatron(state, config, tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp)
            for t in range(tp)
        ]
        for p in range(pp)
    ]


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


def test_fused_qkv_is_interleaved_per_kv_group():
    # 4 query heads, 2 KV groups, head_dim 1: rows are labelled by their head.
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # q heads 0,1 -> group 0; 2,3 -> group 1
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    fused = _fuse_qkv(q, k, v, groups=2, head_dim=1)
    # Megatron: [q0 q1 k0 v0 | q2 q3 k1 v1]
    assert fused.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    back = _split_qkv(fused, groups=2, head_dim=1)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v), strict=True))


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_round_trip_is_exact(kind, tp, pp):
    config, model = MODELS[kind]()
    state = hf_state(model, config)
    _assert_same(megatron_to_hf(_shards(state, config, tp, pp), config), state)


def test_tp2_pp2_shard_layout_llama():
    config, model = MODELS["llama"]()
    state = hf_state(model, config)
    shards = _shards(state, config, 2, 2)
    first, last = shards[0][1], shards[1][1]
    # vocab 301 padded to 302: 151 rows per TP rank, the last row of rank 1 is padding.
    embed = first["embedding.word_embeddings.weight"]
    assert embed.shape == (151, 64)
    assert torch.equal(embed[:150], state["model.embed_tokens.weight"][151:])
    assert not embed[150].any()
    assert torch.equal(last["output_layer.weight"][:150], state["lm_head.weight"][151:])
    # stage 1 holds HF layer 1 as its local layer 0
    assert "decoder.layers.1.input_layernorm.weight" not in last
    assert torch.equal(
        last["decoder.layers.0.input_layernorm.weight"],
        state["model.layers.1.input_layernorm.weight"],
    )
    # one KV group per TP rank: 2 query heads + k + v, head_dim 16
    assert last["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (64, 64)
    # fc1 of rank 1 = [gate rows 48:96; up rows 48:96]; fc2 and o_proj split by columns
    fc1 = last["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:48], state["model.layers.1.mlp.gate_proj.weight"][48:])
    assert torch.equal(fc1[48:], state["model.layers.1.mlp.up_proj.weight"][48:])
    assert torch.equal(
        last["decoder.layers.0.mlp.linear_fc2.weight"],
        state["model.layers.1.mlp.down_proj.weight"][:, 48:],
    )
    assert "output_layer.weight" not in first and "decoder.final_layernorm.weight" not in first
    assert "embedding.word_embeddings.weight" not in last


def test_tied_embeddings():
    config, model = MODELS["qwen2"]()
    state = hf_state(model, config)
    assert "lm_head.weight" not in state
    single = _shards(state, config, 1, 1)[0][0]
    assert "output_layer.weight" not in single
    assert "decoder.layers.0.self_attention.linear_qkv.bias" in single
    # PP > 1: the last stage keeps its own copy of the embedding as output_layer.weight
    last = _shards(state, config, 2, 2)[1][0]
    assert torch.equal(last["output_layer.weight"], state["model.embed_tokens.weight"][:151])


def test_missing_tensor_is_named():
    config, model = MODELS["llama"]()
    state = hf_state(model, config)
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ConversionError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf_to_megatron(state, config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)


def test_wrong_vocab_and_uneven_splits_are_refused():
    config, model = MODELS["llama"]()
    state = hf_state(model, config)
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][: VOCAB - 1]
    with pytest.raises(ConversionError, match="300 rows, config says 301"):
        hf_to_megatron(state, config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    with pytest.raises(ConversionError, match="2 KV groups"):
        hf_to_megatron(state, config, tp_rank=0, tp_size=4, pp_rank=0, pp_size=1)
    with pytest.raises(ConversionError, match="2 layers"):
        hf_to_megatron(state, config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=3)

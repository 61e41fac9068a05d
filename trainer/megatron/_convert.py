"""HF Llama/Qwen2/Mistral weights <-> megatron-core GPTModel shards, both ways and exactly.

Mapping (``L`` = layer index; Megatron numbers layers from 0 on every pipeline
stage, the stage holding HF layers ``[pp_rank * n, (pp_rank + 1) * n)``):

======================================  ==========================================  ===========
HF                                      Megatron                                    TP split
======================================  ==========================================  ===========
model.embed_tokens.weight               embedding.word_embeddings.weight            vocab, dim 0
model.layers.L.input_layernorm          decoder.layers.L.input_layernorm            replicated
q_proj, k_proj, v_proj (weight, bias)   decoder.layers.L.self_attention.linear_qkv  per KV group
model.layers.L.self_attn.o_proj         decoder.layers.L.self_attention.linear_proj row, dim 1
model.layers.L.post_attention_layernorm decoder.layers.L.pre_mlp_layernorm          replicated
mlp.gate_proj + mlp.up_proj             decoder.layers.L.mlp.linear_fc1             [gate_r; up_r]
mlp.down_proj                           decoder.layers.L.mlp.linear_fc2             row, dim 1
model.norm.weight                       decoder.final_layernorm.weight              replicated
lm_head.weight                          output_layer.weight                         vocab, dim 0
======================================  ==========================================  ===========

``linear_qkv`` is Megatron's interleaved layout: for each KV group, that group's
query heads, then its key head, then its value head; TP rank ``r`` holds groups
``[r * G/tp, (r+1) * G/tp)``. The vocabulary is zero-padded to a multiple of the
TP size. With tied embeddings there is no ``lm_head.weight`` in the HF state and
no ``output_layer.weight`` on the last stage, except when PP > 1: then Megatron
keeps a copy of the embedding as the last stage's ``output_layer.weight``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._model import padded_vocab_size

_REPLICATED = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
}
_ROW = {
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


class ConversionError(ValueError):
    """Raised when a state dict does not fit the config (missing, extra or misshapen tensors)."""


def _dims(hf_config: Any) -> tuple[int, int, int]:
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return heads, groups, head_dim


def _tied(hf_config: Any) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


def _layers_per_stage(hf_config: Any, pp_size: int) -> int:
    layers = hf_config.num_hidden_layers
    if layers % pp_size:
        raise ConversionError(f"{layers} layers do not split evenly over {pp_size} stages")
    return layers // pp_size


def _take(hf_state: dict[str, Tensor], key: str) -> Tensor:
    try:
        return hf_state[key]
    except KeyError:
        raise ConversionError(f"HF state has no {key!r}") from None


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, groups: int, head_dim: int) -> Tensor:
    """``[q_g; k_g; v_g]`` for each KV group g (weights ``[*, H]`` or biases ``[*]``)."""
    rest = q.shape[1:]
    return torch.cat(
        [
            q.reshape(groups, -1, *rest),
            k.reshape(groups, head_dim, *rest),
            v.reshape(groups, head_dim, *rest),
        ],
        dim=1,
    ).reshape(-1, *rest)


def _split_qkv(fused: Tensor, groups: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_fuse_qkv`."""
    rest = fused.shape[1:]
    per_group = fused.reshape(groups, -1, *rest)
    q_dim = per_group.shape[1] - 2 * head_dim
    q, k, v = per_group.split([q_dim, head_dim, head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _shard(tensor: Tensor, dim: int, rank: int, size: int) -> Tensor:
    if tensor.shape[dim] % size:
        shape = tuple(tensor.shape)
        raise ConversionError(f"dimension {dim} of shape {shape} does not split into {size}")
    return tensor.chunk(size, dim=dim)[rank].clone()


def _vocab_shard(weight: Tensor, vocab: int, rank: int, size: int) -> Tensor:
    padded = padded_vocab_size(vocab, size)
    if weight.shape[0] != vocab:
        raise ConversionError(f"vocabulary weight has {weight.shape[0]} rows, config says {vocab}")
    if padded > vocab:
        weight = torch.cat([weight, weight.new_zeros(padded - vocab, *weight.shape[1:])])
    return _shard(weight, 0, rank, size)


def hf_to_megatron(
    hf_state: dict[str, Tensor],
    hf_config: Any,
    *,
    tp_rank: int,
    tp_size: int,
    pp_rank: int,
    pp_size: int,
) -> dict[str, Tensor]:
    """The GPTModel state dict of one (TP, PP) rank, from a full HF state dict.

    Keys are those of ``model.state_dict()`` without ``_extra_state`` entries.
    Pure function: no process groups needed.
    """
    _, groups, head_dim = _dims(hf_config)
    if groups % tp_size:
        raise ConversionError(f"{groups} KV groups do not split over TP size {tp_size}")
    vocab = hf_config.vocab_size
    per_stage = _layers_per_stage(hf_config, pp_size)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    out: dict[str, Tensor] = {}
    embed = _take(hf_state, "model.embed_tokens.weight")
    if first:
        out["embedding.word_embeddings.weight"] = _vocab_shard(embed, vocab, tp_rank, tp_size)
    for local in range(per_stage):
        hf = f"model.layers.{pp_rank * per_stage + local}."
        mg = f"decoder.layers.{local}."
        for hf_key, mg_key in _REPLICATED.items():
            out[mg + mg_key] = _take(hf_state, hf + hf_key).clone()
        for hf_key, mg_key in _ROW.items():
            out[mg + mg_key] = _shard(_take(hf_state, hf + hf_key), 1, tp_rank, tp_size)
        for kind in ("weight", "bias"):
            names = [f"{hf}self_attn.{p}_proj.{kind}" for p in "qkv"]
            present = [name in hf_state for name in names]
            if kind == "bias" and not any(present):
                continue
            fused = _fuse_qkv(*(_take(hf_state, n) for n in names), groups, head_dim)
            out[f"{mg}self_attention.linear_qkv.{kind}"] = _shard(fused, 0, tp_rank, tp_size)
        gate = _shard(_take(hf_state, hf + "mlp.gate_proj.weight"), 0, tp_rank, tp_size)
        up = _shard(_take(hf_state, hf + "mlp.up_proj.weight"), 0, tp_rank, tp_size)
        out[mg + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
    if last:
        out["decoder.final_layernorm.weight"] = _take(hf_state, "model.norm.weight").clone()
        if not _tied(hf_config):
            head = _take(hf_state, "lm_head.weight")
            out["output_layer.weight"] = _vocab_shard(head, vocab, tp_rank, tp_size)
        elif not first:  # tied, PP > 1: the last stage's copy of the embedding
            out["output_layer.weight"] = _vocab_shard(embed, vocab, tp_rank, tp_size)
    return out


def _cat(shards: list[dict[str, Tensor]], key: str, dim: int) -> Tensor:
    try:
        return torch.cat([shard[key] for shard in shards], dim=dim)
    except KeyError:
        raise ConversionError(f"a TP shard has no {key!r}") from None


def megatron_to_hf(shards: list[list[dict[str, Tensor]]], hf_config: Any) -> dict[str, Tensor]:
    """The full HF state dict from every rank's GPTModel state dict, ``shards[pp][tp]``.

    The exact inverse of :func:`hf_to_megatron`; ``lm_head.weight`` is present only
    when the embeddings are untied (as ``save_pretrained`` writes it).
    """
    _, groups, head_dim = _dims(hf_config)
    vocab = hf_config.vocab_size
    pp_size = len(shards)
    per_stage = _layers_per_stage(hf_config, pp_size)
    out: dict[str, Tensor] = {}
    out["model.embed_tokens.weight"] = _cat(shards[0], "embedding.word_embeddings.weight", 0)[
        :vocab
    ].clone()
    for pp_rank, stage in enumerate(shards):
        for local in range(per_stage):
            hf = f"model.layers.{pp_rank * per_stage + local}."
            mg = f"decoder.layers.{local}."
            for hf_key, mg_key in _REPLICATED.items():
                out[hf + hf_key] = _take(stage[0], mg + mg_key).clone()
            for hf_key, mg_key in _ROW.items():
                out[hf + hf_key] = _cat(stage, mg + mg_key, 1)
            for kind in ("weight", "bias"):
                key = f"{mg}self_attention.linear_qkv.{kind}"
                if key not in stage[0]:
                    continue
                q, k, v = _split_qkv(_cat(stage, key, 0), groups, head_dim)
                for name, part in zip("qkv", (q, k, v), strict=True):
                    out[f"{hf}self_attn.{name}_proj.{kind}"] = part.clone()
            halves = [shard[mg + "mlp.linear_fc1.weight"].chunk(2) for shard in stage]
            out[hf + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves])
            out[hf + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves])
    out["model.norm.weight"] = _take(shards[-1][0], "decoder.final_layernorm.weight").clone()
    if not _tied(hf_config):
        out["lm_head.weight"] = _cat(shards[-1], "output_layer.weight", 0)[:vocab].clone()
    return out


def _model_state(model) -> dict[str, Tensor]:
    """``model.state_dict()`` without ``_extra_state`` entries, detached."""
    return {
        key: value.detach()
        for key, value in model.state_dict().items()
        if not key.endswith("_extra_state")
    }


def load_hf_into(model, hf_state: dict[str, Tensor], hf_config: Any) -> None:
    """Copy an HF state dict into this rank's GPTModel shard (current parallel_state ranks).

    Raises :class:`ConversionError` when the converted keys or shapes differ from
    the model's.
    """
    from megatron.core import parallel_state

    state = hf_to_megatron(
        hf_state,
        hf_config,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
    )
    expected = _model_state(model)
    missing, extra = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or extra:
        raise ConversionError(f"key mismatch: model has {missing} unconverted, {extra} unknown")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise ConversionError(
                f"{key}: converted {tuple(value.shape)}, model {tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)


def gather_hf_state(model, hf_config: Any) -> dict[str, Tensor] | None:
    """The full HF state dict on global rank 0, ``None`` on the others. Collective.

    Every rank must call it. Data-parallel rank 0 of each (TP, PP) position sends
    its shard (on the CPU) to global rank 0, which reassembles it with
    :func:`megatron_to_hf`.
    """
    from megatron.core import parallel_state

    dp_rank = parallel_state.get_data_parallel_rank()
    mine = None
    if dp_rank == 0:
        state = {key: value.cpu() for key, value in _model_state(model).items()}
        mine = (
            parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            state,
        )
    rank = torch.distributed.get_rank()
    gathered = [None] * torch.distributed.get_world_size() if rank == 0 else None
    torch.distributed.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    shards: list[list[Any]] = [[None] * tp for _ in range(pp)]
    for item in gathered:
        if item is not None:
            shards[item[0]][item[1]] = item[2]
    return megatron_to_hf(shards, hf_config)

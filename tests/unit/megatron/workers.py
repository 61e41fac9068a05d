"""Worker functions for the multi-process Megatron tests (spawned: they must be importable)."""

from __future__ import annotations

import torch

from .tiny import MODELS, VOCAB, hf_state, input_ids


def forward(model, ids: torch.Tensor, **kwargs) -> torch.Tensor | None:
    """Logits on the last pipeline stage (``None`` elsewhere), stages linked by send/recv.

    A plain hand-off of the hidden states ``[S, B, H]`` from stage to stage: enough
    for a forward pass without Megatron's schedules.
    """
    from megatron.core import parallel_state

    positions = torch.arange(ids.shape[1]).expand_as(ids)
    if not parallel_state.is_pipeline_first_stage():
        hidden = torch.empty(ids.shape[1], ids.shape[0], model.config.hidden_size)
        torch.distributed.recv(hidden, src=parallel_state.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(hidden)
    with torch.no_grad():
        out = model(ids, positions, attention_mask=None, **kwargs)
    if not parallel_state.is_pipeline_last_stage():
        torch.distributed.send(
            out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank()
        )
        return None
    return out


def logits_and_gather(rank: int, world_size: int, tp: int, pp: int, kinds: tuple) -> dict:
    """Per model kind: this rank's logits (vocab shard, gathered and masked) and the gathered
    HF state (global rank 0 only)."""
    from agentrl.trainer.megatron import (
        build_gpt_model,
        destroy_parallel,
        gather_hf_state,
        init_parallel,
        load_hf_into,
        mask_padded_logits,
    )

    init_parallel(tp, pp)
    results = {}
    try:
        for kind in kinds:
            config, hf = MODELS[kind]()
            model = build_gpt_model(config)
            load_hf_into(model, hf_state(hf, config), config)
            model.eval()
            ids = input_ids()
            shard = forward(model, ids)
            full = forward(model, ids, runtime_gather_output=True)
            results[kind] = {
                "shard": None if shard is None else mask_padded_logits(shard, VOCAB),
                "full": full,
                "hf_state": gather_hf_state(model, config),
            }
    finally:
        destroy_parallel()
    return results

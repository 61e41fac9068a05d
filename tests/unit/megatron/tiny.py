"""Tiny random HF models for the Megatron tests, the same in every process.

Vocabulary 301 is odd, so TP=2 pads it to 302 and the converter's padding is
exercised. The Qwen2 biases are drawn non-zero (HF initialises them to zero).
"""

from __future__ import annotations

import torch

VOCAB = 301
SEED = 4321


def _common() -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
    )


def tiny_llama():
    """``(config, model)``: Llama with GQA (4 heads, 2 KV groups), untied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**_common(), tie_word_embeddings=False, rope_theta=5000.0)
    return config, _build(LlamaForCausalLM, config)


def tiny_qwen2():
    """``(config, model)``: Qwen2 with q/k/v biases and tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**_common(), tie_word_embeddings=True, use_sliding_window=False)
    return config, _build(Qwen2ForCausalLM, config)


MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}


def _build(cls, config):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = cls(config).to(torch.float32).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(".bias") or "norm" in name:
                    param.normal_(mean=1.0 if "norm" in name else 0.0, std=0.1)
    return model


def hf_state(model, config) -> dict[str, torch.Tensor]:
    """The model's state dict as ``save_pretrained`` writes it (no ``lm_head`` when tied)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def input_ids(batch: int = 2, length: int = 12) -> torch.Tensor:
    """Fixed token ids ``[batch, length]`` covering the vocabulary's end (padding neighbours)."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (batch, length), generator=gen)
    ids[0, -1] = VOCAB - 1
    return ids


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """HF logits ``[B, S, V]``."""
    with torch.no_grad():
        return model(ids).logits

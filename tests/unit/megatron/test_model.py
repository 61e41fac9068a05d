"""GPTModel from HF configs in this process (TP=1, PP=1): config mapping and logits."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.megatron import (
    UnsupportedModelError,
    build_gpt_model,
    load_hf_into,
    mask_padded_logits,
    transformer_config,
)

from .tiny import MODELS, VOCAB, hf_logits, hf_state, input_ids
from .workers import forward


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_logits_match_hf(parallel, kind):
    config, hf = MODELS[kind]()
    model = build_gpt_model(config)
    load_hf_into(model, hf_state(hf, config), config)
    model.eval()
    ids = input_ids()
    got = forward(model, ids)
    want = hf_logits(hf, ids)
    assert got.shape == want.shape  # TP=1: no vocabulary padding
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_config_mapping(parallel):
    config, _ = MODELS["qwen2"]()
    tc = transformer_config(config)
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size) == (2, 64, 96)
    assert (tc.num_attention_heads, tc.num_query_groups, tc.kv_channels) == (4, 2, 16)
    assert tc.normalization == "RMSNorm" and tc.layernorm_epsilon == 1e-6
    assert tc.gated_linear_unit and tc.activation_func is torch.nn.functional.silu
    assert tc.add_qkv_bias and not tc.add_bias_linear
    llama, _ = MODELS["llama"]()
    assert not transformer_config(llama).add_qkv_bias
    model = build_gpt_model(llama)
    assert model.rotary_pos_emb.inv_freq[1].item() == pytest.approx(5000.0 ** (-2 / 16))
    assert not model.share_embeddings_and_output_weights
    assert build_gpt_model(config).share_embeddings_and_output_weights


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "rope_theta": 1e4,
                    "low_freq_factor": 2.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                }
            },
            "low_freq_factor",
        ),
    ],
)
def test_unsupported_llama_configs_are_refused(parallel, change, message):
    config, _ = MODELS["llama"]()
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(UnsupportedModelError, match=message):
        transformer_config(config)


def test_sliding_window_and_unknown_architectures_are_refused(parallel):
    from transformers import GPT2Config, MistralConfig

    with pytest.raises(UnsupportedModelError, match="sliding_window=4096"):
        transformer_config(MistralConfig(sliding_window=4096))
    qwen, _ = MODELS["qwen2"]()
    qwen.use_sliding_window = True
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        transformer_config(qwen)
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2'"):
        transformer_config(GPT2Config())


def test_llama3_rope_scaling_is_passed_on(parallel):
    config, _ = MODELS["llama"]()
    config.rope_parameters = {
        "rope_type": "llama3",
        "factor": 8.0,
        "rope_theta": 5000.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = build_gpt_model(config)
    # the lowest frequency (longest wavelength, > 8192 tokens) is divided by the factor
    lowest = 5000.0 ** (-14 / 16)
    assert model.rotary_pos_emb.inv_freq[-1].item() == pytest.approx(lowest / 8.0, rel=1e-5)


def test_mask_padded_logits_at_tp1(parallel):
    logits = torch.zeros(1, 2, VOCAB + 1)
    masked = mask_padded_logits(logits, VOCAB)
    assert torch.isinf(masked[..., VOCAB]).all() and not masked[..., :VOCAB].any()
    assert mask_padded_logits(logits[..., :VOCAB], VOCAB) is not None

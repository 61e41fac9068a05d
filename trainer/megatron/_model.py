"""megatron-core GPTModel from a Hugging Face Llama/Qwen2/Mistral config, and the process groups.

The model uses megatron-core's local layer spec (plain torch modules, no
Transformer Engine), so the same code runs on CPU over gloo (tests) and on GPUs
over NCCL. The embedding and output layer are vocab-parallel: the vocabulary is
padded up to a multiple of the tensor-parallel size, no further
(:func:`padded_vocab_size`); :mod:`._convert` pads and unpads the weights, and
:func:`mask_padded_logits` hides the padded columns from a softmax.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from ._compat import ensure_cpu_compat

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
"""HF ``model_type`` values whose architecture this module maps exactly."""


class UnsupportedModelError(ValueError):
    """Raised when an HF config uses a feature the Megatron mapping does not reproduce."""


_OWN_PROCESS_GROUP = False


# --- process groups ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_parallel(tp: int = 1, pp: int = 1, *, seed: int = 0, device: str = "auto") -> None:
    """Initialise torch.distributed (if needed), Megatron's model-parallel groups and RNG.

    ``device``: the learner's device name; ``auto`` (the default) is CUDA when
    torch sees a GPU. The backend is gloo on CPU (after :func:`ensure_cpu_compat`)
    and nccl on GPU.
    Under torchrun (``RANK``/``WORLD_SIZE`` set) the env:// rendezvous is used;
    otherwise a single process group of size 1 on a free local port. The data
    parallel size is what remains: ``world_size / (tp * pp)``. The RNG tracker is
    seeded with ``seed`` (TP ranks get distinct model-parallel states).
    """
    global _OWN_PROCESS_GROUP
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from .._device import resolve_device

    cuda = resolve_device(device).type == "cuda"
    if not cuda:
        ensure_cpu_compat()
    if not torch.distributed.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            if cuda:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            torch.distributed.init_process_group(backend, init_method="env://")
        else:
            torch.distributed.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0
            )
        _OWN_PROCESS_GROUP = True
    world = torch.distributed.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"world size {world} is not a multiple of tp*pp = {tp}*{pp}")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    """Tear down Megatron's groups, and the process group if :func:`init_parallel` made it."""
    global _OWN_PROCESS_GROUP
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if _OWN_PROCESS_GROUP and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _OWN_PROCESS_GROUP = False


# --- config -------------------------------------------------------------------------------


def _get(hf_config: Any, name: str, default: Any = None) -> Any:
    value = getattr(hf_config, name, default)
    return default if value is None else value


def rope_settings(hf_config: Any) -> dict[str, Any]:
    """GPTModel's RoPE arguments (``rotary_base``, ``rope_scaling``, ...) from an HF config.

    Handles both ``rope_parameters`` (transformers 5) and ``rope_theta`` +
    ``rope_scaling`` (transformers 4). Only the default RoPE and Llama 3 scaling
    with Megatron's fixed constants are reproduced exactly; others are refused.
    """
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    params = dict(params or {})
    theta = params.get("rope_theta", _get(hf_config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    settings: dict[str, Any] = {"rotary_base": theta, "rope_scaling": False}
    if rope_type == "default":
        return settings
    if rope_type == "llama3":
        # Megatron's scaling hard-codes these three constants; only the factor is an argument.
        fixed = {
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        wrong = {k: params.get(k) for k, v in fixed.items() if float(params.get(k, v)) != v}
        if not wrong:
            settings.update(rope_scaling=True, rope_scaling_factor=float(params["factor"]))
            return settings
        raise UnsupportedModelError(f"llama3 RoPE scaling with {wrong} (Megatron fixes {fixed})")
    raise UnsupportedModelError(f"RoPE type {rope_type!r} is not supported (default, llama3)")


def _check_supported(hf_config: Any) -> None:
    problems = []
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        problems.append(f"model_type {model_type!r} (supported: {supported})")
    if _get(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {hf_config.hidden_act!r} (only silu)")
    if _get(hf_config, "attention_bias", False):
        problems.append("attention_bias=True (bias on o_proj too)")
    if _get(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True")
    window = getattr(hf_config, "sliding_window", None)
    if model_type == "qwen2":
        layer_types = getattr(hf_config, "layer_types", None) or []
        if _get(hf_config, "use_sliding_window", False) or any(
            t != "full_attention" for t in layer_types
        ):
            problems.append("sliding-window attention")
    elif window is not None:
        problems.append(f"sliding_window={window}")
    try:
        rope_settings(hf_config)
    except UnsupportedModelError as exc:
        problems.append(str(exc))
    if problems:
        raise UnsupportedModelError("unsupported HF config: " + "; ".join(problems))


def transformer_config(
    hf_config: Any, *, dtype: torch.dtype = torch.float32, device: torch.device | None = None
):
    """Megatron ``TransformerConfig`` equivalent to an HF Llama/Qwen2/Mistral config.

    RMSNorm, SwiGLU (``gated_linear_unit`` + silu), RoPE, GQA
    (``num_query_groups``), no linear biases except Qwen2's q/k/v bias
    (``add_qkv_bias``), dropout 0, unfused kernels, softmax in float32.
    TP/PP sizes come from the initialised ``parallel_state``. Parameters are
    initialised on ``device`` when it is a GPU, else on the CPU. Raises
    :class:`UnsupportedModelError` for what the mapping does not reproduce.
    """
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig

    _check_supported(hf_config)
    heads = hf_config.num_attention_heads
    kv_heads = _get(hf_config, "num_key_value_heads", heads)
    head_dim = _get(hf_config, "head_dim", hf_config.hidden_size // heads)
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=kv_heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        use_cpu_initialization=device is None or device.type != "cuda",
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        apply_query_key_layer_scaling=False,
    )


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The vocabulary rounded up to a multiple of the tensor-parallel size."""
    return -(-vocab_size // tp_size) * tp_size


def build_gpt_model(
    hf_config: Any,
    *,
    dtype: torch.dtype = torch.float32,
    parallel_output: bool = True,
    device: torch.device | None = None,
):
    """A randomly initialised ``GPTModel`` shard for this rank's pipeline stage, on ``device``
    (default the CPU): every parameter and buffer, the norms that megatron-core's local
    spec builds on the CPU included.

    Local (non-Transformer-Engine) layer spec; ``pre_process``/``post_process``
    from the current pipeline stage; embeddings tied as in ``tie_word_embeddings``.
    With ``parallel_output`` (Megatron's default) each TP rank returns its vocab
    slice of the logits ``[B, S, V_padded / tp]``; otherwise the full padded
    vocabulary. Either way, padded columns must be masked
    (:func:`mask_padded_logits`) or sliced off before a softmax. Load weights with
    :func:`agentrl.trainer.megatron.load_hf_into`.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(hf_config, dtype=dtype, device=device)
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    if config.num_layers % pp:
        raise UnsupportedModelError(
            f"{config.num_layers} layers do not split evenly over {pp} pipeline stages"
        )
    tp = parallel_state.get_tensor_model_parallel_world_size()
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=padded_vocab_size(hf_config.vocab_size, tp),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=bool(_get(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_percent=1.0,
        **rope_settings(hf_config),
    )
    return model.to(device=device or "cpu", dtype=dtype)


def mask_padded_logits(logits: torch.Tensor, vocab_size: int, *, parallel_output: bool = True):
    """``logits`` with the vocabulary-padding columns set to ``-inf`` (a new tensor).

    ``logits`` is ``[..., V_shard]``: this TP rank's slice when ``parallel_output``
    (the default of :func:`build_gpt_model`), else the full padded vocabulary.
    """
    from megatron.core import parallel_state

    width = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * width if parallel_output else 0
    real = max(0, min(width, vocab_size - start))
    if real == width:
        return logits
    out = logits.clone()
    out[..., real:] = float("-inf")
    return out

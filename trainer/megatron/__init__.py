"""agentrl.trainer.megatron: megatron-core GPTModel, its CPU shim and HF <-> Megatron weights.

Importing this package imports torch only; megatron-core is imported by the
functions that need it (install the ``megatron`` extra). See docs/megatron.md.
"""

from ._compat import ensure_cpu_compat
from ._convert import gather_hf_state, hf_to_megatron, load_hf_into, megatron_to_hf
from ._learner import MegatronLearner
from ._model import (
    UnsupportedModelError,
    build_gpt_model,
    destroy_parallel,
    init_parallel,
    mask_padded_logits,
    padded_vocab_size,
    transformer_config,
)

__all__ = [
    "MegatronLearner",
    "UnsupportedModelError",
    "build_gpt_model",
    "destroy_parallel",
    "ensure_cpu_compat",
    "gather_hf_state",
    "hf_to_megatron",
    "init_parallel",
    "load_hf_into",
    "mask_padded_logits",
    "megatron_to_hf",
    "padded_vocab_size",
    "transformer_config",
]

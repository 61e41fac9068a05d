"""agentrl.trainer: GRPO maths, training batches, the torch learner backend, models."""

from ._backend import LearnerBackend
from ._batch import TrainBatch, build_batch, micro_batches
from ._device import DeviceUnavailable, resolve_device
from ._digest import checkpoint_digest
from ._grpo import (
    episode_reward,
    group_advantages,
    group_spread,
    k3_kl,
    ppo_clip_loss,
    task_normalize,
    token_logprobs,
    token_mean,
)
from ._lora import LoraError, LoraSpec
from ._models import (
    ModelError,
    ModelNotFound,
    check_hub_model,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
)
from ._torch_learner import TorchLearner

__all__ = [
    "DeviceUnavailable",
    "LearnerBackend",
    "LoraError",
    "LoraSpec",
    "ModelError",
    "ModelNotFound",
    "TorchLearner",
    "TrainBatch",
    "build_batch",
    "check_hub_model",
    "checkpoint_digest",
    "episode_reward",
    "group_advantages",
    "group_spread",
    "k3_kl",
    "load_causal_lm",
    "load_tokenizer",
    "micro_batches",
    "ppo_clip_loss",
    "resolve_device",
    "resolve_model",
    "task_normalize",
    "token_logprobs",
    "token_mean",
]

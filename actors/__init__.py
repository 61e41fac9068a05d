"""agentrl.actors: controller, rollout, sampler and learner actors; the sampler engines in
`agentrl.actors.engines`."""

from ._controller import ControllerActor, TaskEntry
from ._learner import LearnerActor
from ._metrics import batch_metrics, is_success
from ._rollout import EpisodeLimits, RolloutActor
from ._sampler import SamplerActor
from ._wire import TopologySpec, broadcast, declare, decode_or_dead_letter, subscribe
from .engines import (
    EngineClosed,
    EngineError,
    Generation,
    SamplerEngine,
    TorchEngine,
    WeightsMismatch,
)

__all__ = [
    "ControllerActor",
    "EngineClosed",
    "EngineError",
    "EpisodeLimits",
    "Generation",
    "LearnerActor",
    "RolloutActor",
    "SamplerActor",
    "SamplerEngine",
    "TaskEntry",
    "TopologySpec",
    "TorchEngine",
    "WeightsMismatch",
    "batch_metrics",
    "broadcast",
    "declare",
    "decode_or_dead_letter",
    "is_success",
    "subscribe",
]

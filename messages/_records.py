"""Wire records: the envelope and every payload kind (those of the environment side, with
the nested chat records, in `_env_records`).

All records are frozen, slotted dataclasses. The codec (`_codec.py`) validates
and converts them purely from these type hints, so the hints *are* the schema:

- ``int`` scalars are signed 64-bit; ``list[int]`` fields are packed as
  little-endian int32 (values must fit int32); ``Annotated[list[int], MASK01]``
  fields are packed one byte per value and hold only 0/1.
- ``float`` scalars and ``list[float]`` values must be finite (``list[float]``
  is packed as float32, so values are rounded to float32 and must fit its
  range). ``dict[str, float]`` values (metrics, timings, state) may be any
  float, NaN and infinities included.
- ``Literal[...]`` fields accept only the listed strings.
- a bare ``dict`` is a JSON-like value (str keys; None, bool, int, finite
  float, str, list, dict), used for OpenAI-style tool schemas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Generic, Literal, TypeVar

from ._env_records import (
    EnvCancel,
    EnvInteract,
    EnvReply,
    EnvStart,
    SessionReport,
    SessionsLost,
)

SCHEMA_VERSION = 2
"""Version of the wire schema; a message with any other version is rejected."""

MASK01 = "agentrl.messages.mask01"
"""``Annotated`` marker: a ``list[int]`` of 0/1 values, packed one byte per value."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """Routing and bookkeeping data sent alongside every payload."""

    kind: str
    """Payload kind, the payload class's ``KIND`` (e.g. ``"trajectory"``)."""
    schema: int
    """Wire schema version the sender speaks (``SCHEMA_VERSION``)."""
    message_id: str
    """Unique id of this message (uuid4 hex unless the sender chose one)."""
    run: str
    """Name of the training run the message belongs to."""
    sent_at: float
    """Sender's wall clock at encode time, seconds since the epoch."""


# --- rollout ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EpisodeRequest:
    """Controller -> rollout worker: play one episode of one task instance."""

    KIND: ClassVar[str] = "episode_request"

    episode_id: str
    """Unique id of the episode."""
    task: str
    """Task name in the environment registry."""
    index: int
    """Index of the task instance within the task's data set."""
    group_id: str
    """Id of the GRPO group (same task instance) the episode belongs to."""
    sample_idx: int
    """Position of this episode within its group, ``0 <= sample_idx < group_size``."""
    group_size: int
    """Number of episodes in the group."""
    issued_version: int
    """Policy version current when the controller issued the request."""
    attempt: int = 0
    """Retry counter; 0 for the first attempt."""


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """Rollout worker -> sampler pool: sample one assistant turn."""

    KIND: ClassVar[str] = "generate_request"

    request_id: str
    """Unique id of the request, echoed in the result."""
    episode_id: str
    """Episode the turn belongs to."""
    prompt_ids: list[int]
    """Full prompt token ids, ``[P]``."""
    max_new_tokens: int
    """Upper bound on the number of sampled tokens."""
    temperature: float
    """Sampling temperature."""
    top_p: float
    """Nucleus sampling threshold in (0, 1]."""
    stop_ids: list[int]
    """Token ids that end the turn (included in the output when sampled)."""
    seed: int | None = None
    """Sampling seed, or None for nondeterministic sampling."""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """Sampler pool -> rollout worker: the sampled turn."""

    KIND: ClassVar[str] = "generate_result"

    request_id: str
    """Id of the request this answers."""
    token_ids: list[int]
    """Sampled token ids, ``[T]``."""
    logprobs: list[float]
    """Log-probability of each sampled token under the sampling policy, ``[T]``."""
    version: int
    """Policy version that sampled the tokens."""
    pool: str
    """Name of the sampler pool that served the request."""
    finish_reason: Literal["stop", "length"]
    """``stop``: a stop id was sampled; ``length``: ``max_new_tokens`` was reached."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """Rollout worker -> learner: one finished episode, flattened to tokens.

    ``token_ids``, ``loss_mask``, ``logprobs`` and ``versions`` have equal length L.
    """

    KIND: ClassVar[str] = "trajectory"

    episode_id: str
    """Id of the episode."""
    group_id: str
    """Id of the GRPO group."""
    task: str
    """Task name."""
    index: int
    """Task instance index."""
    sample_idx: int
    """Position within the group."""
    group_size: int
    """Number of episodes in the group."""
    issued_version: int
    """Policy version current when the episode was issued."""
    token_ids: list[int]
    """All tokens of the conversation, ``[L]``."""
    loss_mask: Annotated[list[int], MASK01]
    """1 on sampled assistant tokens, 0 elsewhere, ``[L]``."""
    logprobs: list[float]
    """Sampling log-probability where ``loss_mask == 1``, 0.0 elsewhere, ``[L]``."""
    versions: list[int]
    """Policy version that sampled each token where ``loss_mask == 1``, -1 elsewhere, ``[L]``."""
    pools: list[str]
    """Sampler pool name per assistant turn, ``[turns]``."""
    reward: float
    """Final scalar reward, after the penalty rule."""
    env_reward: float
    """Reward as reported by the environment."""
    status: str
    """Final environment status (see ``agentrl.environments`` Status values)."""
    num_turns: int
    """Number of assistant turns."""
    timings: dict[str, float]
    """Named durations in seconds (e.g. ``generate``, ``env``)."""
    metrics: dict[str, float]
    """Environment and rollout metrics."""


# --- checkpoints and control --------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointReady:
    """Learner or controller -> everyone: new policy weights are available."""

    KIND: ClassVar[str] = "checkpoint_ready"

    version: int
    """Policy version of the checkpoint (0 = the initial weights)."""
    uri: str
    """Where to load the weights from."""
    digest: str
    """Content digest of the checkpoint, to verify a load."""
    created_at: float
    """Wall clock when the checkpoint was written, seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class CheckpointQuery:
    """RPC to the controller asking for the latest checkpoint; the reply is a CheckpointReady."""

    KIND: ClassVar[str] = "checkpoint_query"

    requester: str
    """Id of the asking actor, for logs."""


@dataclass(frozen=True, slots=True)
class StatusQuery:
    """RPC to the controller asking for the run's state; the reply is a MetricsReport."""

    KIND: ClassVar[str] = "status_query"

    requester: str
    """Id of the asker, for logs."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Any actor -> controller: liveness and a few gauges."""

    KIND: ClassVar[str] = "heartbeat"

    node: str
    """Host or process group name."""
    role: str
    """Actor role (e.g. ``sampler``, ``rollout``, ``learner``)."""
    actor_id: str
    """Unique id of the actor."""
    at: float
    """Wall clock of the beat, seconds since the epoch."""
    state: dict[str, float]
    """Named gauges (queue depths, versions, busy fractions)."""
    labels: dict = field(default_factory=dict)
    """Named string attributes (e.g. ``{"pool": "current", "event": "loaded"}``), JSON-like."""


@dataclass(frozen=True, slots=True)
class ControlCommand:
    """Controller -> actors: change the run state."""

    KIND: ClassVar[str] = "control_command"

    command: Literal["pause", "resume", "shutdown"]
    """What to do."""
    reason: str
    """Human-readable reason, for logs."""


@dataclass(frozen=True, slots=True)
class MetricsReport:
    """Any actor -> metrics sink: a batch of namespaced metric values."""

    KIND: ClassVar[str] = "metrics_report"

    source: str
    """Id of the reporting actor."""
    step: int
    """Step the values belong to (learner step, or the reporter's own counter)."""
    values: dict[str, float]
    """Metric name (e.g. ``rollout/reward``) -> value."""


Payload = (
    EpisodeRequest
    | GenerateRequest
    | GenerateResult
    | Trajectory
    | CheckpointReady
    | CheckpointQuery
    | StatusQuery
    | Heartbeat
    | ControlCommand
    | MetricsReport
    | EnvStart
    | EnvInteract
    | EnvCancel
    | EnvReply
    | SessionReport
    | SessionsLost
)
"""Any payload record (a class with a ``KIND``)."""

PAYLOAD_TYPES: tuple[type[Payload], ...] = (
    EpisodeRequest,
    GenerateRequest,
    GenerateResult,
    Trajectory,
    CheckpointReady,
    CheckpointQuery,
    StatusQuery,
    Heartbeat,
    ControlCommand,
    MetricsReport,
    EnvStart,
    EnvInteract,
    EnvCancel,
    EnvReply,
    SessionReport,
    SessionsLost,
)
"""Every payload class, in table order."""

P = TypeVar("P", bound=Payload)


@dataclass(frozen=True, slots=True)
class Message(Generic[P]):
    """A decoded message."""

    envelope: Envelope
    """The envelope as sent."""
    payload: P
    """The validated payload record."""

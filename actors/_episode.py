"""One episode, turn by turn (DESIGN "Episodes"), and the trajectory it becomes.

1. the environment has started a session: first messages + tools; the chat
   format renders them to prompt ids;
2. `sample(ids, max_new)` gets one assistant turn from some sampler pool: the
   sampled ids, their logprobs and the policy version that produced them;
3. the sampled ids are appended *as sampled* (loss mask 1, with their logprobs
   and version); the decoded text is parsed for tool calls. Text holding a
   malformed call is passed on as it is, ``ChatMessage(role="assistant",
   content=<raw text>, tool_calls=[])``, exactly like a message without a call:
   the environment answers it (AgentBench replies that no executable call was
   found) and the episode goes on. The turn is counted in the trajectory's
   ``malformed_turns`` metric;
4. the environment answers; its messages are rendered by diffing the templated
   conversation and appended with loss mask 0; repeat until the environment
   finishes the episode (each task ends its episodes at its own turn limit with
   `task_limit_reached`), the context is full (`agent_context_limit`) or the
   optional safety cap `EpisodeLimits.max_turns` is hit (`task_limit_reached`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from agentrl.environments import (
    ChatFormat,
    Environment,
    MalformedToolCall,
    Start,
    Status,
    parse_assistant,
    session_tools,
)
from agentrl.messages import ChatMessage, EpisodeRequest, GenerateResult, Trajectory
from agentrl.trainer import episode_reward

log = structlog.get_logger(__name__)

__all__ = [
    "EpisodeLimits",
    "InfraFailure",
    "assistant_message",
    "infra_trajectory",
    "play_episode",
    "sample_error_trajectory",
]


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits and sampling parameters."""

    max_turns: int | None = None
    """Safety cap on assistant turns (`task_limit_reached` when hit); None = no cap, the
    task's own turn limit ends the episode."""
    max_tokens: int = 1024
    """Context tokens before `agent_context_limit`."""
    max_new_tokens: int = 128
    """Most tokens sampled per turn."""
    temperature: float = 0.8
    top_p: float = 1.0
    penalty: float = -0.2
    """Reward of an episode that does not end `completed`."""
    generate_timeout: float = 600.0
    """Seconds to wait for a sampler before the turn counts as an infra failure."""
    max_attempts: int = 3
    """Infra failures tolerated per episode before it is given up as `task_error`."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_dropped_metrics(task: str, metrics: dict) -> None:
    """Say once per task and key that a task metric outside ``env/`` is not reported (the
    learner aggregates only ``env/<name>`` keys, as ``env/<task>/<name>``; ``success``, which
    decides an episode's success when given, is read too)."""
    for key in metrics:
        if isinstance(key, str) and (key.startswith("env/") or key == "success"):
            continue
        with _warned_lock:
            if (task, str(key)) in _warned:
                continue
            _warned.add((task, str(key)))
        log.warning(
            "task metric dropped: only env/<name> keys are reported", task=task, key=str(key)
        )


class InfraFailure(Exception):
    """Raised when something outside the model broke the episode (no sampler answered)."""


Sample = Callable[[list[int], int], tuple[str, GenerateResult]]
"""``sample(prompt_ids, max_new_tokens) -> (pool, result)``: one assistant turn."""


def assistant_message(text: str) -> tuple[ChatMessage, str | None]:
    """The message the environment gets for sampled ``text``, and why its call was malformed.

    A malformed call gives the raw text with no tool calls (the environment
    answers it like any message without a call) and the parser's reason; a
    readable one gives the parsed message and None.
    """
    try:
        return parse_assistant(text), None
    except MalformedToolCall as exc:
        return ChatMessage(role="assistant", content=text, tool_calls=[]), str(exc)


def play_episode(
    req: EpisodeRequest,
    env: Environment,
    start: Start,
    fmt: ChatFormat,
    limits: EpisodeLimits,
    sample: Sample,
) -> Trajectory:
    """Drive the started episode to its end and build its trajectory.

    The session is cancelled unless the environment finished it. Raises what
    ``sample`` or the environment raise (infra failures are the caller's).
    """
    t0 = time.monotonic()
    history = list(start.messages)
    tools = session_tools(env, start)
    ids = list(fmt.prompt_ids(history, tools))
    mask, logps, versions, pools = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), []
    status, env_reward, metrics = Status.TASK_LIMIT_REACHED, 0.0, {}
    gen_time, finished, malformed = 0.0, False, 0
    turns = itertools.count() if limits.max_turns is None else range(limits.max_turns)
    try:
        for _turn in turns:
            budget = limits.max_tokens - len(ids)
            if budget <= 0:
                status = Status.AGENT_CONTEXT_LIMIT
                break
            g0 = time.monotonic()
            pool, result = sample(ids, min(limits.max_new_tokens, budget))
            gen_time += time.monotonic() - g0
            pools.append(pool)
            ids += result.token_ids
            mask += [1] * len(result.token_ids)
            logps += result.logprobs
            versions += [result.version] * len(result.token_ids)
            text = fmt.decode_assistant(result.token_ids)
            message, why = assistant_message(text)
            if why is not None:
                malformed += 1
                log.debug(
                    "malformed tool call passed to the environment",
                    episode=req.episode_id,
                    task=req.task,
                    version=result.version,
                    reason=why,
                )
            if result.finish_reason == "length" and len(ids) >= limits.max_tokens:
                status = Status.AGENT_CONTEXT_LIMIT
                break
            history.append(message)
            step = env.interact(start.session, message)
            metrics = dict(step.metrics)
            _warn_dropped_metrics(req.task, metrics)
            if step.finish:
                status, env_reward, finished = Status(step.status), step.reward, True
                break
            closing = fmt.closing_ids(result.token_ids)
            obs = closing + fmt.observation_ids(history, step.messages, tools)
            history.extend(step.messages)
            ids += obs
            mask += [0] * len(obs)
            logps += [0.0] * len(obs)
            versions += [-1] * len(obs)
    finally:
        if not finished:
            env.cancel(start.session)
    metrics["malformed_turns"] = float(malformed)
    metrics["env/failed_attempts"] = float(req.attempt)  # earlier attempts lost to infra
    return trajectory(
        req,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logps,
        versions=versions,
        pools=pools,
        reward=episode_reward(env_reward, str(status.value), limits.penalty),
        env_reward=float(env_reward),
        status=str(status.value),
        num_turns=len(pools),
        timings={"episode": time.monotonic() - t0, "generate": gen_time},
        metrics={k: float(v) for k, v in metrics.items()},
    )


def trajectory(req: EpisodeRequest, **outcome) -> Trajectory:
    """A Trajectory carrying the request's identity fields plus the episode's outcome."""
    return Trajectory(
        episode_id=req.episode_id,
        group_id=req.group_id,
        task=req.task,
        index=req.index,
        sample_idx=req.sample_idx,
        group_size=req.group_size,
        issued_version=req.issued_version,
        **outcome,
    )


def infra_trajectory(req: EpisodeRequest, penalty: float) -> Trajectory:
    """The record of an episode lost to infrastructure: no tokens, left out of its group."""
    return _untrained(req, penalty, "infra_failure")


def sample_error_trajectory(req: EpisodeRequest, penalty: float) -> Trajectory:
    """The record of an instance the task could not set up (`SampleError`): left out too."""
    return _untrained(req, penalty, "sample_error")


def _untrained(req: EpisodeRequest, penalty: float, why: str) -> Trajectory:
    return trajectory(
        req,
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        versions=[],
        pools=[],
        reward=penalty,
        env_reward=0.0,
        status=Status.TASK_ERROR.value,
        num_turns=0,
        timings={},
        metrics={why: 1.0},
    )

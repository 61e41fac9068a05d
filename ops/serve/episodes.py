"""Episodes played by an outside agent through the endpoint, and the trajectories they become.

An outside agent opens an episode, makes chat-completion calls in it, and ends it with a
reward (or lets a built-in task's environment judge it). The calls become one trajectory
with the layout agentrl's own rollouts have: prompt and environment tokens with loss mask 0,
sampled tokens *as sampled* with mask 1, their logprobs and the version that sampled them.

How a call joins the episode's tokens. A call's messages normally repeat the episode's
history: the previous call's messages, then the assistant message the endpoint returned
(content and tool calls as returned), then new messages (tool results, a user turn). Then
only the new messages are rendered, after the sampled tokens (`ChatFormat.observation_ids`):
the sampled tokens are never re-tokenised. A call whose messages do not extend the history
that way (the agent rewrote or trimmed it), or that changes the tools, starts a new
*segment*: its prompt is rendered whole. An episode's trajectory is its last segment, the
one that led to the reward; earlier segments are not trained (their sampled tokens are
counted in the trajectory's ``serve/segments`` and ``serve/untrained_tokens`` metrics).

Rewards. A task of the run's config is judged by its environment (`EpisodeBook.step`); its
agent may give an episode up (`end_by_agent` with a status other than ``completed``, for
the run's penalty) but never names its reward. Any other task is the agent's own: the
reward it ends an episode with must be a finite number inside ``reward_range``, since one
infinite reward makes every advantage of its group NaN.

Groups. GRPO compares episodes of one instance. Episodes opened without a group join the
task's filling group (one instance, ``group_size`` slots, the next instance once full); an
agent may also name a group (every episode of it plays the same task instance).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.actors._mix import TaskMixer
from agentrl.environments import (
    ChatFormat,
    Environment,
    MalformedToolCall,
    Status,
    parse_assistant,
    session_tools,
)
from agentrl.environments._chat import _json_or_text
from agentrl.messages import ChatMessage, GenerateResult, Trajectory
from agentrl.trainer import episode_reward

__all__ = ["EpisodeBook", "EpisodeError", "ServedEpisode", "ServedGroup"]


class EpisodeError(Exception):
    """A request that does not fit the episode (unknown id, ended, full group): ``status``
    is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ServedGroup:
    """A GRPO group of served episodes: one task instance, ``size`` slots."""

    id: str
    task: str
    index: int
    size: int
    version: int
    """The policy version when the group was opened (its episodes' issued version)."""
    opened: int = 0


@dataclass
class ServedEpisode:
    """One episode's state: its group slot, its current segment's tokens, its session."""

    id: str
    group: ServedGroup
    sample_idx: int
    session: Any = None
    """The built-in environment's session, or None for an episode the agent judges."""
    messages: list[ChatMessage] = field(default_factory=list)
    """The history as of the last call: its messages, then the assistant turn returned."""
    tools: list[dict] = field(default_factory=list)
    last_sampled: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)
    turns: int = 0
    segments: int = 0
    untrained_tokens: int = 0
    malformed: int = 0
    last_active: float = field(default_factory=time.monotonic)
    """When its agent last did something (a call's start or end, a step)."""
    in_call: bool = False
    """A completion is being sampled: the episode is not idle, however long that takes."""
    started: float = field(default_factory=time.monotonic)

    def append(self, ids: Sequence[int], *, sampled: GenerateResult | None = None) -> None:
        self.token_ids.extend(ids)
        if sampled is None:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.versions.extend([-1] * len(ids))
        else:
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(sampled.logprobs[: len(ids)])
            self.versions.extend([sampled.version] * len(ids))


def _norm(message: ChatMessage) -> tuple:
    """What must match for a message of the request to be the one in the history."""
    calls = tuple(
        (c.name, json.dumps(_json_or_text(c.arguments), sort_keys=True)) for c in message.tool_calls
    )
    return (message.role, (message.content or "").strip(), calls, message.tool_call_id)


class EpisodeBook:
    """Every open served episode; thread-safe. ``publish`` sends a finished trajectory."""

    def __init__(
        self,
        fmt: ChatFormat,
        *,
        envs: dict[str, Environment],
        group_size: int,
        penalty: float,
        publish: Callable[[Trajectory], None],
        version: Callable[[], int],
        on_group: Callable[[ServedGroup], None] | None = None,
        seed: int = 0,
        judged: frozenset[str] = frozenset(),
        reward_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        """``judged``: the run's task names whose environment judges them, beyond
        ``envs`` (a task on environment workers, which the endpoint cannot play);
        ``reward_range``: the rewards an agent may give an episode of its own task."""
        self._fmt = fmt
        self._envs = envs
        self._judged = frozenset(judged) | frozenset(envs)
        self._reward_range = reward_range
        self._group_size = group_size
        self._penalty = penalty
        self._publish = publish
        self._version = version
        self._on_group = on_group
        self._lock = threading.Lock()
        self._episodes: dict[str, ServedEpisode] = {}
        self._groups: dict[str, ServedGroup] = {}
        self._filling: dict[str, ServedGroup] = {}
        self._mixers = {
            name: TaskMixer({name: 1.0}, {name: env.num_instances}, seed=seed)
            for name, env in envs.items()
        }

    # --- opening ---------------------------------------------------------------------

    def open(
        self, task: str, *, group: str | None = None, group_size: int | None = None
    ) -> tuple[ServedEpisode, list[ChatMessage], list[dict]]:
        """A new episode of ``task``: its state, opening messages and tools (a built-in
        task's; empty for a task the agent plays and judges itself)."""
        if task in self._judged and task not in self._envs:
            raise EpisodeError(
                f"task {task!r} runs on the run's environment workers: the endpoint cannot "
                "play it, and its reward is not the agent's"
            )
        with self._lock:
            slot = self._slot(task, group, group_size)
            episode = ServedEpisode(f"{slot.id}-{slot.opened}", slot, slot.opened)
            slot.opened += 1
            if slot.opened == slot.size:
                self._filling.pop(task, None)
            self._episodes[episode.id] = episode
        env = self._envs.get(task)
        if env is None:
            return episode, [], []
        start = env.start(slot.index)
        episode.session = start.session
        return episode, list(start.messages), session_tools(env, start)

    def _slot(self, task: str, group: str | None, size: int | None) -> ServedGroup:
        if group is not None and group in self._groups:
            found = self._groups[group]
            if found.task != task:
                raise EpisodeError(f"group {group!r} plays task {found.task!r}, not {task!r}")
            if found.opened >= found.size:
                raise EpisodeError(f"group {group!r} is full ({found.size} episodes)", 409)
            return found
        if group is None and task in self._filling:
            return self._filling[task]
        size = size or self._group_size
        if size < 1:
            raise EpisodeError(f"group_size must be >= 1, got {size}")
        mixer = self._mixers.get(task)
        index = mixer.next_index(task) if mixer is not None else 0
        made = ServedGroup(group or uuid.uuid4().hex[:12], task, index, size, self._version())
        self._groups[made.id] = made
        if group is None:
            self._filling[task] = made
        if self._on_group is not None:
            self._on_group(made)
        return made

    def get(self, episode_id: str) -> ServedEpisode:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeError(
                f"no open episode {episode_id!r} (ended, expired or never opened)", 404
            )
        episode.last_active = time.monotonic()
        return episode

    # --- calls -----------------------------------------------------------------------

    def prompt(
        self, episode: ServedEpisode, messages: list[ChatMessage], tools: list[dict]
    ) -> list[int]:
        """Append this call's prompt to the episode (module doc) and return the whole
        segment's ids, the prompt to sample from."""
        known = len(episode.messages)
        extends = (
            episode.token_ids
            and tools == episode.tools
            and len(messages) > known
            and [_norm(m) for m in messages[:known]] == [_norm(m) for m in episode.messages]
        )
        if extends:
            new = messages[known:]
            ids = self._fmt.closing_ids(episode.last_sampled)
            ids += self._fmt.observation_ids(episode.messages, new, tools)
            episode.append(ids)
        else:
            if episode.token_ids:  # a new segment: the earlier one is not trained
                episode.untrained_tokens += sum(episode.loss_mask)
                episode.token_ids, episode.loss_mask = [], []
                episode.logprobs, episode.versions, episode.pools = [], [], []
            episode.segments += 1
            episode.tools = list(tools)
            episode.append(self._fmt.prompt_ids(messages, tools))
        episode.messages = list(messages)
        return list(episode.token_ids)

    def sampled(
        self, episode: ServedEpisode, result: GenerateResult, message: ChatMessage, malformed: bool
    ) -> None:
        """Append a sampled turn and ``message``, the assistant message it was returned as
        (what the agent's next call must repeat for the call to extend the episode)."""
        episode.append(result.token_ids, sampled=result)
        episode.last_sampled = list(result.token_ids)
        episode.pools.append(result.pool)
        episode.turns += 1
        episode.malformed += malformed
        episode.messages.append(message)

    # --- the end -----------------------------------------------------------------------

    def step(self, episode: ServedEpisode, message: ChatMessage | None):
        """A built-in task's environment answers the assistant turn (the last one returned
        when ``message`` is None); the episode ends when the environment says so."""
        env = self._envs.get(episode.group.task)
        if env is None or episode.session is None:
            raise EpisodeError(f"task {episode.group.task!r} has no built-in environment here")
        if message is None:
            if not episode.messages or episode.messages[-1].role != "assistant":
                raise EpisodeError("no assistant turn to answer yet: make a completion first")
            message = episode.messages[-1]
        step = env.interact(episode.session, message)
        if step.finish:
            self.end(episode, step.reward, step.status.value, metrics=step.metrics)
        return step

    def end_by_agent(
        self, episode: ServedEpisode, reward: float | None, status: str = "completed"
    ) -> Trajectory:
        """End ``episode`` as its agent asks (module doc, Rewards): refused (EpisodeError)
        for a reward the agent may not give, before anything ends."""
        ended = [s.value for s in Status if s != Status.RUNNING]
        if status not in ended:
            raise EpisodeError(f"status: {status!r} is not one of {', '.join(ended)}")
        task = episode.group.task
        if task in self._judged:
            if reward is not None or status == Status.COMPLETED:
                raise EpisodeError(
                    f"task {task!r} is judged by its environment: its reward comes from "
                    f"/v1/episodes/{episode.id}/step, not from the agent; /end may only give "
                    "the episode up (a status other than completed, no reward)",
                    403,
                )
            return self.end(episode, 0.0, status)
        low, high = self._reward_range
        if reward is None:
            if status == Status.COMPLETED:
                raise EpisodeError("reward: required to end a completed episode")
            reward = 0.0
        if not (math.isfinite(reward) and low <= reward <= high):
            raise EpisodeError(
                f"reward: {reward!r} is not a finite number in [{low}, {high}] (serve.reward_range)"
            )
        return self.end(episode, reward, status)

    def end(
        self,
        episode: ServedEpisode,
        env_reward: float,
        status: str = "completed",
        *,
        metrics: dict[str, float] | None = None,
    ) -> Trajectory:
        """Finish the episode: its trajectory (the last segment) is published."""
        with self._lock:
            if self._episodes.pop(episode.id, None) is None:
                raise EpisodeError(f"episode {episode.id!r} has already ended", 409)
        env = self._envs.get(episode.group.task)
        if env is not None and episode.session is not None:
            env.cancel(episode.session)  # idempotent; frees a session ended early
        traj = Trajectory(
            episode_id=episode.id,
            group_id=episode.group.id,
            task=episode.group.task,
            index=episode.group.index,
            sample_idx=episode.sample_idx,
            group_size=episode.group.size,
            issued_version=episode.group.version,
            token_ids=list(episode.token_ids),
            loss_mask=list(episode.loss_mask),
            logprobs=list(episode.logprobs),
            versions=list(episode.versions),
            pools=list(episode.pools),
            reward=episode_reward(env_reward, status, self._penalty),
            env_reward=float(env_reward),
            status=status,
            num_turns=episode.turns,
            timings={"episode": time.monotonic() - episode.started},
            metrics={
                **(metrics or {}),
                "malformed_turns": float(episode.malformed),
                "serve/segments": float(episode.segments),
                "serve/untrained_tokens": float(episode.untrained_tokens),
                **({} if episode.turns else {"sample_error": 1.0}),  # nothing to learn from
            },
        )
        self._publish(traj)
        return traj

    def expire(self, idle: float) -> list[Trajectory]:
        """End every episode idle for ``idle`` seconds (its agent is gone): each becomes an
        untrained member of its group (``infra_failure``), so the group is not held."""
        now = time.monotonic()
        with self._lock:
            gone = [
                e for e in self._episodes.values() if not e.in_call and now - e.last_active > idle
            ]
        out = []
        for episode in gone:
            episode.token_ids, episode.loss_mask, episode.logprobs = [], [], []
            episode.versions, episode.pools = [], []
            try:
                out.append(self.end(episode, 0.0, "cancelled", metrics={"infra_failure": 1.0}))
            except EpisodeError:  # ended by its agent meanwhile
                continue
        return out

    def open_count(self) -> int:
        with self._lock:
            return len(self._episodes)


def read_assistant(text: str) -> tuple[ChatMessage, bool]:
    """The assistant message sampled text reads as, and whether it held a malformed tool
    call (then it is the text as it is, with no calls)."""
    try:
        return parse_assistant(text), False
    except MalformedToolCall:
        return ChatMessage(role="assistant", content=text, tool_calls=[]), True

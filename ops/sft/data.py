"""Oracle trajectories for ``agentrl sft``, in exactly the rollout's token format.

Each task with an oracle check agent (``CHECK_AGENTS["oracle"]``, see
`agentrl.environments._check`) is played by its oracle through the rollout's
own episode loop (`actors._episode.play_episode`, the oracle in the sampler's
place), so the episode is recorded the way the rollout records one:

- ``prompt_ids(start messages, tools)``, loss mask 0;
- per turn, the ids a sampler returns for the oracle's call written as text
  (``call_text``): the text's token ids followed by the end-of-turn ids (the
  sampler's stop token is included), loss mask 1;
- the text is read back with ``decode_assistant`` + ``parse_assistant``, so the
  environment gets the very message the rollout would hand it;
- ``closing_ids`` + ``observation_ids(history, new messages, tools)``, mask 0.

So SFT and RL train on the same ids for the same text (tests/unit/test_sft_data.py
checks it against a rollout whose scripted engine "samples" the oracle's turns).

An instance is skipped (and counted by reason) when its oracle episode does
not end ``completed`` with reward 1 (``failed``), cannot start (``start_error``),
or would not fit the run's rollout limits (``too_long``: more turns than
``max_turns``, a turn longer than ``max_new_tokens`` or the context budget).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.actors import EpisodeLimits
from agentrl.actors._episode import play_episode
from agentrl.environments import (
    ChatFormat,
    EnvError,
    Environment,
    Status,
    TaskOptionsError,
    make_task,
)
from agentrl.environments._check import AgentStep, scripts_for, step_text, teacher_of
from agentrl.messages import EpisodeRequest, GenerateResult, Trajectory

__all__ = [
    "SKIP_REASONS",
    "OracleMix",
    "SFTDataError",
    "assistant_ids",
    "make_train_task",
    "oracle_for",
    "oracle_trajectory",
]

SKIP_REASONS = ("failed", "start_error", "too_long")
"""Why an instance gives no SFT episode (see the module doc)."""

MAX_CONSECUTIVE_SKIPS = 200
"""A task whose oracle gives nothing on this many instances in a row is an error."""


Oracle = Callable[[Environment, int, random.Random], Iterator[AgentStep]]
"""A task's oracle check agent: ``oracle(env, index, rng)`` yields one call per turn."""


class SFTDataError(RuntimeError):
    """Raised when a task cannot give oracle episodes (no oracle, or it never succeeds)."""


def make_train_task(name: str, options: Mapping[str, Any]) -> tuple[Environment, str]:
    """The task ``name`` built with ``options`` on its train split; returns (env, split).

    Tasks whose factory has no ``split`` option are built as configured (split
    ``all``). An explicit ``split`` other than ``train`` in the options is refused:
    warm-starting on held-out instances would leak them into evaluation.
    """
    given = options.get("split", "train")
    if given != "train":
        raise SFTDataError(f"task {name!r}: sft trains on the train split, options say {given!r}")
    try:
        return make_task(name, **{**options, "split": "train"}), "train"
    except TaskOptionsError:
        if "split" in options:
            raise
    return make_task(name, **options), "all"  # raises the options' own problem, if any


def oracle_for(factory: str, env: Environment) -> Oracle:
    """The oracle agent of the registered task ``factory`` (SFTDataError if it has none)."""
    try:
        oracle = teacher_of(scripts_for(factory, env))
    except ValueError as exc:
        raise SFTDataError(f"task {factory!r} has no oracle agent: {exc}") from exc
    if oracle is None:
        raise SFTDataError(f"task {factory!r} has no oracle agent")
    return oracle


class _Skip(Exception):
    """Raised inside an oracle episode that gives no SFT data; ``reason`` is in SKIP_REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def oracle_trajectory(
    task: str,
    env: Environment,
    index: int,
    fmt: ChatFormat,
    tokenizer: Any,
    limits: EpisodeLimits,
    *,
    oracle: Oracle | None = None,
    seed: int = 0,
) -> Trajectory | str:
    """The oracle's episode on instance ``index`` as a Trajectory, or why it is skipped.

    The episode is played by the rollout's own loop (`actors._episode.play_episode`)
    with the oracle standing in for the sampler, so the token layout is the
    rollout's by construction. ``task`` names the trajectory (the run's task
    entry); ``oracle`` defaults to the oracle of the registered task of that name.
    """
    oracle = oracle or oracle_for(task, env)
    try:
        start = env.start(index)
    except EnvError:
        return "start_error"
    calls = oracle(env, index, random.Random(f"{seed}:{task}:{index}"))

    def sample(ids: list[int], max_new: int) -> tuple[str, GenerateResult]:
        call = next(calls, None)
        if call is None:  # the oracle stopped before the task ended the episode
            raise _Skip("failed")
        sampled = assistant_ids(fmt, tokenizer, call)
        if len(sampled) > max_new:
            raise _Skip("too_long")
        n = len(sampled)
        return "oracle", GenerateResult("", sampled, [0.0] * n, 0, "oracle", "stop")

    req = EpisodeRequest(
        episode_id=f"sft-{task}-{index}",
        task=task,
        index=index,
        group_id=f"sft-{task}-{index}",
        sample_idx=0,
        group_size=1,
        issued_version=0,
    )
    try:
        traj = play_episode(req, env, start, fmt, limits, sample)
    except _Skip as skip:  # play_episode has cancelled the session
        return skip.reason
    if traj.status == Status.TASK_LIMIT_REACHED.value and traj.num_turns == limits.max_turns:
        return "too_long"
    if traj.status == Status.AGENT_CONTEXT_LIMIT.value:
        return "too_long"
    if traj.status != Status.COMPLETED.value or traj.env_reward < 1.0:
        return "failed"
    return traj


def assistant_ids(fmt: ChatFormat, tokenizer: Any, call: AgentStep) -> list[int]:
    """The ids a sampler returns for ``call`` written as text (`step_text`: several calls
    one per line, a text step as it is): its tokens, then end-of-turn."""
    try:
        text = step_text(call)
    except ValueError as exc:
        raise SFTDataError(f"oracle {exc}") from exc
    return [*tokenizer.encode(text, add_special_tokens=False), *fmt.end_of_turn_ids]


@dataclass
class OracleMix:
    """Oracle episodes of several tasks, each drawn by its weight (seeded).

    Within a task the instances are visited in a seeded random order, all once
    before any twice; ``counts`` and ``skipped`` say what was drawn so far.
    """

    envs: Mapping[str, Environment]
    """Environments by task entry name (the run's ``tasks:`` keys)."""
    weights: Mapping[str, float]
    fmt: ChatFormat
    tokenizer: Any
    limits: EpisodeLimits
    seed: int = 0
    factories: Mapping[str, str] = field(default_factory=dict)
    """Registered task of an entry whose name differs from it (its oracle is that task's)."""
    counts: Counter = field(default_factory=Counter)
    """Episodes given per task."""
    skipped: dict[str, Counter] = field(default_factory=dict)
    """Instances skipped per task, by reason (`SKIP_REASONS`)."""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._tasks = sorted(self.envs)
        self._orders: dict[str, list[int]] = {}
        self._cursor: Counter = Counter()
        self._oracles = {
            t: oracle_for(self.factories.get(t, t), env) for t, env in self.envs.items()
        }
        for task in self._tasks:
            self.skipped[task] = Counter()
            if self.envs[task].num_instances < 1:
                raise SFTDataError(f"task {task!r} has no instances")

    def sample(self, episodes: int) -> list[Trajectory]:
        """``episodes`` oracle trajectories, tasks mixed by weight."""
        weights = [self.weights[t] for t in self._tasks]
        tasks = self._rng.choices(self._tasks, weights=weights, k=episodes)
        return [self._next(task) for task in tasks]

    def _next(self, task: str) -> Trajectory:
        env = self.envs[task]
        for _ in range(MAX_CONSECUTIVE_SKIPS):
            index = self._next_index(task, env.num_instances)
            result = oracle_trajectory(
                task,
                env,
                index,
                self.fmt,
                self.tokenizer,
                self.limits,
                oracle=self._oracles[task],
                seed=self.seed,
            )
            if isinstance(result, Trajectory):
                self.counts[task] += 1
                return result
            self.skipped[task][result] += 1
        reasons = dict(self.skipped[task])
        raise SFTDataError(
            f"task {task!r}: the oracle gave no usable episode on {MAX_CONSECUTIVE_SKIPS} "
            f"instances in a row (skipped so far: {reasons}); check the task with "
            f"`agentrl-env check --task {task} --agent oracle` and the rollout limits"
        )

    def _next_index(self, task: str, n: int) -> int:
        position = self._cursor[task] % n
        if position == 0:
            order = list(range(n))
            self._rng.shuffle(order)
            self._orders[task] = order
        self._cursor[task] += 1
        return self._orders[task][position]

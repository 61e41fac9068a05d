"""Evaluate a checkpoint: pass rate per task, the mean over k runs, on the training code path.

`evaluate` starts one `SamplerActor` (the supervisor's engine construction) and
one `RolloutActor` on a fresh `memory://` broker, publishes `EpisodeRequest`s
and reads the `Trajectory`s back from the trajectories queue, so an evaluated
episode is exactly a training episode: same environments, chat rendering,
tool-call parsing, limits and statuses.

Instances: episode i of every run is instance index i of the task, so all runs
see the same `episodes` instances and differ only by sampling randomness (at
temperature 0 they are identical). Held-out instances come from task options,
never from a different index range: every task whose factory takes a `split`
option is evaluated on ``split="test"`` unless its options name a split
(`with_split`); the options used are in the report.

Turn limits are the tasks' own (`max_turns` in their options); the `max_turns`
argument is only an optional safety cap, as `rollout.max_turns` in training.

When the sampler or the rollout actor stops before the last episode, the
`EvalError` names the actor and the exception that stopped it, with the episode
and task it was running.

Numbers per task: the pass rate of each run (success as `agentrl.actors.is_success`
defines it), their mean and sample (Bessel-corrected) std over runs (0 for one
run), and over all episodes of all runs: mean reward (`Trajectory.reward`, the
penalty rule applied, as `env/<task>/reward` in training), mean assistant turns
and the count of each status. Each episode is its own group of one
(`group_size` 1, `issued_version` 0); nothing outside the learner needs groups.

Sampling seeds come from the engine's seed stream in the order requests reach
it, so with `concurrency` > 1 a run at temperature > 0 is not bit-reproducible.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from agentrl.actors import EpisodeLimits, SamplerEngine, is_success
from agentrl.environments import EnvError, make_task
from agentrl.messages import EpisodeRequest, Trajectory

from ..run.engines import torch_engine
from .episodes import EvalError, run_episodes
from .task_split import make_on_split

log = structlog.get_logger(__name__)

__all__ = [
    "EvalError",
    "EvalReport",
    "TaskResult",
    "eval_problems",
    "evaluate",
    "format_table",
    "with_split",
]


@dataclass(frozen=True)
class TaskResult:
    """The numbers of one task."""

    task: str
    options: dict[str, Any]
    """The task options the environment was built with."""
    runs: int
    episodes: int
    """Episodes per run (instances 0 .. episodes-1)."""
    pass_rates: tuple[float, ...]
    """Pass rate of each run, `[runs]`."""
    pass_rate_mean: float
    pass_rate_std: float
    """Sample std over runs; 0.0 for a single run."""
    reward_mean: float
    """Mean `Trajectory.reward` over all episodes of all runs."""
    turns_mean: float
    """Mean assistant turns over all episodes of all runs."""
    statuses: dict[str, int]
    """Episodes per status over all runs."""
    solved_per_instance: tuple[int, ...]
    """Runs in which instance i succeeded, `[episodes]` (for pass@k)."""


@dataclass(frozen=True)
class EvalReport:
    """An evaluation: the settings and one `TaskResult` per task, in the order given."""

    checkpoint: str
    runs: int
    episodes: int | None
    """Episodes per run of each task; None: every instance (each task's count is in its
    `TaskResult`)."""
    temperature: float
    max_turns: int | None
    """The safety cap on turns; None: only the tasks' own limits."""
    max_tokens: int
    max_new_tokens: int
    seed: int
    seconds: float
    """Wall time of the episodes (model loading included)."""
    tasks: dict[str, TaskResult]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def eval_problems(
    tasks: Mapping[str, Mapping[str, Any]],
    *,
    episodes: int | None,
    runs: int,
    temperature: float,
    task_episodes: Mapping[str, int] | None = None,
    max_turns: int | None,
    max_tokens: int,
    max_new_tokens: int,
    concurrency: int = 1,
) -> list[str]:
    """Every problem with these arguments (empty when `evaluate` can run them)."""
    problems = []
    if not tasks:
        problems.append("tasks: at least one task is needed")
    if runs < 1:
        problems.append(f"runs: must be >= 1, got {runs}")
    if episodes is not None and episodes < 1:
        problems.append(f"episodes: must be >= 1 (or None: every instance), got {episodes}")
    if temperature < 0:
        problems.append(f"temperature: must be >= 0, got {temperature}")
    if max_turns is not None and max_turns < 1:
        problems.append(f"max_turns: must be >= 1, got {max_turns}")
    if max_new_tokens < 1 or max_tokens <= max_new_tokens:
        problems.append("max_tokens: must exceed max_new_tokens (both >= 1)")
    if concurrency < 1:
        problems.append(f"concurrency: must be >= 1, got {concurrency}")
    for name, options in tasks.items():
        try:
            env = make_task(name, **options)
        except (EnvError, ValueError, TypeError) as exc:
            problems.append(f"task {name}: {exc}")
            continue
        n = (task_episodes or {}).get(name, episodes)
        if n is not None and n > env.num_instances:
            problems.append(
                f"task {name}: {n} episodes per run but only {env.num_instances} instances"
            )
    for name, n in (task_episodes or {}).items():
        if name not in tasks or n < 1:
            problems.append(f"task_episodes: {name}={n}: not a task here, or < 1")
    return problems


def with_split(
    tasks: Mapping[str, Mapping[str, Any]], split: str = "test"
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``tasks`` with ``split`` added to the options of every task that takes a split and
    names none; and the split each task is built on. A task whose options do not build
    keeps them as given (`eval_problems` reports why)."""
    options_used, splits = {}, {}
    for name, options in tasks.items():
        try:
            _, options_used[name], splits[name] = make_on_split(name, options, split)
        except (EnvError, ValueError, TypeError):
            options_used[name], splits[name] = dict(options), "?"
    return options_used, splits


def evaluate(
    checkpoint: Path,
    tasks: Mapping[str, Mapping[str, Any]],
    *,
    episodes: int | None,
    runs: int,
    task_episodes: Mapping[str, int] | None = None,
    temperature: float = 0.8,
    max_turns: int | None = None,
    max_tokens: int = 1024,
    max_new_tokens: int = 128,
    seed: int = 0,
    concurrency: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    make_engine: Callable[[Path, int, int], SamplerEngine] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Run `runs` x `episodes` episodes of each task on the weights in `checkpoint`.

    `tasks` maps a task name to its options (`make_task(name, **options)`); a task
    that takes a `split` option and names none is evaluated on `split="test"`.
    `episodes` None plays every instance of each task (a benchmark's whole category);
    `task_episodes` overrides it for the tasks it names.
    `device` is the torch engine's (`cpu`, `cuda`, `cuda:N`, `auto`).
    `make_engine(weights, version, max_batch)` replaces the torch engine (tests
    use a scripted one). `on_progress(done, total)` is called from this thread
    whenever more episodes have finished. Raises EvalError listing every problem
    with the arguments, or when an actor stops before the last episode.
    """
    tasks, _ = with_split(tasks)
    problems = eval_problems(
        tasks,
        episodes=episodes,
        task_episodes=task_episodes,
        runs=runs,
        temperature=temperature,
        max_turns=max_turns,
        max_tokens=max_tokens,
        max_new_tokens=max_new_tokens,
        concurrency=concurrency,
    )
    if problems:
        raise EvalError("; ".join(problems))
    checkpoint = Path(checkpoint)
    make_engine = make_engine or functools.partial(
        torch_engine, dtype=dtype, seed=seed, device=device
    )
    envs = {name: make_task(name, **options) for name, options in tasks.items()}
    counts = {name: episodes or env.num_instances for name, env in envs.items()}
    counts.update(task_episodes or {})
    requests, run_of = [], {}
    for run in range(runs):
        for task in tasks:
            for index in range(counts[task]):
                episode_id = f"{task}-r{run}-i{index}"
                run_of[episode_id] = run
                requests.append(
                    EpisodeRequest(
                        episode_id=episode_id,
                        task=task,
                        index=index,
                        group_id=episode_id,
                        sample_idx=0,
                        group_size=1,
                        issued_version=0,
                    )
                )
    t0 = time.monotonic()
    trajectories = run_episodes(
        checkpoint,
        envs,
        requests,
        limits=EpisodeLimits(
            max_turns=max_turns,
            max_tokens=max_tokens,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        ),
        engine_factory=functools.partial(make_engine, checkpoint, 0, concurrency),
        concurrency=concurrency,
        seed=seed,
        on_progress=on_progress,
    )
    seconds = time.monotonic() - t0
    results = {}
    for name, options in tasks.items():
        per_run: list[list[Trajectory]] = [[] for _ in range(runs)]
        for t in trajectories:
            if t.task == name:
                per_run[run_of[t.episode_id]].append(t)
        results[name] = _task_result(name, dict(options), per_run, counts[name])
    return EvalReport(
        checkpoint=str(checkpoint),
        runs=runs,
        episodes=episodes,
        temperature=temperature,
        max_turns=max_turns,
        max_tokens=max_tokens,
        max_new_tokens=max_new_tokens,
        seed=seed,
        seconds=seconds,
        tasks=results,
    )


def _task_result(
    name: str, options: dict[str, Any], per_run: list[list[Trajectory]], episodes: int
) -> TaskResult:
    everything = [t for run in per_run for t in run]
    rates = tuple(statistics.fmean(is_success(t) for t in run) for run in per_run)
    solved = Counter(t.index for t in everything if is_success(t))
    return TaskResult(
        task=name,
        options=options,
        runs=len(per_run),
        episodes=episodes,
        pass_rates=rates,
        pass_rate_mean=statistics.fmean(rates),
        pass_rate_std=statistics.stdev(rates) if len(rates) > 1 else 0.0,
        reward_mean=statistics.fmean(t.reward for t in everything),
        turns_mean=statistics.fmean(t.num_turns for t in everything),
        statuses=dict(sorted(Counter(t.status for t in everything).items())),
        solved_per_instance=tuple(solved[i] for i in range(episodes)),
    )


def format_table(report: EvalReport) -> str:
    """A markdown table: one row per task; then, when BFCL categories were run
    (``bfcl:<category>``), BFCL's leaderboard table of them (`bfcl.leaderboard`)."""
    lines = [
        "| task | runs | episodes/run | pass rate (mean ± std) | reward | turns |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report.tasks.values():
        lines.append(
            f"| {r.task} | {r.runs} | {r.episodes} | {r.pass_rate_mean:.3f} ± "
            f"{r.pass_rate_std:.3f} | {r.reward_mean:+.3f} | {r.turns_mean:.2f} |"
        )
    table = "\n".join(lines) + "\n"
    bfcl = {
        r.options.get("category") or name.partition(":")[2]: (r.pass_rate_mean, r.episodes)
        for name, r in report.tasks.items()
        if name.partition(":")[0] == "bfcl" and (":" in name or "category" in r.options)
    }
    if bfcl:
        from agentrl.environments.tasks.bfcl.leaderboard import format_leaderboard

        table += "\n" + format_leaderboard(bfcl)
    return table

"""`agentrl`: commands around a run; `agentrl eval` evaluates a checkpoint, `agentrl report`
plots a run's metrics, `agentrl sft` warm-starts a run's model on its tasks' oracles.

    agentrl sft --config examples/local.yaml --steps 50 --run local-sft
    agentrl eval --checkpoint runs/local/checkpoints/v000028 --tasks calculator \\
        --runs 4 --episodes 32 --task-option calculator.seed=1 --out runs/local/eval.md
    agentrl report runs/local --out /tmp/local-report
    agentrl trace --run-dir runs/local
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from agentrl.environments import EnvError, expand_task_name
from agentrl.trainer import ModelError

from ..eval.evaluate import EvalError, eval_problems, evaluate, format_table, with_split
from ..logs.configure import configure_logging
from ..report.plots import ReportError, write_report
from .models import checkpoint_dir, resolve_loudly

__all__ = ["main"]


_NUMBERS: dict[str, tuple[type, int | float, str]] = {  # option: (type, default, help)
    "runs": (int, 4, "runs per task"),
    "episodes": (
        lambda raw: None if raw == "all" else int(raw),
        32,
        "episodes per run: instances 0 .. N-1 of each task; 'all': every instance of each "
        "task (a benchmark's whole category: --tasks bfcl:multiple --episodes all)",
    ),
    "temperature": (float, 0.8, "sampling temperature (0 = greedy)"),
    "max_tokens": (int, 1024, "context tokens per episode"),
    "max_new_tokens": (int, 128, "tokens sampled per turn"),
    "seed": (int, 0, "engine sampling seed"),
    "concurrency": (int, 16, "episodes at once (and the engine's batch size)"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser(
        "eval",
        help="pass rate per task of a checkpoint, the mean over k runs",
        description="Run --runs x --episodes episodes per task (episode i of every run is "
        "instance i) on the training code path and print a markdown table.",
    )
    ev.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint directory (runs/<run>/checkpoints/v000028) or a model spec: "
        "smollm2, tiny, an HF model directory, a hub name",
    )
    ev.add_argument(
        "--tasks",
        required=True,
        help="comma-separated task names; bfcl:CATEGORY is one BFCL category, and a BFCL "
        "collection (bfcl:non_live, bfcl:live, bfcl:multi_turn, bfcl:simple, bfcl:all) "
        "stands for its categories",
    )
    for name, (_, default, help_) in _NUMBERS.items():
        ev.add_argument(
            f"--{name.replace('_', '-')}", default=str(default), help=f"{help_}; default {default}"
        )
    ev.add_argument(
        "--max-turns",
        type=int,
        help="safety cap on assistant turns per episode; default none: each task's own "
        "limit (its max_turns option) applies, as in training",
    )
    ev.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="TASK.KEY=VALUE",
        help="a task option, VALUE in YAML; repeatable. Tasks with a split option are "
        "evaluated on split=test unless one is given here (db.split=train)",
    )
    ev.add_argument(
        "--task-episodes",
        action="append",
        default=[],
        metavar="TASK=N",
        help="episodes per run of one task instead of --episodes; repeatable "
        "(--tasks bfcl:simple,bfcl:multi_turn_base --episodes all "
        "--task-episodes bfcl:multi_turn_base=8)",
    )
    ev.add_argument(
        "--device",
        default="cpu",
        help="where the sampler engine runs: cpu, cuda, cuda:N or auto; default cpu",
    )
    ev.add_argument("--out", help="write the table to this file and the numbers to FILE.json")
    cmp_ = sub.add_parser(
        "compare",
        help="paired comparison of two `agentrl eval --out` results on the same instances",
        description="Per task and for the mean over tasks: the pass rate before and after, "
        "the change and its paired-bootstrap 95%% interval (instances resampled, the same "
        "ones on both sides). Both results must have evaluated each shared task with the "
        "same options and instance count.",
    )
    cmp_.add_argument("before", help="eval result JSON (agentrl eval --out X.md writes X.json)")
    cmp_.add_argument("after", help="eval result JSON of the same instances")
    cmp_.add_argument("--resamples", type=int, default=10_000, help="bootstrap draws")
    cmp_.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    cmp_.add_argument("--out", help="also write the table to this file")
    rep = sub.add_parser(
        "report",
        help="PNG plots and a markdown summary of a run's metrics.jsonl",
        description="Read RUN_DIR/metrics.jsonl and write reward/success per task, staleness, "
        "idle ratio and throughput plots and summary.md (needs agentrl[report]).",
    )
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/local")
    rep.add_argument("--out", help="output directory; default RUN_DIR/report")
    sft = sub.add_parser(
        "sft",
        help="supervised warm start on the tasks' oracle episodes, before RL",
        description="Train the run's model on oracle episodes of its tasks (train split, "
        "mixed by weight) with the NLL of the assistant tokens, then write checkpoint "
        "runs/<run>/checkpoints/v<STEPS>: `agentrl-supervisor start` continues from it.",
    )
    sft.add_argument("--config", required=True, help="the run's YAML config")
    sft.add_argument("--steps", required=True, type=int, help="optimiser updates")
    sft.add_argument("--run", help="run name (default: the config's)")
    sft.add_argument(
        "--batch-episodes",
        type=int,
        help="episodes per update; default the run's episodes "
        "per batch (group_size x groups_per_batch)",
    )
    sft.add_argument("--lr", type=float, help="learning rate; default learner.lr")
    serve = sub.add_parser(
        "serve",
        help="the OpenAI-compatible endpoint on a run's sampler pools (docs/serve.md)",
        description="Serve /v1/chat/completions and /v1/episodes for the run of --config: "
        "completions are sampled by the run's sampler pools over its broker, and served "
        "episodes go to its learner. The same as `agentrl-supervisor start --roles serve`.",
    )
    serve.add_argument("--config", required=True, help="the run's YAML config")
    serve.add_argument("--broker", help="override the config's broker URL")
    serve.add_argument("--run", help="override the run name")
    serve.add_argument("--host", help="address (default: the config's serve.host)")
    serve.add_argument("--port", type=int, help="port (default: the config's serve.port)")
    trace = sub.add_parser(
        "trace",
        help="a local web page over a run's trained and dropped episodes",
        description="Serve the episodes the learner kept in RUN_DIR/trace.sqlite: every turn "
        "with its tool calls and results, reward, status, the versions that sampled it, each "
        "token coloured by its advantage; filters by task, status, version and reward, and "
        "two versions side by side. Read-only; it may run while the run trains.",
    )
    trace.add_argument("--run-dir", required=True, help="a run directory, e.g. runs/local")
    trace.add_argument("--host", default="127.0.0.1", help="address; default 127.0.0.1")
    trace.add_argument("--port", type=int, default=8765, help="port; default 8765")
    trace.add_argument(
        "--tokenizer",
        help="model directory whose tokenizer decodes the tokens; default the one the "
        "learner recorded, else the newest checkpoint's",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging("warning")
    if args.command == "report":
        return _report(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "sft":
        return _sft(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "trace":
        return _trace(args)
    return _eval(args)


def _compare(args: argparse.Namespace) -> int:
    from ..eval.compare import CompareError, compare_reports, format_comparison, load_report

    if args.resamples < 100:
        print("agentrl compare: --resamples must be >= 100", file=sys.stderr)
        return 2
    try:
        before, after = load_report(args.before), load_report(args.after)
        comparison = compare_reports(before, after, resamples=args.resamples, seed=args.seed)
    except CompareError as exc:
        print(f"agentrl compare: {exc}", file=sys.stderr)
        return 2
    table = format_comparison(comparison, args.before, args.after)
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import dataclasses

    from ..config.load import ConfigError, load_config
    from ..run.supervisor import Supervisor

    try:
        cfg = load_config(args.config, broker=args.broker, run=args.run)
    except ConfigError as exc:
        print(f"agentrl serve: {exc}", file=sys.stderr)
        return 2
    serve = dataclasses.replace(
        cfg.serve,
        host=args.host or cfg.serve.host,
        port=cfg.serve.port if args.port is None else args.port,
    )
    configure_logging("info")
    return Supervisor(dataclasses.replace(cfg, serve=serve), ("serve",)).run()


def _trace(args: argparse.Namespace) -> int:
    from ..trace import trace_command

    return trace_command(Path(args.run_dir), args.host, args.port, tokenizer=args.tokenizer)


def _sft(args: argparse.Namespace) -> int:
    from ..config.load import ConfigError, load_config
    from ..sft.data import SFTDataError
    from ..sft.train import SFTError, run_sft

    try:
        cfg = load_config(args.config, run=args.run)
    except ConfigError as exc:
        print(f"agentrl sft: {exc}", file=sys.stderr)
        return 2
    try:
        resolve_loudly(cfg.model)  # a first use converts it, saying so
        result = run_sft(cfg, steps=args.steps, batch_episodes=args.batch_episodes, lr=args.lr)
    except (SFTError, SFTDataError, ModelError) as exc:
        print(f"agentrl sft: {exc}", file=sys.stderr)
        return 1
    record = result.record
    print(
        f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f} over {len(result.losses)} "
        f"updates; episodes {result.episodes}; skipped {result.skipped}"
    )
    print(f"checkpoint {cfg.run_dir / record.checkpoint} (version {record.version})")
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        files = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    except ReportError as exc:
        print(f"agentrl report: {exc}", file=sys.stderr)
        return 2
    print(files.summary)
    for path in files.plots.values():
        print(path)
    for name, why in files.skipped.items():
        print(f"agentrl report: {name} plot skipped: {why}", file=sys.stderr)
    return 0


def _eval(args: argparse.Namespace) -> int:
    problems: list[str] = []
    numbers: dict[str, Any] = {}
    for name, (kind, default, _) in _NUMBERS.items():
        raw = getattr(args, name)
        try:
            numbers[name] = kind(raw)
        except ValueError:
            what = {int: "an integer", float: "a number"}.get(kind, "an integer or 'all'")
            problems.append(f"--{name.replace('_', '-')}: not {what}: {raw!r}")
            numbers[name] = default  # so that the checks below do not report it again
    tasks: dict[str, dict[str, Any]] = {t.strip(): {} for t in args.tasks.split(",") if t.strip()}
    for item in args.task_option:
        name, dot, rest = item.partition(".")
        for task in tasks:  # an import path (my.envs:make_env) holds dots of its own
            if item.startswith(f"{task}.") and len(task) > len(name):
                name, rest = task, item[len(task) + 1 :]
        key, eq, value = rest.partition("=")
        if not (dot and eq and name and key):
            problems.append(f"--task-option {item!r}: expected TASK.KEY=VALUE")
        elif name not in tasks:
            problems.append(f"--task-option {item!r}: task {name!r} is not in --tasks")
        else:
            try:
                tasks[name][key] = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                problems.append(f"--task-option {item!r}: value is not YAML: {exc}")
    tasks = _expanded(tasks, problems)
    task_episodes: dict[str, int] = {}
    for item in args.task_episodes:
        name, eq, value = item.rpartition("=")
        if not (eq and name and value.isdigit() and int(value) >= 1):
            problems.append(f"--task-episodes {item!r}: expected TASK=N with N >= 1")
        elif name not in tasks:
            problems.append(f"--task-episodes {item!r}: task {name!r} is not in --tasks")
        else:
            task_episodes[name] = int(value)
    numbers["max_turns"] = args.max_turns
    checkpoint, problem = checkpoint_dir(args.checkpoint)
    if problem:
        problems.append(problem)
    tasks, splits = with_split(tasks)
    problems += eval_problems(
        tasks, task_episodes=task_episodes, **{k: v for k, v in numbers.items() if k != "seed"}
    )
    from agentrl.trainer._device import device_problem

    if (device_error := device_problem(args.device)) is not None:
        problems.append(f"--device: {device_error}")
    if args.out and Path(args.out).suffix == ".json":
        problems.append(f"--out {args.out!r}: the table is markdown; the numbers go to FILE.json")
    if problems:
        print("agentrl eval: bad arguments:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 2
    for name, split in splits.items():
        print(f"agentrl eval: task {name}: split {split}", file=sys.stderr)
    try:
        report = evaluate(
            checkpoint,
            tasks,
            task_episodes=task_episodes,
            on_progress=_progress_printer(),
            device=args.device,
            **numbers,
        )
    except EvalError as exc:
        print(f"agentrl eval: {exc}", file=sys.stderr)
        return 1
    table = format_table(report)
    print(table, end="")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        out.with_suffix(".json").write_text(report.to_json() + "\n")
        print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


def _expanded(tasks: dict[str, dict[str, Any]], problems: list[str]) -> dict[str, dict[str, Any]]:
    """Task names that stand for several (`expand_task_name`: BFCL's collections) replaced
    by those, each with the options given to the collection."""
    out: dict[str, dict[str, Any]] = {}
    for name, options in tasks.items():
        try:
            names = expand_task_name(name)
        except (EnvError, ValueError) as exc:
            problems.append(f"--tasks: {exc}")
            names = [name]
        for expanded in names:
            out.setdefault(expanded, {}).update(options)
    return out


def _progress_printer():
    """Print `episodes done/total` to stderr at most every 10 s, and at the end."""
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 10.0:
            last[0] = now
            print(f"agentrl eval: {done}/{total} episodes", file=sys.stderr, flush=True)

    return report


if __name__ == "__main__":
    sys.exit(main())

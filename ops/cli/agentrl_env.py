"""`agentrl-env`: tools around environments.

    agentrl-env check --task db --data dev.jsonl --agent oracle   # validate a task's data
    agentrl-env check --task db --agent random                    # the built-in set
    agentrl-env check --task mypkg.envs:make_env --agent random   # the protocol contract
    agentrl-env check --task db --data dev.jsonl --option database=mysql://root@127.0.0.1
    agentrl-env worker --task db --broker URL --run NAME --capacity 8   # serve sessions
    agentrl-env-worker --task db --broker URL --run NAME --capacity 8   # the same

``--agent random`` first runs the protocol contract (`environments/_conformance`) with a
task-agnostic random agent, then the task's own random agent where it has one.

Exit status: 0 when the check ran (whatever the success rate), 1 when the protocol
contract found violations, 2 for bad arguments, unreadable data, or a task whose scripted
agent met a broken contract (a call that raised, a wrong type, a reward that is not a finite
number in range, a slow call; each named on its own line).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import yaml

from agentrl.environments import make_task
from agentrl.environments._check import AGENTS, check, scripted_agents, teacher_of
from agentrl.environments._conformance import conformance
from agentrl.environments._protocol import EnvError

from ..eval.task_split import make_on_split
from ..logs.configure import configure_logging

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl-env")
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="run a scripted agent over a task's data")
    chk.add_argument(
        "--task", required=True, help="task name (db, calculator) or import path (pkg.mod:attr)"
    )
    chk.add_argument("--data", help="a data file in the task's format (default: built-in set)")
    chk.add_argument("--agent", choices=AGENTS, default="oracle")
    chk.add_argument("--seed", type=int, default=0, help="the random agent's seed")
    _option_arg(chk)
    _worker_args(sub.add_parser("worker", help="serve a task's sessions over the broker"))
    return parser


def _worker_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, help="task name")
    parser.add_argument(
        "--broker",
        help="broker URL (amqp://...), or @FILE; default: $AGENTRL_BROKER_URL",
    )
    parser.add_argument("--run", required=True, help="the run's name")
    parser.add_argument("--capacity", type=int, default=8, help="sessions held at once")
    parser.add_argument("--worker-id", help="default: <host>-<random>")
    _option_arg(parser)


def _option_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="task option (the value in YAML), repeatable; e.g. database=mysql://root@host",
    )  # fmt: skip


def _options(items: list[str]) -> dict | None:
    """``KEY=VALUE`` strings -> task options (values read as YAML); None after an error."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"agentrl-env: --option {item!r} is not KEY=VALUE", file=sys.stderr)
            return None
        options[key] = yaml.safe_load(value)
    return options


def _serve(args: argparse.Namespace, stop: threading.Event) -> int:
    from agentrl.environments._worker import EnvWorker

    from ..config.load import read_broker

    options = _options(args.option)
    if options is None:
        return 2
    try:
        broker = read_broker(args.broker)
    except ValueError as exc:
        print(f"agentrl-env: {exc}", file=sys.stderr)
        return 2
    if broker is None:
        print("agentrl-env: no broker: give --broker or set $AGENTRL_BROKER_URL", file=sys.stderr)
        return 2
    try:
        worker = EnvWorker(
            make_task(args.task, **options),
            broker=broker,
            run=args.run,
            task=args.task,
            capacity=args.capacity,
            worker_id=args.worker_id,
        )
    except (EnvError, ValueError, OSError) as exc:
        print(f"agentrl-env: {exc}", file=sys.stderr)
        return 2
    try:
        stop.wait()
    finally:
        worker.close()
    return 0


def worker_main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    """`agentrl-env-worker`: `agentrl-env worker` under its own name."""
    parser = argparse.ArgumentParser(prog="agentrl-env-worker")
    _worker_args(parser)
    return _run_worker(parser.parse_args(argv), stop)


def _run_worker(args: argparse.Namespace, stop: threading.Event | None) -> int:
    configure_logging("info", None)
    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    return _serve(args, stop)


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "worker":
        return _run_worker(args, stop)
    configure_logging("warning")
    options = _options(args.option)
    if options is None:
        return 2
    if args.data:
        options["data"] = args.data
    try:
        # the oracle checks every item: split=all unless --option split=... says otherwise
        env, _, split = make_on_split(args.task, options, "all")
        print(f"agentrl-env: task {args.task}: split {split}", file=sys.stderr)
        contract = None
        if args.agent == "random":  # the protocol contract, with a schema-driven random agent
            contract = conformance(args.task, options, env=env, seed=args.seed)
            print(contract.format())
        scripts = scripted_agents(args.task, env)
        if args.agent in scripts or (args.agent == "teacher" and teacher_of(scripts)):
            report = check(args.task, env, args.agent, seed=args.seed)
            print(report.format())
            if report.violations:
                return 2
        elif contract is None:
            print(
                f"agentrl-env: task {args.task} has no {args.agent} agent (CHECK_AGENTS in its "
                "module, docs/own-task.md); --agent random checks the protocol",
                file=sys.stderr,
            )
            return 2
    except (EnvError, ValueError, OSError) as exc:
        print(f"agentrl-env: {exc}", file=sys.stderr)
        return 2
    return 1 if contract is not None and contract.violations else 0


if __name__ == "__main__":
    sys.exit(main())

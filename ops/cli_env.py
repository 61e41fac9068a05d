"""`agentrl-env`: tools around environments. `agentrl-env check` validates a task's data.

    agentrl-env check --task db --data dev.jsonl --agent oracle
    agentrl-env check --task db --agent random          # the built-in set

Exit status: 0 when the check ran (whatever the success rate), 2 for bad arguments
or unreadable data.
"""

from __future__ import annotations

import argparse
import sys

from agentrl.environments import make_task
from agentrl.environments._check import AGENTS, check
from agentrl.environments._protocol import EnvError

from ._logging import configure_logging

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl-env")
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="run a scripted agent over a task's data")
    chk.add_argument("--task", required=True, help="task name (db, calculator)")
    chk.add_argument("--data", help="a data file in the task's format (default: built-in set)")
    chk.add_argument("--agent", choices=AGENTS, default="oracle")
    chk.add_argument("--seed", type=int, default=0, help="the random agent's seed")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging("warning")
    options = {"data": args.data} if args.data else {}
    try:
        env = make_task(args.task, **options)
        report = check(args.task, env, args.agent, seed=args.seed)
    except (EnvError, ValueError, OSError) as exc:
        print(f"agentrl-env: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())

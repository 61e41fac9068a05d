"""`agentrl-supervisor`: start the roles of a run on this node; show a run's queues."""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

from ._config import ConfigError, load_config
from ._logging import configure_logging
from ._status import StatusError, client_for, format_status, status_json
from ._supervisor import ROLES, Supervisor

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl-supervisor")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the roles of a run on this node")
    start.add_argument("--config", required=True, help="run YAML (see examples/)")
    start.add_argument("--broker", help="override the config's broker URL (memory://, amqp://)")
    start.add_argument("--run", help="override the run name")
    start.add_argument("--model", help="override the policy model (smollm2, tiny, a directory)")
    start.add_argument("--max-steps", type=int, help="stop after N learner updates")
    start.add_argument("--output-dir", help="override the parent directory of runs")
    start.add_argument(
        "--roles", default=",".join(ROLES), help=f"comma-separated subset of {','.join(ROLES)}"
    )
    start.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    start.add_argument("--progress-every", type=float, default=10.0, help="seconds between lines")
    status = sub.add_parser("status", help="a run's queues from the RabbitMQ management API")
    status.add_argument("--broker", required=True, help="the run's broker URL (amqp://)")
    status.add_argument("--run", required=True, help="the run name")
    status.add_argument("--watch", type=float, metavar="SECONDS", help="repeat until Ctrl-C")
    status.add_argument(
        "--management-url", help="management API base URL (default: http://<broker host>:15672)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _status(args: argparse.Namespace) -> int:
    if args.broker.startswith("memory://"):
        print(
            "agentrl-supervisor: a memory:// broker only exists inside the process that runs "
            "the run; its queue depths are on that process's progress line",
            file=sys.stderr,
        )
        return 2
    if args.watch is not None and args.watch <= 0:
        print("agentrl-supervisor: --watch must be > 0 seconds", file=sys.stderr)
        return 2
    try:
        client = client_for(args.broker, args.management_url)
    except ValueError as exc:
        print(f"agentrl-supervisor: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    try:
        while True:
            try:
                stats = client.queue_stats(args.run)
            except StatusError as exc:
                print(f"agentrl-supervisor: {exc}", file=sys.stderr)
                return 1
            if args.json:
                print(status_json(stats, args.run), flush=True)
            else:
                if args.watch is not None:
                    print(time.strftime("%H:%M:%S"), f"run {args.run}")
                print(format_status(stats, args.run), flush=True)
            if args.watch is None:
                return 0
            stop.wait(args.watch)
            if not args.json:
                print()
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "status":
        return _status(args)
    try:
        cfg = load_config(
            args.config,
            broker=args.broker,
            run=args.run,
            model=args.model,
            max_steps=args.max_steps,
            output_dir=args.output_dir,
        )
    except ConfigError as exc:
        print(f"agentrl-supervisor: {exc}", file=sys.stderr)
        return 2
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    bad = [r for r in roles if r not in ROLES]
    if bad:
        print(
            f"agentrl-supervisor: unknown roles {bad}; known: {', '.join(ROLES)}", file=sys.stderr
        )
        return 2
    configure_logging(args.log_level, cfg.run_dir / "logs", run=cfg.run, node=socket.gethostname())
    return Supervisor(cfg, roles).run(progress_every=args.progress_every)


if __name__ == "__main__":
    sys.exit(main())

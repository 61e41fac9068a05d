"""`agentrl-supervisor`: start the roles of a run on this node; show a run's queues."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from agentrl.actors._ledger import read_ledger
from agentrl.messages import BrokerLoginRefused, BrokerRefused, BrokerUnavailable, TransportError
from agentrl.trainer import ModelError

from ..config.load import BROKER_ENV, ConfigError, load_config, read_broker
from ..logs.configure import configure_logging
from ..report.status import (
    ManagementUnavailable,
    StatusError,
    client_for,
    controller_status,
    format_controller,
    format_status,
    status_json,
)
from ..run.engines import node_torch_threads
from ..run.interrupt import ABORT_EXIT
from ..run.node import FATAL_EXIT, NODE_PID_ENV, NodeSupervisor, die_with_node, role_argv
from ..run.preflight import broker_problem, check_models
from ..run.queues import clear_leftovers, stop_run
from ..run.roles import DEFAULT_ROLES, ROLES
from ..run.run_dir import earlier_start
from ..run.run_lock import RunLocked, hold_run_lock, take_learner_lock
from ..run.supervisor import Supervisor
from ..sft.warm_start import WarmStartError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl-supervisor")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start the roles of a run on this node")
    start.add_argument("--config", required=True, help="run YAML (see examples/)")
    start.add_argument(
        "--broker",
        help="override the config's broker URL (memory://, amqp://); @FILE reads it from a "
        f"file; default ${BROKER_ENV} if set",
    )
    start.add_argument("--run", help="override the run name")
    start.add_argument("--model", help="override the policy model (smollm2, tiny, a directory)")
    start.add_argument(
        "--max-steps",
        type=int,
        help="stop after N RL updates of the run (a resumed run trains what is left)",
    )
    start.add_argument("--output-dir", help="override the parent directory of runs")
    start.add_argument(
        "--roles",
        default=",".join(DEFAULT_ROLES),
        help=f"comma-separated subset of {','.join(ROLES)} (serve: the OpenAI-compatible "
        "endpoint; not in the default)",
    )
    start.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    start.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of an error (by default one line says what went wrong)",
    )
    start.add_argument("--progress-every", type=float, default=10.0, help="seconds between lines")
    start.add_argument(
        "--node", default=socket.gethostname(), help="this node's name (logs, state)"
    )
    start.add_argument("--torch-threads", type=int, help="override the config's torch_threads")
    start.add_argument(
        "--resume",
        action="store_true",
        help="continue a run that was started before (from its newest checkpoint); without "
        "it, starting an existing run's learner is refused",
    )
    start.add_argument(
        "--in-process",
        action="store_true",
        help="run every role in this process (always so for memory://); by default each role "
        "of an amqp:// run gets its own supervised process",
    )
    ledger = sub.add_parser(
        "ledger", help="a run's episodes: issued, trained, dropped, open, trained twice"
    )
    ledger.add_argument("--run", required=True, help="the run name")
    ledger.add_argument("--output-dir", default="runs", help="parent directory of runs")
    ledger.add_argument("--json", action="store_true", help="print JSON instead of text")
    ledger.add_argument(
        "--list", type=int, default=20, metavar="N", help="list up to N open episodes"
    )
    stop = sub.add_parser("stop", help="ask every node of a run to drain and exit")
    stop.add_argument("--broker", help=f"the run's broker URL, or @FILE (default ${BROKER_ENV})")
    stop.add_argument("--run", required=True, help="the run name")
    stop.add_argument("--reason", default="agentrl-supervisor stop", help="logged by every node")
    status = sub.add_parser("status", help="a run's queues from the RabbitMQ management API")
    status.add_argument("--broker", help=f"the run's broker URL, or @FILE (default ${BROKER_ENV})")
    status.add_argument("--run", required=True, help="the run name")
    status.add_argument("--watch", type=float, metavar="SECONDS", help="repeat until Ctrl-C")
    status.add_argument(
        "--management-url", help="management API base URL (default: http://<broker host>:15672)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _ledger(args: argparse.Namespace) -> int:
    """Print the run's ledger; exit 1 when an episode was trained twice or appears
    trained/dropped without having been issued, else 0."""
    run_dir = Path(args.output_dir) / args.run
    if not run_dir.is_dir():
        print(f"agentrl-supervisor: no run directory {run_dir}", file=sys.stderr)
        return 2
    ledger = read_ledger(run_dir)
    counts = ledger.counts()
    if args.json:
        out = {**counts, "last_version": ledger.last_version,
               "dropped_by_reason": dict(ledger.drop_reasons()), "open_episodes": ledger.open,
               "trained_twice_episodes": ledger.trained_twice,
               "unissued_episodes": ledger.unissued}  # fmt: skip
        print(json.dumps(out, indent=2))
    else:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(ledger.drop_reasons().items()))
        print(f"run {args.run}: {counts['groups']} groups, {counts['issued']} episodes issued")
        print(f"  trained       {counts['trained']} (into v1..v{ledger.last_version})")
        print(f"  dropped       {counts['dropped']}" + (f" ({reasons})" if reasons else ""))
        print(f"  open          {counts['open']} (issued, neither trained nor dropped: in "
              "flight, or lost if the run has ended)")  # fmt: skip
        print(f"  trained twice {counts['trained_twice']}")
        print(f"  unissued      {counts['unissued']}")
        for episode in ledger.open[: args.list]:
            print(f"  open: {episode} ({ledger.issued[episode]})")
        for episode, versions in sorted(ledger.trained_twice.items()):
            print(f"  trained twice: {episode} into {versions}")
    return 1 if counts["trained_twice"] or counts["unissued"] else 0


def _status(args: argparse.Namespace) -> int:
    configure_logging("error")  # stdout carries the table or the JSON only
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
                return _status_failed(args, exc)
            controller = controller_status(args.broker, args.run)
            if args.json:
                print(status_json(stats, args.run, controller), flush=True)
            else:
                if args.watch is not None:
                    print(time.strftime("%H:%M:%S"), f"run {args.run}")
                print(format_status(stats, args.run), flush=True)
                print(format_controller(controller), flush=True)
            if args.watch is None:
                return 0
            stop.wait(args.watch)
            if not args.json:
                print()
    except KeyboardInterrupt:
        return 0


def _status_failed(args: argparse.Namespace, exc: StatusError) -> int:
    """One line on stderr (and, with --json, ``{"run", "error"}`` on stdout); exit 1. A
    management API that does not answer is first told apart from a broker that is down."""
    message = str(exc)
    if isinstance(exc, ManagementUnavailable):
        down = broker_problem(args.broker, name=f"{args.run}-status-probe")
        if down is not None:
            message = f"the broker is down, not only its management API: {down}"
    print(f"agentrl-supervisor: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"run": args.run, "error": message}), flush=True)
    return 1


def _stop(args: argparse.Namespace) -> int:
    configure_logging("warning")
    if args.broker.startswith("memory://"):
        print(
            "agentrl-supervisor: a memory:// run lives in one process; stop it with Ctrl-C",
            file=sys.stderr,
        )
        return 2
    try:
        heard = stop_run(args.broker, args.run, args.reason)
    except (BrokerRefused, TransportError) as exc:
        print(f"agentrl-supervisor: cannot reach run {args.run!r}: {exc}", file=sys.stderr)
        return 1
    if not heard:
        print(f"agentrl-supervisor: no node of run {args.run!r} is listening", file=sys.stderr)
        return 1
    print(f"asked every node of run {args.run!r} to drain and stop")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "ledger":  # files only: no broker
        return _ledger(args)
    try:
        args.broker = read_broker(args.broker)
    except ValueError as exc:
        print(f"agentrl-supervisor: {exc}", file=sys.stderr)
        return 2
    if args.command in ("status", "stop") and args.broker is None:
        print(f"agentrl-supervisor: give --broker or set ${BROKER_ENV}", file=sys.stderr)
        return 2
    if args.command == "status":
        return _status(args)
    if args.command == "stop":
        return _stop(args)
    try:
        return _start(args, argv)
    except KeyboardInterrupt:  # before the run's own handler (e.g. a model conversion)
        print("agentrl-supervisor: interrupted before the run started", file=sys.stderr)
        return ABORT_EXIT
    except Exception as exc:
        if args.debug:
            raise
        code, what = _explain(exc)
        print(f"agentrl-supervisor: {what} (--debug shows the traceback)", file=sys.stderr)
        return code


def _explain(exc: Exception) -> tuple[int, str]:
    """A start's error as (exit status, one line): FATAL_EXIT for what a retry cannot fix."""
    if isinstance(exc, (ModelError, RunLocked, BrokerLoginRefused, WarmStartError)):
        return FATAL_EXIT, str(exc)
    if isinstance(exc, BrokerUnavailable):
        return 1, f"the broker went away: {exc}"
    return 1, f"{type(exc).__name__}: {exc}"


def _start(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        cfg = load_config(
            args.config,
            broker=args.broker,
            run=args.run,
            model=args.model,
            max_steps=args.max_steps,
            output_dir=args.output_dir,
            torch_threads=args.torch_threads,
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
    configure_logging(args.log_level)  # the console only: a first start converts the model
    try:
        check_models(cfg)  # before anything is written (a corrected config then starts)
    except ModelError as exc:
        print(f"agentrl-supervisor: model: {exc}", file=sys.stderr)
        return FATAL_EXIT
    in_process = args.in_process or cfg.broker.startswith("memory://")
    if not os.environ.get(NODE_PID_ENV):  # a user's start (a node's roles wait a broker out)
        configure_logging("error")  # the probe's retries are not the user's news; its verdict is
        problem = broker_problem(cfg.broker, f"{cfg.run}-{args.node}-probe")
        if problem:  # said in seconds, once, rather than retried by every role
            print(f"agentrl-supervisor: {problem}", file=sys.stderr)
            return FATAL_EXIT
    run_lock = None
    if "learner" in roles:  # a live run is refused before anything of it changes
        try:
            run_lock = hold_run_lock(cfg.run_dir, cfg.run)
        except RunLocked as exc:
            print(f"agentrl-supervisor: {exc}", file=sys.stderr)
            return FATAL_EXIT
        if not in_process:
            run_lock.close()  # the learner's process takes it
    earlier = earlier_start(cfg.run_dir)
    fresh = earlier is None and not args.resume  # a node's roles get --resume: never fresh
    if "learner" in roles and not args.resume and earlier:
        if run_lock is not None:
            run_lock.close()
        print(
            f"agentrl-supervisor: run {cfg.run!r} exists ({earlier}): add --resume to "
            "continue it, or choose another --run",
            file=sys.stderr,
        )
        return FATAL_EXIT
    log_dir = cfg.run_dir / "logs" / args.node
    if in_process:
        # a node's role: its info lines to its log only (the node speaks for it on the
        # console); the log files keep info at any console level
        under_node = bool(os.environ.get(NODE_PID_ENV)) and args.log_level == "info"
        level = "warning" if under_node else args.log_level
        configure_logging(level, log_dir, run=cfg.run, node=args.node)
        die_with_node()  # a role of a node supervisor: its node's death is a drain
        try:
            supervisor = Supervisor(cfg, roles, node=args.node, fresh=fresh, run_lock=run_lock)
            return supervisor.run(progress_every=args.progress_every)
        finally:
            if run_lock is not None:  # released by the supervisor's stop, or here
                run_lock.close()
    configure_logging(args.log_level, log_dir, run=cfg.run, node=args.node, role="node")
    if "learner" in roles:  # a run with a learner already: refused before anything changes
        try:
            lock = take_learner_lock(cfg.broker, cfg.run, args.node)
        except RunLocked as exc:
            print(f"agentrl-supervisor: {exc}", file=sys.stderr)
            return FATAL_EXIT
        try:
            if fresh:  # before any role of this node consumes
                clear_leftovers(cfg.broker, cfg.run)
        finally:
            lock.close()  # the learner's process takes it again
    threads = cfg.torch_threads or node_torch_threads(cfg, roles)
    pinned = {role: cores for role, cores in cfg.cpu_affinity.items() if role in roles}
    node = NodeSupervisor(
        {
            role: role_argv(argv, role, args.node, len(pinned[role]) if role in pinned else threads)
            for role in roles
        },
        node=args.node,
        state_file=cfg.run_dir / "nodes" / f"{args.node}.json",
        affinity=pinned,
    )
    return node.run()


if __name__ == "__main__":
    sys.exit(main())

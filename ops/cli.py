"""`agentrl-supervisor`: start the roles of a run on this node."""

from __future__ import annotations

import argparse
import sys

from ._config import ConfigError, load_config
from ._logging import configure_logging
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
    configure_logging(args.log_level, cfg.run_dir / "logs" / "supervisor.jsonl", run=cfg.run)
    return Supervisor(cfg, roles).run(progress_every=args.progress_every)


if __name__ == "__main__":
    sys.exit(main())

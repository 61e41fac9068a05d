"""agentrl.ops: configuration, the supervisor, status, evaluation, run reports, logging.

One folder per concept: ``cli/`` (the commands), ``config/`` (the run YAML), ``run/`` (the
supervisor and what a live run needs), ``eval/``, ``report/`` (the report, TensorBoard,
status), ``sft/`` (the warm start), ``logs/``, ``serve/`` (the endpoint), ``trace/`` (the
trace viewer).

Only the light modules are imported eagerly: an environment worker
(``agentrl-env-worker``, which imports ``agentrl.ops.cli.agentrl_env``) runs in a container
without torch, so the supervisor, evaluation and report modules load on first use. The
folders' ``__init__`` files import nothing for the same reason.
"""

import importlib

from .config.load import ConfigError, load_config, parse_config
from .config.schema import RunConfig
from .logs.configure import configure_logging

_LAZY = {
    "EvalError": "eval.evaluate",
    "EvalReport": "eval.evaluate",
    "TaskResult": "eval.evaluate",
    "evaluate": "eval.evaluate",
    "format_table": "eval.evaluate",
    "ReportError": "report.plots",
    "ReportFiles": "report.plots",
    "write_report": "report.plots",
    "ManagementClient": "report.status",
    "ManagementUnavailable": "report.status",
    "QueueStat": "report.status",
    "StatusError": "report.status",
    "format_status": "report.status",
    "ROLES": "run.roles",
    "Supervisor": "run.supervisor",
    "latest_checkpoint": "run.run_dir",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ROLES",
    "ConfigError",
    "EvalError",
    "EvalReport",
    "ManagementClient",
    "ManagementUnavailable",
    "QueueStat",
    "ReportError",
    "ReportFiles",
    "RunConfig",
    "StatusError",
    "Supervisor",
    "TaskResult",
    "configure_logging",
    "evaluate",
    "format_status",
    "format_table",
    "latest_checkpoint",
    "load_config",
    "parse_config",
    "write_report",
]

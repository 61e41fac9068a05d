"""agentrl.ops: configuration, the supervisor, status, evaluation, run reports, logging.

Only the light modules are imported eagerly: an environment worker
(``agentrl-env-worker``, which imports ``agentrl.ops.cli_env``) runs in a container
without torch, so the supervisor, evaluation and report modules load on first use.
"""

import importlib

from ._config import ConfigError, RunConfig, load_config, parse_config
from ._logging import configure_logging

_LAZY = {
    "EvalError": "_eval",
    "EvalReport": "_eval",
    "TaskResult": "_eval",
    "evaluate": "_eval",
    "format_table": "_eval",
    "ReportError": "_report",
    "ReportFiles": "_report",
    "write_report": "_report",
    "ManagementClient": "_status",
    "ManagementUnavailable": "_status",
    "QueueStat": "_status",
    "StatusError": "_status",
    "format_status": "_status",
    "ROLES": "_supervisor",
    "Supervisor": "_supervisor",
    "latest_checkpoint": "_supervisor",
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

"""agentrl.ops: configuration, the supervisor, status, evaluation, run reports, logging."""

from ._config import ConfigError, RunConfig, load_config, parse_config
from ._eval import EvalError, EvalReport, TaskResult, evaluate, format_table
from ._logging import configure_logging
from ._report import ReportError, ReportFiles, write_report
from ._status import ManagementClient, ManagementUnavailable, QueueStat, StatusError, format_status
from ._supervisor import ROLES, Supervisor, latest_checkpoint

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

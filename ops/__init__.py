"""agentrl.ops: configuration, the supervisor, evaluation, run reports, logging, progress."""

from ._config import ConfigError, RunConfig, load_config, parse_config
from ._eval import EvalError, EvalReport, TaskResult, evaluate, format_table
from ._logging import configure_logging
from ._report import ReportError, ReportFiles, write_report
from ._supervisor import ROLES, Supervisor, latest_checkpoint

__all__ = [
    "ROLES",
    "ConfigError",
    "EvalError",
    "EvalReport",
    "ReportError",
    "ReportFiles",
    "RunConfig",
    "Supervisor",
    "TaskResult",
    "configure_logging",
    "evaluate",
    "format_table",
    "latest_checkpoint",
    "load_config",
    "parse_config",
    "write_report",
]

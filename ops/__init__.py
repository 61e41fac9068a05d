"""agentrl.ops: configuration, the supervisor, evaluation, logging and progress reporting."""

from ._config import ConfigError, RunConfig, load_config, parse_config
from ._eval import EvalError, EvalReport, TaskResult, evaluate, format_table
from ._logging import configure_logging
from ._supervisor import ROLES, Supervisor, latest_checkpoint

__all__ = [
    "ROLES",
    "ConfigError",
    "EvalError",
    "EvalReport",
    "RunConfig",
    "Supervisor",
    "TaskResult",
    "configure_logging",
    "evaluate",
    "format_table",
    "latest_checkpoint",
    "load_config",
    "parse_config",
]

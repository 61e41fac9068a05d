"""agentrl.ops: configuration, the supervisor, logging and progress reporting."""

from ._config import ConfigError, RunConfig, load_config, parse_config
from ._logging import configure_logging
from ._supervisor import ROLES, Supervisor, latest_checkpoint

__all__ = [
    "ROLES",
    "ConfigError",
    "RunConfig",
    "Supervisor",
    "configure_logging",
    "latest_checkpoint",
    "load_config",
    "parse_config",
]

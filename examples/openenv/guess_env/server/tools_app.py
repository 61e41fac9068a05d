"""The MCP guessing game's server: ``uvicorn guess_env.server.tools_app:app``."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from guess_env.server.tools_environment import GuessToolsEnvironment

app = create_app(
    GuessToolsEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="guess_env_tools",
    max_concurrent_envs=64,
)

"""The guessing game's server: ``uvicorn guess_env.server.app:app``."""

from openenv.core.env_server.http_server import create_app

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.environment import GuessEnvironment

app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=64
)

"""An OpenAI-compatible endpoint on the sampler pool: bring your own agent.

An agent written with any OpenAI client calls ``/v1/chat/completions`` on the run's
samplers; its calls inside an episode (``/v1/episodes``) become trajectories with the exact
token ids, logprobs and versions that were sampled, trained like agentrl's own episodes.
``app`` (the HTTP API), ``guard`` (API key, body and concurrency limits), ``connections``
(head and idle timeouts, head size, a connection cap, ahead of the key), ``episodes``
(token layout, segments, groups, who gives the reward), ``service`` (the broker side),
``server`` (uvicorn).
See docs/serve.md.
"""

from .episodes import EpisodeBook, EpisodeError
from .guard import API_KEY_ENV, KEY_FILE, Guard, resolve_api_key
from .server import ServeServer
from .service import ServeService

__all__ = [
    "API_KEY_ENV",
    "KEY_FILE",
    "EpisodeBook",
    "EpisodeError",
    "Guard",
    "ServeServer",
    "ServeService",
    "resolve_api_key",
]

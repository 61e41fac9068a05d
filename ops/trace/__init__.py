"""`agentrl trace`: a local web page over a run's episodes, from the learner's trace store.

``text`` (tokens back into turns, tool calls, advantage per token), ``page`` (the HTML,
every run string escaped), ``server`` (the standard library's HTTP server), ``command``
(the `agentrl trace` command), ``static/`` (the page's stylesheet and script). The store
itself is `agentrl.actors._trace_store`.
"""

from .command import trace_command
from .server import TraceServer, TraceSite, find_tokenizer

__all__ = ["TraceServer", "TraceSite", "find_tokenizer", "trace_command"]

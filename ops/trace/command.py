"""``agentrl trace --run-dir DIR``: open the run's store, find its tokenizer, serve until Ctrl-C.

Every error is one line on stderr and exit 2: no store (or one of another schema), no
tokenizer, an address it cannot listen on.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl.actors._trace_store import TRACE_FILE, TraceError, TraceReader
from agentrl.trainer import ModelError, load_tokenizer

from .server import TraceServer, TraceSite, find_tokenizer

__all__ = ["trace_command"]


def _fail(message: str) -> int:
    print(f"agentrl trace: {message}".splitlines()[0], file=sys.stderr)
    return 2


def trace_command(run_dir: Path, host: str, port: int, *, tokenizer: str | None = None) -> int:
    """Serve ``run_dir``'s trace store on ``host:port``; the exit status."""
    try:
        reader = TraceReader(run_dir / TRACE_FILE)
        recorded = reader.meta().get("tokenizer")
        reader.close()
        spec = tokenizer or find_tokenizer(run_dir, recorded)
    except TraceError as exc:
        return _fail(str(exc))
    try:
        loaded = load_tokenizer(spec)
    except (ModelError, OSError, ValueError) as exc:  # transformers says OSError: none there
        return _fail(f"no tokenizer in {spec}: {exc}")
    try:
        server = TraceServer(TraceSite(run_dir, loaded), host, port)
    except TraceError as exc:
        return _fail(str(exc))
    except OSError as exc:  # the port is taken, the address is not this host's
        return _fail(f"cannot listen on {host}:{port}: {exc}")
    print(f"agentrl trace: {run_dir} at {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the way to stop it
        print("agentrl trace: stopped", file=sys.stderr)
    finally:
        server.close()
    return 0

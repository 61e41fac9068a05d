"""`connect`: the transport for a broker URL, `memory://` (`_memory`) or `amqp://` /
`amqps://` (`_amqp`).

Apart from the interface (`_transport`), which both implementations import, so that no
module imports one that imports it back.
"""

from __future__ import annotations

import urllib.parse

from ._amqp import AmqpTransport
from ._memory import MemoryTransport
from ._transport import Transport

__all__ = ["connect"]


def connect(url: str, *, name: str, connect_timeout: float = 15.0) -> Transport:
    """Open a transport: `memory://<broker>` (in-process) or `amqp://` / `amqps://`.

    `name` is the connection name shown by the broker and used in logs.
    Raises BrokerUnavailable when an AMQP broker cannot be reached within
    `connect_timeout` seconds.
    """
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "memory":
        return MemoryTransport(url, name=name)
    if scheme in ("amqp", "amqps"):
        return AmqpTransport(url, name=name, connect_timeout=connect_timeout)
    raise ValueError(f"unsupported transport URL scheme {scheme!r} (memory, amqp, amqps)")

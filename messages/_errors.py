"""Errors raised by `agentrl.messages`."""

from __future__ import annotations


class MessageError(Exception):
    """Raised when a message cannot be encoded or decoded.

    Raised for a body that is not msgpack or not an envelope/payload map, an
    unknown kind, a schema version mismatch, a missing or unexpected field, a
    value of the wrong type or out of range, or a broken cross-field rule
    (e.g. unequal trajectory array lengths). The text names the kind and the
    field path, e.g. ``trajectory.loss_mask[3]: expected 0 or 1, got 2``.
    """

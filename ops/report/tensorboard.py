"""TensorBoard event files for a run's scalar metrics, without a TensorBoard dependency.

`EventWriter` appends scalar summaries to ``events.out.tfevents.*`` in the
format TensorBoard reads: TFRecord framing (length, masked CRC-32C of the
length, the record, masked CRC-32C of the record) around `Event` protocol
buffers with one `Summary.Value(tag, simple_value)` per metric. Only the few
protobuf fields needed are encoded, by hand; viewing the files needs
TensorBoard (``pip install tensorboard``), writing them does not.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EventWriter"]


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord framing uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _event(wall_time: float, step: int, *, summary: bytes = b"", file_version: str = "") -> bytes:
    out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if summary:
        out += _bytes_field(5, summary)
    return out


def _scalar(tag: str, value: float) -> bytes:
    """A `Summary.Value` with ``tag`` and ``simple_value``."""
    return _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", value))


class EventWriter:
    """Appends scalar metrics to one TensorBoard event file in ``logdir`` (thread-safe)."""

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / name
        self._lock = threading.Lock()
        self._fh = self.path.open("ab")
        self._write(_event(time.time(), 0, file_version="brain.Event:2"))

    def add_scalars(
        self, step: int, values: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        """Record every finite ``values[tag]`` at ``step``; non-numbers and NaN/inf are skipped."""
        entries = [
            _bytes_field(1, _scalar(tag, float(v)))
            for tag, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ]
        if entries:
            event = _event(
                time.time() if wall_time is None else wall_time, step, summary=b"".join(entries)
            )
            self._write(event)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def _write(self, record: bytes) -> None:
        header = struct.pack("<Q", len(record))
        framed = (
            header
            + struct.pack("<I", _masked_crc(header))
            + record
            + struct.pack("<I", _masked_crc(record))
        )
        with self._lock:
            self._fh.write(framed)
            self._fh.flush()

"""A TensorBoard event-file writer for scalars, in pure Python (no TensorFlow, no tensorboard package).

An event file is a TFRecord file (``uint64 length, uint32 masked-crc32c(length), data, uint32
masked-crc32c(data)``, little-endian) of ``tensorflow.Event`` protocol buffers. We only ever write three kinds
of field, so the protobuf wire format is encoded by hand:

* ``Event``: ``wall_time`` (1, double), ``step`` (2, int64), ``file_version`` (3, string), ``summary`` (5);
* ``Summary``: repeated ``value`` (1);
* ``Summary.Value``: ``tag`` (1, string), ``simple_value`` (2, float) — what ``tf.summary.scalar`` wrote in TF 1
  and TensorBoard still reads.

This keeps TensorFlow (seconds to import, gigabytes of address space) out of the training process.
"""

from __future__ import annotations

import os
import socket
import struct
import time

__all__ = ["EventWriter", "crc32c", "masked_crc32c"]


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli polynomial, reflected
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: CRC-32C rotated right by 15 bits plus ``0xa282ead8``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(
    wall_time: float, step: int, *, file_version: str | None = None, summary: bytes | None = None
) -> bytes:
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if summary is not None:
        out += _field_bytes(5, summary)
    return out


def _scalar_value(tag: str, value: float) -> bytes:
    return _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)


class EventWriter:
    """Append scalar summaries to a new event file in ``logdir`` (one file per writer, as TensorBoard expects).

    >>> import tempfile
    >>> with EventWriter(tempfile.mkdtemp()) as w:
    ...     w.scalars(10, {"loss": 2.5})
    """

    def __init__(self, logdir: str | os.PathLike):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self.path = os.path.join(os.fspath(logdir), name)
        self._file = open(self.path, "ab")
        self._write(_event(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data)
        self._file.write(struct.pack("<I", masked_crc32c(data)))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write one event at ``step`` holding a scalar per ``tag: value`` (non-numbers are skipped)."""
        summary = b"".join(
            _field_bytes(1, _scalar_value(tag, float(v)))
            for tag, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        )
        if summary:
            self._write(_event(time.time(), int(step), summary=summary))
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

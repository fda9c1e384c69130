"""Where a result body waits between its download and its check: memory, then a file.

A result may be as large as ``[result] max_bytes`` (hundreds of megabytes for a batch
file). Its first ``MEMORY_BYTES`` are kept in memory; past that the body goes to an
anonymous temporary file (``TMPDIR``), which the system removes when it is closed or
the process dies, so a crash leaves nothing behind. The check then reads the body from
where it is (``providers.result_scan``), never the whole of it at once.
"""

from __future__ import annotations

import tempfile
from typing import BinaryIO

MEMORY_BYTES = 1_048_576


class Spool:
    """A write-once body: ``data`` while small, ``file`` (an open, unnamed file) after."""

    def __init__(self, memory_bytes: int = MEMORY_BYTES) -> None:
        self._memory_bytes = memory_bytes
        self._buffer = bytearray()
        self._file: BinaryIO | None = None
        self.size = 0

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self._file is not None:
            self._file.write(data)
            return
        if len(self._buffer) + len(data) <= self._memory_bytes:
            self._buffer.extend(data)
            return
        # Open past this call on purpose: the check reads it, then ``discard`` or the
        # collect step closes it.
        self._file = tempfile.TemporaryFile(prefix="reconciler-result-")  # noqa: SIM115
        self._file.write(self._buffer)
        self._file.write(data)
        self._buffer = bytearray()

    def finish(self) -> tuple[bytes | None, BinaryIO | None]:
        """The body: (bytes, None) when it stayed in memory, else (None, the file)."""
        if self._file is None:
            return bytes(self._buffer), None
        self._file.flush()
        return None, self._file

    def discard(self) -> None:
        self._buffer = bytearray()
        if self._file is not None:
            self._file.close()
            self._file = None

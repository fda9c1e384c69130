"""A provider's response body, read within a limit on what it decodes to.

Every body a provider sends (create, lookup, status, cancel, result) is read here.
httpx decodes ``Content-Encoding`` a received chunk at a time and whole: one megabyte of
gzip that expands to a gigabyte is a gigabyte in memory before any limit is looked at.
This reader takes the raw bytes and decompresses at most ``PIECE_BYTES`` per step, so a
body is refused (``too_large``) as soon as what it decodes to passes the limit, and
memory never holds more than a piece beyond what the caller keeps.

Encodings: ``gzip`` (``x-gzip``), ``deflate`` (zlib-wrapped or raw, as httpx reads it)
and ``identity``, also stacked (``gzip, gzip``) up to ``MAX_ENCODINGS`` deep: a deeper
stack is no server's doing and costs a pass over the body per layer (1,500 layers fit
in 8 KB of header), so ``encoding_problem`` names it and the body is not read. The
service asks for exactly these
(``ACCEPT_ENCODING``); a body in another encoding (``br``, ``zstd``) is one it did not
ask for and cannot bound, so it is refused as undecodable. A body that does not
decompress is ``httpx.DecodingError``, which the transport classifier names as any other
broken answer.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

import httpx

ACCEPT_ENCODING = "gzip, deflate"
MAX_ENCODINGS = 2
PIECE_BYTES = 65_536  # the most one decompression step produces
# Hand the event loop back after this much decoded body: a result that arrives as fast as
# loopback can send it must not hold the loop for the whole file.
YIELD_EVERY_BYTES = 1_048_576


class Sink(Protocol):
    def write(self, data: bytes) -> object: ...


class _Stage(Protocol):
    def decode(self, data: bytes) -> Iterator[bytes]: ...

    def flush(self) -> Iterator[bytes]: ...


def _undecodable(exc: zlib.error) -> httpx.DecodingError:
    return httpx.DecodingError(f"the response body does not decompress: {exc}")


class _Zlib:
    """One zlib stream (gzip, zlib-wrapped or raw deflate), decompressed a piece at a time."""

    def __init__(self, wbits: int, *, raw_fallback: bool = False) -> None:
        self._inflate = zlib.decompressobj(wbits)
        self._raw_fallback = raw_fallback  # deflate: servers send either framing
        self._started = False

    def decode(self, data: bytes) -> Iterator[bytes]:
        if not self._started and data:
            self._started = True
            if self._raw_fallback:
                try:
                    zlib.decompressobj().decompress(data[:64], 1)
                except zlib.error:
                    self._inflate = zlib.decompressobj(-zlib.MAX_WBITS)
        while data and not self._inflate.eof:
            try:
                piece = self._inflate.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                raise _undecodable(exc) from None
            data = self._inflate.unconsumed_tail
            if piece:
                yield piece

    def flush(self) -> Iterator[bytes]:
        try:
            rest = self._inflate.flush()
        except zlib.error as exc:  # pragma: no cover - zlib reports truncation as b""
            raise _undecodable(exc) from None
        if rest:
            yield rest


class _Identity:
    def decode(self, data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), PIECE_BYTES):
            yield data[start : start + PIECE_BYTES]

    def flush(self) -> Iterator[bytes]:
        return iter(())


def _stage(name: str) -> _Stage | None:
    if name in ("gzip", "x-gzip"):
        return _Zlib(zlib.MAX_WBITS | 16)
    if name == "deflate":
        return _Zlib(zlib.MAX_WBITS, raw_fallback=True)
    if name in ("identity", ""):
        return None
    raise httpx.DecodingError(
        f"the response is encoded with {name[:40]!r}, which was not asked for "
        f"(Accept-Encoding: {ACCEPT_ENCODING})"
    )


def _names(content_encoding: str | None) -> list[str]:
    return [n.strip().lower() for n in (content_encoding or "").split(",")]


def encoding_problem(content_encoding: str | None) -> str | None:
    """Why a body in this ``Content-Encoding`` is not read (a stack too deep); None: read."""
    if content_encoding is None or content_encoding.count(",") < MAX_ENCODINGS:
        return None  # fewer names than the limit: nothing to count
    layers = sum(1 for name in _names(content_encoding) if name not in ("identity", ""))
    if layers <= MAX_ENCODINGS:
        return None
    return (
        f"the response's Content-Encoding stacks {layers} encodings; at most "
        f"{MAX_ENCODINGS} are read"
    )


class BoundedDecoder:
    """The stages of a ``Content-Encoding`` header, outermost last, as one decoder."""

    def __init__(self, content_encoding: str | None) -> None:
        problem = encoding_problem(content_encoding)
        if problem is not None:
            raise httpx.DecodingError(problem)
        stages = [_stage(name) for name in _names(content_encoding)]
        # The header lists encodings in the order they were applied: undo the last first.
        self._stages: list[_Stage] = [s for s in reversed(stages) if s is not None]
        if not self._stages:
            self._stages = [_Identity()]

    def decode(self, data: bytes) -> Iterator[bytes]:
        return self._through(0, data)

    def flush(self) -> Iterator[bytes]:
        for index, stage in enumerate(self._stages):
            for piece in stage.flush():
                yield from self._through(index + 1, piece)

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._stages):
            yield data
            return
        for piece in self._stages[index].decode(data):
            yield from self._through(index + 1, piece)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def declared_length(headers: httpx.Headers) -> int | None:
    value = headers.get("content-length")
    text = (value or "").strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


async def read_bounded(response: httpx.Response, limit: int, sink: Sink) -> tuple[int, bool]:
    """Decode ``response``'s body into ``sink``: (bytes written, too_large).

    Reading stops at the first byte past ``limit``, counted after decoding; a declared
    ``Content-Length`` past it is refused before a byte is read.
    """
    declared = declared_length(response.headers)
    if declared is not None and declared > limit:
        return 0, True
    if response.is_stream_consumed:
        # Built already read (httpx.MockTransport's answers are): httpx decoded it then.
        decoder, raws = BoundedDecoder(None), _once(response.content)
    else:
        decoder = BoundedDecoder(response.headers.get("content-encoding"))
        raws = response.aiter_raw()
    size = next_yield = 0
    async for raw in raws:
        for piece in decoder.decode(raw):
            size += len(piece)
            if size > limit:
                return size - len(piece), True
            sink.write(piece)
            if size >= next_yield + YIELD_EVERY_BYTES:
                next_yield = size
                await asyncio.sleep(0)
    for piece in decoder.flush():
        size += len(piece)
        if size > limit:
            return size - len(piece), True
        sink.write(piece)
    return size, False

"""Identifiers: sortable operation ids and high-entropy tokens."""

from __future__ import annotations

import secrets
from datetime import datetime

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def operation_id(now: datetime) -> str:
    """``op_`` + 10 chars of milliseconds + 16 random chars: sorts by creation time."""
    millis = int(now.timestamp() * 1000)
    return "op_" + _b32(millis, 10) + _b32(secrets.randbits(80), 16)


def operation_id_floor(when: datetime) -> str:
    """The smallest operation id made at ``when`` or later (ids compare as their times do)."""
    return "op_" + _b32(int(when.timestamp() * 1000), 10) + _ALPHABET[0] * 16


def idempotency_token() -> str:
    return "idem_" + secrets.token_hex(16)


def trace_id() -> str:
    """``tr_`` and a W3C trace id's 32 hex digits: the id tracing uses for the operation."""
    return "tr_" + secrets.token_hex(16)


def worker_id(host: str, pid: int) -> str:
    return f"{host}:{pid}:{secrets.token_hex(3)}"

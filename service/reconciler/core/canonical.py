"""Canonical JSON and the fingerprints made from it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One encoder for every call: json.dumps with options builds a new encoder each time, and
# this runs for every history entry.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept as is: one text per JSON value."""
    return _CANONICAL.encode(value)


def request_fingerprint(provider: str, request: Any) -> str:
    """SHA-256 of the canonical JSON of provider and request (seed 001)."""
    text = canonical_json({"provider": provider, "request": request})
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()

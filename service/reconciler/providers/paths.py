"""Values a request path can carry safely: each one percent-encoded as a segment."""

from __future__ import annotations

from urllib.parse import quote

from reconciler.core.errors import UnsafePathValue


def _segment(value: str, what: str) -> str:
    if value in ("", ".", ".."):
        raise UnsafePathValue(f"the {what} is empty or a '.'/'..' path segment")
    return quote(value, safe="")


def encode_path_value(value: str, what: str, *, keep_slashes: bool = False) -> str:
    """Percent-encode ``value`` for a path; ``keep_slashes`` keeps ``/`` between segments."""
    if not keep_slashes:
        return _segment(value, what)
    return "/".join(_segment(part, what) for part in value.split("/"))

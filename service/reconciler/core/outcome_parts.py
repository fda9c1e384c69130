"""The Operation's ``error`` and ``progress`` in one shape each, whatever the provider sent.

Pure. What is stored keeps the provider's own words (its error body, its progress
object), and providers word them differently: OpenAI and Anthropic nest the text
as ``error.message``, GitHub says ``message``, Replicate ``detail``, a Google
operation ``error.message`` beside a numeric code. An agent should not have to
know which: the view gives ``error`` as ``{code, message, http_status,
provider_message, detail}`` and ``progress`` as ``{completed, total, detail}``,
``detail`` holding what was stored (docs/design.md#operation-view).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_PROVIDER_MESSAGE = 300
_DEPTH = 4
# Where the text is, in the error bodies of the APIs the presets follow, best first.
_TEXT_KEYS = ("message", "detail", "error_description", "title", "msg", "error", "description")
_NESTED_KEYS = ("error", "errors", "detail", "data")

REQUEST_REJECTED = "request_rejected"
LOOKUP_REJECTED = "lookup_rejected"
CREDENTIALS_REFUSED = "authorization_denied"
# The fields of the view of ``error`` other than ``detail``; what else was stored goes there.
_OWN = ("code", "message", "http_status", "provider_message")


def one_line(text: str, limit: int = MAX_PROVIDER_MESSAGE) -> str:
    """Provider text as one printable line, clipped: it cannot break a message's lines."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def provider_message(body: Any, depth: int = _DEPTH) -> str | None:
    """The human text in a provider's error body, wherever its API puts it (None: none)."""
    if isinstance(body, str):
        return one_line(body) or None
    if depth <= 0:
        return None
    if isinstance(body, list):
        return next((m for item in body[:3] if (m := provider_message(item, depth - 1))), None)
    if not isinstance(body, Mapping):
        return None
    for key in _TEXT_KEYS:
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            return one_line(value)
    for key in _NESTED_KEYS:
        found = provider_message(body.get(key), depth - 1)
        if found:
            return found
    return None


def _status(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _explained(code: str, stored: Mapping[str, Any], said: str | None) -> tuple[str, int | None]:
    """The plain-words ``message`` of a stored error, and the HTTP status it names."""
    status = _status(stored.get("http_status"))
    tail = f": {said}" if said else ""
    if code == REQUEST_REJECTED:
        return f"the provider refused the request (HTTP {status}){tail}", status
    if code == CREDENTIALS_REFUSED and status is None:  # nothing sent: its source refused
        return f"this service could not obtain its credential for the provider{tail}", status
    if code == CREDENTIALS_REFUSED:
        return f"the provider refused this service's credentials (HTTP {status}){tail}", status
    if code == LOOKUP_REJECTED:
        return f"the provider refused the look-up of the job (HTTP {status}){tail}", status
    if code == "provider_rejected":  # stored before request_rejected had its own code
        return f"the provider refused the call (HTTP {status}){tail}", status
    if code in ("provider_failed", "expired"):
        word = "failed" if code == "provider_failed" else "expired"
        state = stored.get("remote_state")
        shown = f" (its state: {one_line(state, 80)})" if isinstance(state, str) else ""
        return f"the provider reports the job {word}{shown}{tail}", status
    if code == "result_unavailable":
        found = stored.get("detail")
        call: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        status = _status(call.get("http_status"))
        last = f"HTTP {status}" if status else call.get("transport_error") or call.get("refused")
        attempts = stored.get("attempts")
        text = "the result could not be fetched"
        if isinstance(attempts, int):
            text += f" ({attempts} attempt{'s' if attempts != 1 else ''}"
            text += f"; last: {one_line(str(last), 120)})" if last else ")"
        return text, status
    if code == "result_invalid":
        problems = stored.get("problems")
        listed = "; ".join(str(p) for p in problems) if isinstance(problems, list) else ""
        return one_line(f"the result failed validation: {listed}" if listed else code), status
    message = stored.get("message")
    return (one_line(message) if isinstance(message, str) and message else code), status


def error_view(stored: Any) -> dict[str, Any] | None:
    """The one shape of ``error``: ``code``, ``message`` (plain words), ``http_status`` (the
    provider's, when an answer of it is the reason), ``provider_message`` (the provider's own
    text), ``detail`` (everything else that was stored, the provider's body included)."""
    if stored is None:
        return None
    if not isinstance(stored, Mapping):
        return {
            "code": "error",
            "message": one_line(str(stored)),
            "http_status": None,
            "provider_message": None,
            "detail": None,
        }
    stored_code = stored.get("code")
    code = stored_code if isinstance(stored_code, str) else "error"
    said = stored.get("provider_message")
    if not isinstance(said, str):
        said = provider_message(stored.get("provider_error"))
    message, status = _explained(code, stored, said)
    rest = {k: v for k, v in stored.items() if k not in _OWN}
    return {
        "code": code,
        "message": message,
        "http_status": status,
        "provider_message": said,
        "detail": rest or None,
    }


def _count(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def progress_view(stored: Any) -> dict[str, Any] | None:
    """``{completed, total, detail}``: the counts when the provider gives them under those
    names (numbers, else null), and what it gave as ``detail``; None when it gave nothing."""
    if stored is None:
        return None
    counts = stored if isinstance(stored, Mapping) else {}
    return {
        "completed": _count(counts.get("completed")),
        "total": _count(counts.get("total")),
        "detail": stored,
    }

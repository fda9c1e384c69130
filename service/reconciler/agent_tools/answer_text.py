"""The text block of a tool's answer: what an agent acts on, for clients that show only text.

Pure. Many MCP clients hand the model the text content and nothing else, so the text
carries the outcome itself, not a pointer into ``structuredContent``: the Operation's
message (what it means, what to do next), the state in words that cannot be read as
final while a person decides, the result (whole when small; else its size, reference
and summary) and the error's code and message. ``structuredContent`` stays the whole
Operation. An answer is a tool error (``isError``) exactly when the job ended without a
usable outcome, so that no client shows a failed or abandoned job as a success.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reconciler.core.states import END_STATES, USABLE_ENDS, State

# The most of a result written into the text whole; a larger one is described.
TEXT_RESULT_BYTES = 2_000
SUMMARY_CHARS = 500
SHOWN_FAILED_ITEMS = 5
# Ends with no usable outcome (what the Python client calls failed or rejected).
_NO_OUTCOME = END_STATES - USABLE_ENDS


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def no_outcome(view: Mapping[str, Any]) -> bool:
    """The job is done and did not succeed, even in part: the answer is a tool error."""
    return bool(view["done"]) and view["state"] in _NO_OUTCOME


def state_words(view: Mapping[str, Any]) -> str:
    """``state`` as an agent must read it: while a person decides, nothing final."""
    state = str(view["state"])
    if view.get("awaiting_decision"):
        if state == State.ESCALATED:
            return "escalated, awaiting an operator's decision"
        return f"awaiting an operator's decision ({state} is not final until they decide)"
    return state


def result_size(result: Mapping[str, Any], whole: str | None = None) -> int:
    """The result's bytes as the provider gave them (``size``), else those of its compact
    JSON (``whole`` when the caller has it already)."""
    size = result.get("size")
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    return len((compact(result) if whole is None else whole).encode("utf-8"))


def result_text(result: Mapping[str, Any]) -> str:
    """The result in one line: whole when small, else its size, reference and summary (its
    digest and its rows are left to the structured answer)."""
    whole = compact(result)
    if len(whole.encode("utf-8")) <= TEXT_RESULT_BYTES:
        return f"result: {whole}"
    parts = [f"result: {result_size(result, whole):,} bytes"]
    if isinstance(result.get("content_type"), str):
        parts[0] += f" of {result['content_type']}"
    if isinstance(result.get("ref"), str):
        parts[0] += f" at {result['ref']}"
    if result.get("summary") is not None:
        parts.append(f"summary: {clipped(compact(result['summary']), SUMMARY_CHARS)}")
    failed = result.get("failed_items")
    if isinstance(failed, list) and failed:
        shown = ", ".join(str(item) for item in failed[:SHOWN_FAILED_ITEMS])
        left = len(failed) - SHOWN_FAILED_ITEMS
        parts.append(f"failed items: {shown}" + (f" and {left} more" if left > 0 else ""))
    if result.get("summary") is None and not isinstance(result.get("ref"), str):
        parts.append(f"fields: {', '.join(str(k) for k in result)}")
    return (
        "; ".join(parts)
        + ". The whole result is too large for this text: it is `result` in the structured "
        "answer."
    )


def error_text(error: Mapping[str, Any]) -> str:
    return f"error: {error.get('code')}: {error.get('message')}"


def operation_text(view: Mapping[str, Any]) -> str:
    """The text block of an answer that is an Operation (``message`` in the tools' words)."""
    facts = [f"state: {state_words(view)}", f"done: {str(view['done']).lower()}"]
    progress = view.get("progress")
    if not view["done"] and isinstance(progress, Mapping) and progress.get("total"):
        facts.append(f"progress: {progress.get('completed')} of {progress['total']}")
    if view.get("cancel_requested") and not view["done"]:
        facts.append("cancel requested, not confirmed")
    lines = [str(view["message"]), f"job {view['id']} at {view['provider']}; " + "; ".join(facts)]
    if isinstance(view.get("result"), Mapping):
        lines.append(result_text(view["result"]))
    if isinstance(view.get("error"), Mapping):
        lines.append(error_text(view["error"]))
    return "\n".join(lines)

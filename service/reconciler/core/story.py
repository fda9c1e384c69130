"""An operation's history told as a story, one line per entry (docs/design.md#history).

10:20:05 polled, state queued, next poll 10:20:14 from local backoff
10:20:31 received 503, Retry-After 120, next poll 10:22:31 from provider guidance
10:20:02 polled, state running, next poll 10:39:11 from webhook trust (webhooks trusted: ...)
10:31:40 webhook trust withdrawn: webhooks distrusted after a miss on op_…; next poll ...
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from reconciler.core.clock import utc
from reconciler.core.outcome_parts import one_line
from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.core.vocabulary import DelaySource, HistoryKind

SOURCE_WORDS = {
    DelaySource.PROVIDER_RETRY_AFTER.value: "provider guidance",
    DelaySource.PROVIDER_POLL_HINT.value: "provider hint",
    DelaySource.LOCAL_BACKOFF.value: "local backoff",
    DelaySource.MANUAL_EXTENSION.value: "manual extension",
    DelaySource.WEBHOOK_HINT.value: "webhook hint",
    DelaySource.WEBHOOK_TRUST.value: "webhook trust",
    DelaySource.CATCH_UP.value: "catch-up spread",
}

# An operator's note on a decision, on its one line of the story (the whole note is kept).
NOTE_LIMIT = 200

TRUSTED_WORDS = " (webhooks trusted: this read is only a fallback)"


def clock_text(value: Any) -> str:
    """A moment as the story prints it (HH:MM:SS, UTC)."""
    if isinstance(value, datetime):
        return utc(value).strftime("%H:%M:%S")
    if isinstance(value, str):
        try:
            return utc(datetime.fromisoformat(value.replace("Z", "+00:00"))).strftime("%H:%M:%S")
        except ValueError:
            return value
    return "?"


def _result(detail: dict[str, Any]) -> str:
    if "transport_error" in detail:
        return f"no response ({detail['transport_error']})"
    status = detail.get("http_status")
    return f"HTTP {status}" if status is not None else "no answer"


def _next(detail: dict[str, Any], source: str | None) -> str:
    at = detail.get("next_poll_at")
    if not at:
        return ""
    words = SOURCE_WORDS.get(source or "", source or "schedule")
    return f", next poll {clock_text(at)} from {words}"


def _status_read(detail: dict[str, Any], source: str | None) -> str:
    status = detail.get("http_status")
    decision = detail.get("decision", "")
    if status is not None and 200 <= status < 300 and "remote_state" in detail:
        text = f"polled, state {detail['remote_state']}"
    else:
        text = f"received {_result(detail).removeprefix('HTTP ')}"
        if detail.get("retry_after"):
            text += f", Retry-After {detail['retry_after']}"
    if decision == "collect":
        return text + ", collecting the result"
    if decision in ("stop", "finish"):
        return text
    text += _next(detail, source)
    if source == DelaySource.WEBHOOK_TRUST.value:
        text += TRUSTED_WORDS
    if detail.get("final_look"):
        text += " (final look before the deadline)"
    return text


def _transition(entry: HistoryRecord, detail: dict[str, Any]) -> str:
    if entry.from_state is None:
        deadline = detail.get("deadline_at")
        budget = detail.get("max_status_requests")
        extra = f", deadline {clock_text(deadline)}, budget {budget}" if deadline else ""
        return f"operation created{extra}"
    if entry.to_state == "observing" and detail.get("next_poll_at"):
        text = f"{entry.from_state} → observing, first poll"
        text += _next(detail, entry.delay_source).removeprefix(", next poll")
        if entry.delay_source == DelaySource.WEBHOOK_TRUST.value:
            text += TRUSTED_WORDS
        return text
    if entry.to_state == "accepted":
        return (
            f"submitted job {detail.get('job_id', '?')} ({_result(detail)} via {detail.get('via')})"
        )
    if entry.cause == "cancel_refused":
        said = detail.get("provider_message")
        return (
            f"the provider refused the cancel ({_result(detail)}"
            + (f": {said}" if said else "")
            + "); the job goes on, observed"
        )
    return f"{entry.from_state} → {entry.to_state} ({entry.cause})"


def _decision(actor: str, detail: dict[str, Any]) -> str:
    extra = ""
    if detail.get("extra_seconds"):
        extra = (
            f" (+{detail['extra_seconds']:g} s, "
            f"+{detail.get('extra_status_requests', 0)} status requests)"
        )
    text = f"{actor} decided {detail.get('action')}{extra}"
    if isinstance(detail.get("note"), str):
        text += f": {one_line(detail['note'], NOTE_LIMIT)}"
    return text


def text_of(entry: HistoryRecord) -> str:
    """What happened, in the story's words, without the time."""
    detail: dict[str, Any] = dict(entry.detail or {})
    kind = entry.kind
    if kind == HistoryKind.TRANSITION:
        text = _transition(entry, detail)
    elif kind == HistoryKind.OBSERVATION and entry.cause == "status_read":
        text = _status_read(detail, entry.delay_source)
    elif kind == HistoryKind.OBSERVATION:
        text = f"{entry.cause.replace('_', ' ')}: {_result(detail)}"
        if detail.get("job_id"):
            text += f", job {detail['job_id']}"
    elif kind == HistoryKind.HINT:
        text = f"webhook {detail.get('event_id', '?')} received: look now"
    elif kind == HistoryKind.ESCALATION:
        text = f"escalated: {detail.get('reason')} — {detail.get('detail', '')}".rstrip(" —")
    elif kind == HistoryKind.DECISION:
        text = _decision(entry.actor, detail)
    elif kind == HistoryKind.STEP:
        step = detail.get("step", "?")
        if entry.cause.startswith("step_done"):
            text = f"{step} done (attempt {detail.get('attempt')})"
        else:
            text = f"{step} failed: {detail.get('error', '')}"
    else:
        text = entry.cause.replace("_", " ")
        if detail.get("note"):
            text += f": {detail['note']}"
    return text


def line(entry: HistoryRecord) -> str:
    return f"{clock_text(entry.at)} {text_of(entry)}"


def tell(entries: Iterable[HistoryRecord]) -> list[str]:
    return [line(e) for e in entries]


def header(op: OperationRecord) -> str:
    """The line that names what the story is about, before its first entry."""
    job = op.remote_job_id or "not known yet"
    return f"operation {op.id} (provider {op.provider}, job {job}), state {op.state}"

"""An operation's story as timeline rows and as marks on lanes, and its callback deliveries.

Pure: history entries (``storage.history``) and step rows
(``storage.completion_steps``) in, rows out. The words are the story's
(``core.story``); the columns are what an operator scans for: when, the HTTP
result, the remote state, the next poll and why, who acted and on what cause.
The same rows drawn on one time axis (``marks``): one lane per kind of event.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from markupsafe import Markup

from reconciler.console import charts
from reconciler.console.formatting import when
from reconciler.core import story
from reconciler.core.records import HistoryRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.completion_steps import StepRecord


@dataclass(frozen=True)
class Row:
    seq: int
    at: datetime
    kind: str
    text: str
    actor: str
    cause: str
    http: str = ""
    remote_state: str = ""
    next_poll: datetime | None = None
    delay_source: str = ""
    transition: str = ""  # "from -> to" for a transition


def _http(detail: dict[str, Any]) -> str:
    if detail.get("transport_error"):
        return f"no response ({detail['transport_error']})"
    status = detail.get("http_status")
    return f"HTTP {status}" if status is not None else ""


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def _transition(entry: HistoryRecord) -> str:
    if entry.kind != HistoryKind.TRANSITION:
        return ""
    return f"{entry.from_state or '(new)'} → {entry.to_state}"


def row_of(entry: HistoryRecord) -> Row:
    detail: dict[str, Any] = dict(entry.detail or {})
    return Row(
        seq=entry.seq,
        at=entry.at,
        kind=entry.kind,
        text=story.text_of(entry),
        actor=entry.actor,
        cause=entry.cause,
        http=_http(detail) if entry.kind in (HistoryKind.OBSERVATION, HistoryKind.STEP) else "",
        remote_state=str(detail.get("remote_state") or ""),
        next_poll=_moment(detail.get("next_poll_at")),
        delay_source=entry.delay_source or "",
        transition=_transition(entry),
    )


def rows(entries: Iterable[HistoryRecord]) -> list[Row]:
    return [row_of(e) for e in entries]


class Lane(StrEnum):
    REQUESTS = "requests"  # calls to the provider: create, lookups, status reads, result
    WEBHOOKS = "webhooks"
    STATE = "state"  # transitions and notes
    DECISIONS = "decisions"  # escalations and the decisions on them
    CALLBACKS = "callbacks"  # completion steps: hooks and the agent's callback


LANE_OF: dict[str, Lane] = {
    HistoryKind.OBSERVATION: Lane.REQUESTS,
    HistoryKind.HINT: Lane.WEBHOOKS,
    HistoryKind.TRANSITION: Lane.STATE,
    HistoryKind.NOTE: Lane.STATE,
    HistoryKind.ESCALATION: Lane.DECISIONS,
    HistoryKind.DECISION: Lane.DECISIONS,
    HistoryKind.STEP: Lane.CALLBACKS,
}


def _bad(row: Row) -> bool:
    """An error answer or a failed attempt: drawn apart from the rest."""
    if row.cause.startswith("step_failed"):
        return True
    return bool(row.http) and not row.http.startswith("HTTP 2")


def marks(story_rows: Iterable[Row]) -> list[charts.Mark]:
    return [
        charts.Mark(r.at, LANE_OF.get(r.kind, Lane.STATE).value, r.text, _bad(r))
        for r in story_rows
    ]


LEGEND: dict[Lane, str] = {
    Lane.REQUESTS: "a call to the provider",
    Lane.WEBHOOKS: "a webhook",
    Lane.STATE: "a change of state",
    Lane.DECISIONS: "an escalation or a decision",
    Lane.CALLBACKS: "a callback or hook attempt",
}


def chart(op_id: str, story_rows: Sequence[Row]) -> Markup:
    return charts.lanes(
        "story-chart",
        f"{op_id}: the story on one time axis",
        [lane.value for lane in Lane],
        marks(story_rows),
        colours=[(lane.value, words) for lane, words in LEGEND.items()],
    )


@dataclass(frozen=True)
class Attempt:
    at: datetime
    number: int | None
    answer: str  # "HTTP 204", "no response (timeout)", the error text
    outcome: str  # "delivered" | "failed, retry at …" | "gave up"


@dataclass
class Delivery:
    """One downstream step of one completion round: its state and each attempt's answer."""

    round: int
    step: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    tried: list[Attempt] = field(default_factory=list)


def _attempt(entry: HistoryRecord) -> Attempt:
    detail: dict[str, Any] = dict(entry.detail or {})
    number = detail.get("attempt")
    if entry.cause.startswith("step_done"):
        return Attempt(entry.at, number, _http(detail) or "done", "delivered")
    answer = _http(detail)
    error = str(detail.get("error") or "")
    if error and error != answer:
        answer = f"{answer}: {error}" if answer else error
    if detail.get("gave_up"):
        outcome = "gave up"
    elif detail.get("retry_at"):
        retry = _moment(detail["retry_at"])
        outcome = f"failed, retry at {when(retry) if retry else detail['retry_at']}"
    else:
        outcome = "failed"
    return Attempt(entry.at, number, answer, outcome)


def deliveries(steps: Sequence[StepRecord], entries: Iterable[HistoryRecord]) -> list[Delivery]:
    """Each step row with the attempts its history entries record, in order.

    History entries carry no round, so an attempt belongs to the latest round of
    its step that had started when the attempt was recorded.
    """
    found = [
        Delivery(s.round, s.step, s.status.value, s.attempts, s.next_attempt_at, s.last_error)
        for s in steps
    ]
    starts = [s.started_at for s in steps]
    for entry in entries:
        if entry.kind != HistoryKind.STEP:
            continue
        name = str((entry.detail or {}).get("step", ""))
        candidates = [
            i
            for i, (d, start) in enumerate(zip(found, starts, strict=True))
            if d.step == name and (start is None or start <= entry.at)
        ]
        if not candidates:
            candidates = [i for i, d in enumerate(found) if d.step == name]
        if candidates:
            found[candidates[-1]].tried.append(_attempt(entry))
    return found

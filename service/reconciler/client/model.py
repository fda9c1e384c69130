"""Typed answers of the agent API: the Operation and its parts, pages, providers, run results.

Pure: JSON in, frozen dataclasses out. Unknown keys are kept in ``raw`` and
otherwise ignored, so a newer service does not break an older client. The one
decision here is ``outcome_of``: which of seven distinct outcomes an operation
stands for (success, failure and timeout are different words: docs/design.md#operation-view).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from reconciler.core.errors import ServiceError
from reconciler.core.outcome_parts import REQUEST_REJECTED
from reconciler.core.states import State, awaits_decision


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value)


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ServiceError(f"the service's answer is not {what}")
    return data


@dataclass(frozen=True)
class Budget:
    status_requests_used: int
    max_status_requests: int


@dataclass(frozen=True)
class EscalationOption:
    action: str
    description: str
    extra_seconds: float | None = None
    extra_status_requests: int | None = None


@dataclass(frozen=True)
class Escalation:
    """Why waiting stopped and what a person may decide; ``decided`` once they did."""

    reason: str
    message: str
    options: tuple[EscalationOption, ...]
    created_at: datetime | None
    decided: bool
    decision: Mapping[str, Any] | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Escalation:
        return cls(
            reason=data["reason"],
            message=data["message"],
            options=tuple(
                EscalationOption(
                    action=o["action"],
                    description=o.get("description", ""),
                    extra_seconds=o.get("extra_seconds"),
                    extra_status_requests=o.get("extra_status_requests"),
                )
                for o in data.get("options", ())
            ),
            created_at=_time(data.get("created_at")),
            decided=bool(data.get("decided")),
            decision=data.get("decision"),
        )


def _count(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Progress:
    """How far the job got: ``completed`` and ``total`` when the provider counts items
    (None otherwise), and ``detail``, its own progress value."""

    completed: float | int | None
    total: float | int | None
    detail: Any

    @classmethod
    def from_json(cls, data: Any) -> Progress | None:
        if data is None:
            return None
        if not isinstance(data, Mapping) or "detail" not in data:
            # A service older than the typed progress sent the provider's value itself.
            counts = data if isinstance(data, Mapping) else {}
            return cls(_count(counts.get("completed")), _count(counts.get("total")), data)
        return cls(_count(data.get("completed")), _count(data.get("total")), data.get("detail"))


@dataclass(frozen=True)
class CancelRefusal:
    """The provider refused the last cancel: the job was NOT cancelled and goes on; a new
    cancel may be asked for."""

    http_status: int | None
    provider_message: str | None
    at: datetime | None

    @classmethod
    def from_json(cls, data: Any) -> CancelRefusal | None:
        if data is None:
            return None
        body = _object(data, "a cancel refusal")
        status, said = body.get("http_status"), body.get("provider_message")
        return cls(
            http_status=status if type(status) is int else None,
            provider_message=said if isinstance(said, str) else None,
            at=_time(body.get("at")),
        )


@dataclass(frozen=True)
class OperationError:
    """Why the job did not succeed, in one shape: ``code`` (``request_rejected``: the
    provider refused the request and nothing ran), ``message`` in plain words, the
    provider's ``http_status`` and ``provider_message`` when they are the reason, and
    ``detail`` (what else was kept, the provider's error body included)."""

    code: str
    message: str
    http_status: int | None = None
    provider_message: str | None = None
    detail: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Any) -> OperationError | None:
        if data is None:
            return None
        body = _object(data, "an error")
        status = body.get("http_status")
        said = body.get("provider_message")
        detail = body.get("detail")
        return cls(
            code=str(body.get("code") or "error"),
            message=str(body.get("message") or body.get("code") or "error"),
            http_status=status if type(status) is int else None,
            provider_message=said if isinstance(said, str) else None,
            detail=detail if isinstance(detail, Mapping) else None,
        )


@dataclass(frozen=True)
class Operation:
    """One operation as the agent API shows it (docs/design.md#operation-view).

    ``done`` is true only when nothing more will happen without a new request;
    ``awaiting_decision`` while an operator must decide (the operation is then not done);
    ``replayed`` on the answer to a start that named an earlier job's key and request.
    """

    id: str
    provider: str
    state: str
    done: bool
    message: str
    remote_job_id: str | None
    remote_state: str | None
    poll_after_seconds: float | None
    progress: Progress | None
    deadline_at: datetime | None
    budget: Budget
    result: Mapping[str, Any] | None
    error: OperationError | None
    escalation: Escalation | None
    awaiting_decision: bool = False
    replayed: bool = False
    idempotency_key: str | None = None
    trace_id: str | None = None
    callback_url: str | None = None
    metadata: Mapping[str, Any] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    done_at: datetime | None = None
    cancel_requested: bool = False
    cancel_refused: CancelRefusal | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Operation:
        view = _object(data, "an Operation")
        try:
            budget = view["budget"]
            found = view.get("escalation")
            escalation = Escalation.from_json(found) if found else None
            awaiting = view.get("awaiting_decision")
            if not isinstance(awaiting, bool):  # a service older than the field
                awaiting = _awaits(view["state"], escalation)
            return cls(
                id=view["id"],
                provider=view["provider"],
                state=view["state"],
                done=bool(view["done"]) and not awaiting,
                message=view["message"],
                remote_job_id=view.get("remote_job_id"),
                remote_state=view.get("remote_state"),
                poll_after_seconds=view.get("poll_after_seconds"),
                progress=Progress.from_json(view.get("progress")),
                deadline_at=_time(view.get("deadline_at")),
                budget=Budget(budget["status_requests_used"], budget["max_status_requests"]),
                result=view.get("result"),
                error=OperationError.from_json(view.get("error")),
                escalation=escalation,
                awaiting_decision=awaiting,
                replayed=view.get("replayed") is True,
                idempotency_key=view.get("idempotency_key"),
                trace_id=view.get("trace_id"),
                callback_url=view.get("callback_url"),
                metadata=view.get("metadata"),
                created_at=_time(view.get("created_at")),
                updated_at=_time(view.get("updated_at")),
                done_at=_time(view.get("done_at")),
                cancel_requested=bool(view.get("cancel_requested")),
                cancel_refused=CancelRefusal.from_json(view.get("cancel_refused")),
                raw=dict(view),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(f"the service's Operation is missing or garbles {exc}") from None


def _awaits(state: str, escalation: Escalation | None) -> bool:
    """Waiting stopped and a person must decide (``escalated``, or an end state that the
    open escalation's decision can still reopen)."""
    try:
        known = State(state)
    except ValueError:
        return False
    return awaits_decision(known, escalation is not None and not escalation.decided)


@dataclass(frozen=True)
class Page:
    operations: list[Operation]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Any) -> Page:
        page = _object(data, "a page of operations")
        return cls(
            [Operation.from_json(op) for op in page.get("operations", [])],
            page.get("next_cursor"),
        )


@dataclass(frozen=True)
class HistoryEntry:
    seq: int
    at: datetime | None
    kind: str
    actor: str
    from_state: str | None
    to_state: str | None
    cause: str
    delay_source: str | None
    detail: Mapping[str, Any] | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HistoryEntry:
        return cls(
            seq=data["seq"],
            at=_time(data.get("at")),
            kind=data["kind"],
            actor=data["actor"],
            from_state=data.get("from"),
            to_state=data.get("to"),
            cause=data["cause"],
            delay_source=data.get("delay_source"),
            detail=data.get("detail"),
        )


@dataclass(frozen=True)
class HistoryPage:
    """One page of an operation's history; ``next_cursor`` is None on the last page."""

    entries: list[HistoryEntry]
    next_cursor: str | None

    @classmethod
    def from_json(cls, data: Any) -> HistoryPage:
        body = _object(data, "a history")
        entries = [HistoryEntry.from_json(entry) for entry in body.get("entries", [])]
        cursor = body.get("next_cursor")
        return cls(entries, cursor if isinstance(cursor, str) and cursor else None)


@dataclass(frozen=True)
class Provider:
    """What may be started at one provider; operators also see ``webhook`` settings."""

    name: str
    description: str | None
    request_schema: Mapping[str, Any] | None
    can_cancel: bool
    max_deadline_seconds: float | None
    max_status_requests: int | None
    webhook: Mapping[str, Any] | None = None
    preset: str | None = None
    set_by_service: tuple[str, ...] = ()
    webhook_trust: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provider:
        return cls(
            name=data["name"],
            description=data.get("description"),
            request_schema=data.get("request_schema"),
            can_cancel=bool(data.get("can_cancel")),
            max_deadline_seconds=data.get("max_deadline_seconds"),
            max_status_requests=data.get("max_status_requests"),
            webhook=data.get("webhook"),
            webhook_trust=data.get("webhook_trust"),
            preset=data.get("preset"),
            set_by_service=tuple(data.get("set_by_service") or ()),
            raw=dict(data),
        )


def providers_from_json(data: Any) -> list[Provider]:
    body = _object(data, "a list of providers")
    return [Provider.from_json(p) for p in body.get("providers", [])]


class Outcome(StrEnum):
    """How a ``run`` ended: seven different words, never an ambiguous one."""

    SUCCEEDED = "succeeded"
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    FAILED = "failed"
    REJECTED = "rejected"  # the provider refused the request: nothing ran; fix it, new key
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"  # still running when max_wait passed: the id is kept
    ESCALATED = "escalated"  # waiting stopped; an operator must decide


_END_OUTCOMES = {
    State.SUCCEEDED: Outcome.SUCCEEDED,
    State.COMPLETED_WITH_ERRORS: Outcome.COMPLETED_WITH_ERRORS,
    State.CANCELLED: Outcome.CANCELLED,
}


def outcome_of(op: Operation) -> Outcome:
    """The outcome an operation stands for now.

    A decision still pending wins (``escalated``, even on an end state a decision
    may reopen); then any other unfinished operation is ``timed_out``; a create the
    provider refused is ``rejected``; every other end state that is not success,
    partial success or a confirmed cancel is ``failed``.
    """
    if op.awaiting_decision:
        return Outcome.ESCALATED
    if not op.done:
        return Outcome.TIMED_OUT
    try:
        state = State(op.state)
    except ValueError:
        return Outcome.FAILED
    if state is State.FAILED and op.error is not None and op.error.code == REQUEST_REJECTED:
        return Outcome.REJECTED
    return _END_OUTCOMES.get(state, Outcome.FAILED)


@dataclass(frozen=True)
class RunResult:
    """What ``run`` returns: the outcome, and the operation id whatever happened."""

    outcome: Outcome
    operation_id: str
    operation: Operation

    @classmethod
    def of(cls, op: Operation) -> RunResult:
        return cls(outcome_of(op), op.id, op)

    @property
    def message(self) -> str:
        return self.operation.message

    @property
    def result(self) -> Mapping[str, Any] | None:
        return self.operation.result

    @property
    def error(self) -> OperationError | None:
        return self.operation.error

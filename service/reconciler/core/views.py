"""The Operation as agents and operators see it (AIP-151 in spirit).

Written so that a model cannot misread it: ``done`` is a boolean that is true
only in an end state, and ``message`` says in plain words whether the work is
finished, whether it succeeded and what to do next (docs/design.md#operation-view).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reconciler.core.clock import isoformat
from reconciler.core.records import EscalationRecord, HistoryRecord, OperationRecord
from reconciler.core.states import END_STATES, State

WAIT_HINT = "Wait with GET /v1/operations/{id}/wait."

_MESSAGES: dict[State, str] = {
    State.CREATE_PENDING: (
        "The job is being submitted to the provider. It has NOT started and is NOT complete. "
        "Do not report success. " + WAIT_HINT
    ),
    State.CREATE_UNKNOWN: (
        "The submission's outcome is not known yet; the service is reconciling with the provider "
        "using the same idempotency key, so no duplicate job will be made. The job is NOT "
        "complete. Do not report success and do not resubmit. " + WAIT_HINT
    ),
    State.ACCEPTED: (
        "The job has STARTED and is NOT complete. Do not report success. " + WAIT_HINT
    ),
    State.OBSERVING: (
        "The job has STARTED and is NOT complete. Do not report success. " + WAIT_HINT
    ),
    State.CANCEL_REQUESTED: (
        "Cancellation was requested and is NOT confirmed by the provider yet; the job may still "
        "finish. The operation is NOT complete. Do not report success or cancellation. " + WAIT_HINT
    ),
    State.CANCELLING: (
        "The cancel call was sent; the provider has NOT confirmed the cancellation yet and the job "
        "may still finish. The operation is NOT complete. Do not report success or cancellation. "
        + WAIT_HINT
    ),
    State.RESULT_COLLECTING: (
        "The provider reports the job finished; its result is being fetched and verified. The "
        "operation is NOT complete yet. Do not report success yet. " + WAIT_HINT
    ),
    State.SUCCEEDED: "The job SUCCEEDED and its result was verified. The result is in `result`.",
    State.COMPLETED_WITH_ERRORS: (
        "The job FINISHED WITH ERRORS: some items failed. Read `result.summary` and "
        "`result.failed_items` before reporting anything; do not report full success."
    ),
    State.FAILED: (
        "The job FAILED; the reason is in `error`. Do not report success. Do not resubmit unless "
        "you are asked to."
    ),
    State.CANCELLED: (
        "The job was CANCELLED, confirmed by the provider. Work finished before the cancellation "
        "is not undone."
    ),
    State.RESULT_TIMED_OUT: (
        "Waiting STOPPED at the deadline. This is NOT success: the job may still be running at "
        "the provider (see `remote_job_id`). An operator has been asked to decide."
    ),
    State.RESULT_UNAVAILABLE: (
        "The provider reports the job finished, but its result could NOT be fetched. This is NOT "
        "success; the reason is in `error`."
    ),
    State.RESULT_VALIDATION_FAILED: (
        "The provider reports the job finished, but its result FAILED validation. This is NOT "
        "success; the reason is in `error`."
    ),
    State.CANCELLATION_UNCONFIRMED: (
        "Cancellation was requested but the provider did NOT confirm it in time; the job may "
        "still be running. An operator has been asked to decide."
    ),
    State.ESCALATED: (
        "Waiting has STOPPED and needs a person's decision (see `escalation`). The job is NOT "
        "complete. Do not report success. " + WAIT_HINT
    ),
}


def message_for(op: OperationRecord) -> str:
    return _MESSAGES[State(op.state)].replace("{id}", op.id)


def _poll_after(op: OperationRecord, now: datetime) -> float | None:
    """How long an agent should wait before asking again, when it does not long-poll."""
    if State(op.state) in END_STATES:
        return None
    if op.next_poll_at is None:
        return 30.0
    return float(min(300, max(1, round((op.next_poll_at - now).total_seconds()))))


def escalation_view(esc: EscalationRecord | None) -> dict[str, Any] | None:
    if esc is None:
        return None
    return {
        "reason": esc.reason,
        "message": esc.message,
        "options": list(esc.options),
        "created_at": isoformat(esc.created_at),
        "decided": esc.decided_at is not None,
        "decision": esc.decision,
    }


def operation_view(
    op: OperationRecord, now: datetime, escalation: EscalationRecord | None = None
) -> dict[str, Any]:
    state = State(op.state)
    return {
        "id": op.id,
        "provider": op.provider,
        "state": state.value,
        "done": state in END_STATES,
        "remote_job_id": op.remote_job_id,
        "remote_state": op.remote_state,
        "message": message_for(op),
        "poll_after_seconds": _poll_after(op, now),
        "progress": op.progress,
        "deadline_at": isoformat(op.deadline_at),
        "budget": {
            "status_requests_used": op.status_requests_used,
            "max_status_requests": op.max_status_requests,
        },
        "result": op.result,
        "error": op.error,
        "escalation": escalation_view(escalation),
        "idempotency_key": op.idempotency_key,
        "trace_id": op.trace_id,
        "callback_url": op.callback_url,
        "metadata": op.meta,
        "created_at": isoformat(op.created_at),
        "updated_at": isoformat(op.updated_at),
        "done_at": isoformat(op.done_at),
        "cancel_requested": op.cancel_requested_at is not None,
    }


def history_entry_view(entry: HistoryRecord) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "at": isoformat(entry.at),
        "kind": entry.kind,
        "actor": entry.actor,
        "from": entry.from_state,
        "to": entry.to_state,
        "cause": entry.cause,
        "delay_source": entry.delay_source,
        "detail": entry.detail,
        "hash": entry.hash,
    }

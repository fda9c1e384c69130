"""The Operation as agents and operators see it (AIP-151 in spirit).

Written so that a model cannot misread it: ``done`` is a boolean that is true only
when nothing more will happen without a new request (an end state with no decision
pending), ``awaiting_decision`` says when the next move is an operator's, and
``message`` says in plain words whether the work is finished, whether it succeeded,
who acts next and what to call (docs/design.md#operation-view).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reconciler.core.clock import isoformat
from reconciler.core.decision_note import decision_note
from reconciler.core.outcome_parts import (
    CREDENTIALS_REFUSED,
    REQUEST_REJECTED,
    error_view,
    progress_view,
)
from reconciler.core.records import EscalationRecord, HistoryRecord, OperationRecord
from reconciler.core.states import State, awaits_decision, is_done

WAIT_HINT = "Wait with GET /v1/operations/{id}/wait."
# A long-poll returns when a pending decision is made (``commands.agent_actions.wait_until``).
DECISION_HINT = "GET /v1/operations/{id}/wait returns as soon as the decision is made."
REPLAYED = (
    "This is the job started earlier with the same idempotency_key and request; no new job "
    "was started. "
)
# How often an agent that does not long-poll should look while a person decides.
DECISION_POLL_SECONDS = 60.0

# Every state but `escalated`, which always awaits a decision (``_AWAITING``).
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
        "Waiting STOPPED for good before the job was seen to finish. This is NOT success: the "
        "job may still be running at the provider (see `remote_job_id`) and its outcome is not "
        "known."
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
        "Cancellation was requested but the provider never confirmed it, and waiting STOPPED "
        "for good. This is NOT a confirmed cancellation: the job may still be running at the "
        "provider."
    ),
}


# While a decision is pending the message says so first; these open it, per state.
_AWAITING: dict[State, str] = {
    State.RESULT_TIMED_OUT: (
        "Waiting STOPPED at the deadline and the job is NOT done: it may still be running at "
        "the provider (see `remote_job_id`). Do not report success or failure."
    ),
    State.CANCELLATION_UNCONFIRMED: (
        "The provider did NOT confirm the cancellation in time and the job is NOT done: it may "
        "still be running. Do not report success or cancellation."
    ),
    State.ESCALATED: (
        "Waiting has STOPPED and the job is NOT complete: it needs a decision. Do not report "
        "success."
    ),
}
_REJECTED = (
    "The provider REFUSED the request ({why}), so nothing ran. Fix `request` (it must match "
    "the provider's `request_schema`; `error.provider_message` is the provider's own words) "
    "and start a new job with a NEW `idempotency_key`: the same key answers with this refused "
    "job. Do not report that the job ran or failed."
)

_CREDENTIALS = (
    "The provider REFUSED this service's credentials ({why}), so nothing ran. This is not "
    "your request's fault and you cannot fix it: tell your user that an operator of this "
    "service must fix the provider's credentials; then start a new job with a NEW "
    "`idempotency_key`. Do not report that the job ran or failed."
)
_REFUSED = {REQUEST_REJECTED: _REJECTED, CREDENTIALS_REFUSED: _CREDENTIALS}
# A cancel the provider refused: the job was NOT cancelled and goes on (``cancel_refused``).
_CANCEL_REFUSED = (
    "The provider REFUSED the cancel ({why}): the job was NOT cancelled and is still being "
    "watched. "
)


def _options(escalation: EscalationRecord | None) -> str:
    if escalation is None:
        return ""
    described = [
        str(o.get("description") or o.get("action")) if isinstance(o, dict) else str(o)
        for o in escalation.options or ()
    ]
    return f" The options are: {'; '.join(described)}." if described else ""


def _awaiting_message(state: State, escalation: EscalationRecord | None) -> str:
    # Written to the agent: a person decides, it cannot, its user should know, and the
    # wait it is told to make returns when the person has decided.
    reason = f" (reason: {escalation.reason})" if escalation is not None else ""
    return (
        _AWAITING[state]
        + f" A person, an operator of this service, must decide what happens next{reason}; "
        "you cannot decide it. Tell your user that the job awaits an operator's decision."
        + _options(escalation)
        + " "
        + DECISION_HINT
    )


def message_for(op: OperationRecord, escalation: EscalationRecord | None = None) -> str:
    """What ``op`` means and what to do next; ``escalation`` is its current one, if any."""
    state = State(op.state)
    code = _code(op.error)
    if awaits_decision(state, op.escalation_open):
        pending = escalation if escalation is not None and escalation.decided_at is None else None
        text = _awaiting_message(state, pending)
    elif state is State.FAILED and code in _REFUSED:
        text = _REFUSED[code].format(why=_refusal(error_view(op.error)))
    else:
        text = _MESSAGES[state]
    if escalation is not None and not op.escalation_open:
        text = f"{decision_note(escalation)} {text}".lstrip()
    if op.cancel_refusal is not None and not is_done(state, op.escalation_open):
        text = _CANCEL_REFUSED.format(why=_refusal(op.cancel_refusal)) + text
    return text.replace("{id}", op.id)


def _refusal(error: dict[str, Any] | None) -> str:
    """``HTTP 422: the provider's words``, as much of it as is known."""
    if error is None:
        return "no reason given"
    status, said = error.get("http_status"), error.get("provider_message")
    parts = [f"HTTP {status}" if status else "", said or ""]
    return ": ".join(p for p in parts if p) or "no reason given"


def _code(error: Any) -> Any:
    return error.get("code") if isinstance(error, dict) else None


def _poll_after(op: OperationRecord, now: datetime) -> float | None:
    """How long an agent should wait before asking again, when it does not long-poll."""
    state = State(op.state)
    if is_done(state, op.escalation_open):
        return None
    if awaits_decision(state, op.escalation_open):
        return DECISION_POLL_SECONDS
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
    op: OperationRecord,
    now: datetime,
    escalation: EscalationRecord | None = None,
    *,
    replayed: bool = False,
) -> dict[str, Any]:
    """The Operation; ``replayed``: this answers a start that named an earlier job's key."""
    state = State(op.state)
    awaiting = awaits_decision(state, op.escalation_open)
    view = {
        "id": op.id,
        "provider": op.provider,
        "state": state.value,
        "done": is_done(state, op.escalation_open),
        "awaiting_decision": awaiting,
        "replayed": False,
        "remote_job_id": op.remote_job_id,
        "remote_state": op.remote_state,
        "message": message_for(op, escalation),
        "poll_after_seconds": _poll_after(op, now),
        "progress": progress_view(op.progress),
        "deadline_at": isoformat(op.deadline_at),
        "budget": {
            "status_requests_used": op.status_requests_used,
            "max_status_requests": op.max_status_requests,
        },
        "result": op.result,
        "error": error_view(op.error),
        "escalation": escalation_view(escalation),
        "idempotency_key": op.idempotency_key,
        "trace_id": op.trace_id,
        "callback_url": op.callback_url,
        "metadata": op.meta,
        "created_at": isoformat(op.created_at),
        "updated_at": isoformat(op.updated_at),
        # Nothing reads as final while a decision may still reopen the end.
        "done_at": None if awaiting else isoformat(op.done_at),
        "cancel_requested": op.cancel_requested_at is not None,
        "cancel_refused": op.cancel_refusal,
    }
    return as_replayed(view) if replayed else view


def as_replayed(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` as the answer to a start that named this earlier job's key and request."""
    if view.get("replayed"):
        return view
    return {**view, "replayed": True, "message": REPLAYED + str(view["message"])}


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

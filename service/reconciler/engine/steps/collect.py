"""Result collection, its own recorded action (``result_collecting``).

Fetch through the provider file's result path or the result reference,
validate (required fields; content type, size and checksum where given),
keep small results inline and large ones as a reference with SHA-256 and
size. Fetch failures are retried with backoff up to the provider's failure
budget, then the operation ends ``result_unavailable``; a result that
arrives but does not validate ends ``result_validation_failed``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from reconciler.core.states import State
from reconciler.core.vocabulary import HistoryKind, RemoteCategory
from reconciler.engine.context import FlowContext
from reconciler.engine.steps.create import call_detail
from reconciler.providers.adapter import CallResult, ResultCheck, check_result
from reconciler.storage.journal import Entry
from reconciler.storage.models import Operation

INLINE_RESULT_BYTES = 65_536
MAX_FAILED_ITEMS = 50
RETRYABLE_FETCH = frozenset({408, 425, 429})


def _retryable(call: CallResult) -> bool:
    if call.transport_error is not None:
        return True
    status = call.http_status
    return status is not None and (status >= 500 or status in RETRYABLE_FETCH)


def _ref(op: Operation, ctx: FlowContext) -> str | None:
    spec = ctx.spec(op)
    pointer = spec.status.result_ref
    if pointer is None or op.status_body is None:
        return None
    value = pointer.resolve(op.status_body)
    return value if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def result_record(check: ResultCheck, ref: str | None, call: CallResult) -> dict[str, Any]:
    record: dict[str, Any] = {
        "ref": ref,
        "sha256": check.sha256,
        "size": check.size if check.size is not None else len(call.body_bytes or b""),
        "content_type": call.content_type,
        "summary": check.summary or None,
    }
    if check.failed_items:
        record["failed_items"] = list(check.failed_items[:MAX_FAILED_ITEMS])
        record["failed_items_truncated"] = len(check.failed_items) > MAX_FAILED_ITEMS
    if record["size"] is not None and record["size"] <= INLINE_RESULT_BYTES:
        record["data"] = check.document
    return record


class CollectFlow:
    def __init__(self, ctx: FlowContext) -> None:
        self.ctx = ctx

    async def __call__(self, op: Operation) -> None:
        ctx = self.ctx
        spec = ctx.spec(op)
        journal = ctx.runtime.journal
        now = ctx.now()
        ref = _ref(op, ctx)
        if spec.result is None:
            # Nothing to fetch or check: the confirmed terminal status is the outcome.
            await ctx.write(
                op,
                lambda conn: journal.transition(
                    conn,
                    op,
                    State.SUCCEEDED,
                    actor=ctx.actor,
                    cause="no_result_to_collect",
                    now=now,
                    changes={"result": {"ref": ref, "status": op.status_body}},
                    lease=ctx.lease,
                ),
            )
            return
        assert op.remote_job_id is not None
        job_id = op.remote_job_id
        charged = await ctx.write(
            op,
            lambda conn: journal.write(
                conn,
                op,
                now=now,
                lease=ctx.lease,
                changes={"result_attempts": op.result_attempts + 1},
            ),
        )
        call = await ctx.call(
            op, "result", lambda: ctx.adapter(op).fetch_result(job_id, ref, op.trace_id)
        )
        now = ctx.now()
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="result_fetch",
            detail=call_detail(call),
        )
        if (
            call.refused is None
            and _retryable(call)
            and charged.result_attempts < charged.max_transport_failures
        ):
            delay = ctx.backoff(spec).delay(charged.result_attempts, ctx.runtime.rng)
            await ctx.apply(
                charged,
                lambda conn, fresh: journal.write(
                    conn,
                    fresh,
                    now=now,
                    lease=ctx.lease,
                    entries=[entry],
                    changes={"next_poll_at": now + timedelta(seconds=delay)},
                ),
            )
            return
        if call.refused is not None or not call.ok:
            unavailable: dict[str, Any] = {
                "code": "result_unavailable",
                "detail": entry.detail,
                "attempts": charged.result_attempts,
            }
            await ctx.apply(
                charged,
                lambda conn, fresh: journal.transition(
                    conn,
                    fresh,
                    State.RESULT_UNAVAILABLE,
                    actor=ctx.actor,
                    cause="result_fetch_failed",
                    now=now,
                    changes={"error": unavailable},
                    before=[entry],
                    lease=ctx.lease,
                ),
            )
            return
        check = check_result(spec, call, op.status_body)
        if not check.ok:
            error: dict[str, Any] = {"code": "result_invalid", "problems": list(check.problems)}
            await ctx.apply(
                charged,
                lambda conn, fresh: journal.transition(
                    conn,
                    fresh,
                    State.RESULT_VALIDATION_FAILED,
                    actor=ctx.actor,
                    cause="result_validation_failed",
                    now=now,
                    changes={"error": error},
                    detail={"problems": list(check.problems)},
                    before=[entry],
                    lease=ctx.lease,
                ),
            )
            return
        record = result_record(check, ref, call)
        category = spec.states.category_of(op.remote_state)
        failed = _count(check.summary.get("failed")) if check.summary else None
        partial = category is RemoteCategory.PARTIAL or bool(failed) or bool(check.failed_items)
        target = State.COMPLETED_WITH_ERRORS if partial else State.SUCCEEDED
        await ctx.apply(
            charged,
            lambda conn, fresh: journal.transition(
                conn,
                fresh,
                target,
                actor=ctx.actor,
                cause="result_verified",
                now=now,
                detail={
                    "sha256": record["sha256"],
                    "size": record["size"],
                    "summary": record["summary"],
                },
                changes={"result": record},
                before=[entry],
                lease=ctx.lease,
            ),
        )

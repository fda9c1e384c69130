"""The agent's actions, shared by the HTTP routes and the MCP tools so the two cannot drift.

Each takes the runtime, the authenticated principal and JSON-typed input, validates
it with ``commands.validation``, writes through the write actions beside it
(``commands.create``, ``commands.cancel``) and answers with Operation
views from the one builder (``storage.operation_reads``). Guarantee: bad input raises
``InvalidRequest`` before anything is stored; an agent only ever reaches its own
operations (another's id is ``NotFound``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import anyio.to_thread

from reconciler.commands import create as creating
from reconciler.commands.cancel import cancel as commands_cancel
from reconciler.commands.validation import (
    admit_create,
    check_provider_request,
    history_cursor,
    parse_cancel,
    parse_create,
)
from reconciler.core import states
from reconciler.core.errors import Conflict, InvalidRequest, NotFound
from reconciler.core.operation_view import as_replayed, history_entry_view
from reconciler.core.principal import Principal
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.strict_json import require_field_text, shown
from reconciler.providers.provider_view import provider_view
from reconciler.providers.spec import ProviderSpec
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.database import NEW_OPERATION
from reconciler.storage.history import history_page
from reconciler.storage.operation_reads import operation_views
from reconciler.tracing import SpanName, operation_context
from reconciler.wire import CreateOperation, OperationFilter

Settled = Callable[[OperationRecord], bool]
# Far above any id we issue (``op_`` and 26 characters): a longer one is not looked up.
MAX_OPERATION_ID = 100


def is_done(op: OperationRecord) -> bool:
    return states.is_done(State(op.state), op.escalation_open)


def awaiting_decision(op: OperationRecord) -> bool:
    return states.awaits_decision(State(op.state), op.escalation_open)


def answer_settled(first: OperationRecord) -> Settled:
    """When an agent's wait that began on ``first`` has its answer: the operation is done,
    or a decision became pending, or the pending one was made (whichever way it went)."""
    waiting = awaiting_decision(first)
    return lambda op: is_done(op) or awaiting_decision(op) != waiting


async def render(rt: Runtime, op: OperationRecord, *, replayed: bool = False) -> dict[str, Any]:
    """The Operation view (requests rendering in the same loop turn share one read).

    ``replayed``: the answer to a start whose key and request named this earlier job."""
    view = await rt.views.view(op)
    return as_replayed(view) if replayed else view


def operation_id(raw: str, field: str = "id") -> str:
    """An operation id as a caller gave it, refused before any lookup if it cannot exist."""
    require_field_text(field, raw)
    if len(raw) > MAX_OPERATION_ID:
        raise NotFound(f"operation {shown(raw)} does not exist")
    return raw


async def load_visible(rt: Runtime, op_id: str, who: Principal) -> OperationRecord:
    operation_id(op_id)

    def load() -> OperationRecord:
        with rt.db.read() as conn:
            return store.visible_operation(conn, op_id, who)

    return await rt.db.run(load)


async def wait_until(
    rt: Runtime,
    op_id: str,
    who: Principal,
    deadline: float,
    settled: Settled | None = None,
    *,
    current: OperationRecord | None = None,
) -> OperationRecord:
    """The operation as soon as ``settled`` holds, or at ``deadline`` with the latest record.

    By default (an agent's wait) it holds when ``answer_settled`` by the first read does.

    ``deadline`` is on the loop's clock, taken when the request arrived, so time spent
    queueing for a read counts against the wait. Each round subscribes before it reads
    (a change in between is not missed) and reads once; the timeout itself costs no read,
    and neither does a change made in this process that settles it, which hands over
    the record it committed. ``current``: the caller holds the record as stored already
    (it just wrote it), so the first round reads nothing either. Waiting holds no thread
    and no connection: only an event.
    """
    operation_id(op_id)
    loop = asyncio.get_running_loop()
    op = current
    while True:
        event = rt.notifier.subscribe(op_id)
        try:
            if op is None:
                op = await load_visible(rt, op_id, who)
            if settled is None:
                settled = answer_settled(op)
            left = deadline - loop.time()
            if settled(op) or left <= 0 or rt.notifier.closing:
                return op  # closing: shutting down, answer now rather than be cut off
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=left)
        finally:
            rt.notifier.unsubscribe(op_id, event)
        if not event.is_set():
            return op  # timed out without a change: the last read stands
        if rt.notifier.closing:
            # Stopping: answer with the last read rather than read again, as every open wait
            # would at once, queued behind the engine's work, past the shutdown's grace.
            return event.record or op
        # Changed here: the committed record, enough when it settles the wait (settling is
        # final). Otherwise read it after subscribing again: a later change may have come
        # between this wake-up and the next subscription, and the handed record predates it.
        op = event.record
        if op is not None and not settled(op):
            op = None


async def start(
    rt: Runtime, who: Principal, body: Any, headers: Mapping[str, str] | None = None
) -> tuple[OperationRecord, bool]:
    """Store the operation (idempotent on its key); ``(operation, created)``.

    The provider's ``request_schema`` and ``create.set`` are applied here, before anything
    is stored. ``headers``: the request's, whose ``traceparent`` the operation's trace
    continues.
    """
    arrived = asyncio.get_running_loop().time()
    with rt.tracing.request(SpanName.AGENT_CREATE, headers or {}):
        # Off the loop, in one hop: a request of a megabyte takes tens of ms to walk and
        # validate, and a provider's schema is checked there too.
        req = await anyio.to_thread.run_sync(
            _parse_checked, body, rt.providers, rt.check_callback_url, limiter=rt.request_checks
        )
        return await _store(rt, who, req, arrived)


def _parse_checked(
    body: Any, providers: Mapping[str, ProviderSpec], check_callback: Callable[[str], object]
) -> CreateOperation:
    """A create's body as ``parse_create`` takes it, then checked against its provider's
    file (``check_provider_request``)."""
    req = parse_create(body, providers, check_callback)
    check_provider_request(req.request, providers[req.provider])
    return req


async def start_validated(
    rt: Runtime, who: Principal, req: CreateOperation, headers: Mapping[str, str] | None = None
) -> tuple[OperationRecord, bool]:
    """``start`` for a body already validated as a ``CreateOperation`` (an MCP call, whose
    HTTP request's ``headers`` may carry the agent's ``traceparent``)."""
    arrived = asyncio.get_running_loop().time()
    if rt.tracing.enabled and rt.tracing.current() is None:
        with rt.tracing.request(SpanName.AGENT_CREATE, headers or {}):
            return await _admitted(rt, who, req, arrived)
    return await _admitted(rt, who, req, arrived)


async def _admitted(
    rt: Runtime, who: Principal, req: CreateOperation, arrived: float
) -> tuple[OperationRecord, bool]:
    """What ``start`` checks in its hop, checked for a body already validated; then stored."""
    admit_create(req, rt.providers, rt.check_callback_url)
    spec = rt.providers[req.provider]
    if spec.request_schema is None:
        check_provider_request(req.request, spec)
    else:
        await anyio.to_thread.run_sync(
            check_provider_request, req.request, spec, limiter=rt.request_checks
        )
    return await _store(rt, who, req, arrived)


async def _store(
    rt: Runtime, who: Principal, req: CreateOperation, arrived: float
) -> tuple[OperationRecord, bool]:
    """Store a checked create and (briefly) wait; ``arrived``: when the request came, on
    the loop's clock, from which the wait for the job id is counted (the checks and the
    insert are inside it, so the answer never waits longer than ``create_wait_seconds``
    in all)."""
    limits = rt.limits_for(req.provider)
    tracing = rt.tracing
    # A slot of the provider's share taken first: the insert leases the row to this
    # replica's worker and its step starts as it commits (``engine.create_start``).
    start = None if rt.create_starts is None else rt.create_starts.reserve(req.provider)
    args = (
        rt.journal,
        who,
        req,
        limits,
        rt.clock.now(),
        tracing.current(),
        None if start is None else start.changes,
    )
    try:
        op, created = await _insert(rt, req, args)
    except BaseException:
        if start is not None:
            start.cancel()
        raise
    if start is not None:
        if created:
            start.begin(op)
        else:
            start.cancel()
    if tracing.enabled:
        tracing.note(operation=op.id, provider=op.provider, created=created)
        if not created:
            tracing.link(operation_context(op))  # an idempotent retry: the operation's trace
    if created:
        if start is None:
            rt.notifier.wake()  # a claim takes it; one started here needs none
        wait = rt.settings.server.create_wait_seconds
        if wait > 0 and rt.create_waits.should_wait(rt.clock.monotonic()):
            # A short, bounded wait so the answer usually carries the job id already; it
            # holds neither a thread nor a connection, and reads nothing when the job id
            # is learned in this process (the change hands over its record). Unless job
            # ids have been coming late for a while (``core.create_wait``): then the
            # answer comes at once.
            deadline = arrived + wait
            op = await wait_until(
                rt,
                op.id,
                who,
                deadline,
                lambda current: current.state != State.CREATE_PENDING,
                current=op,
            )
            rt.create_waits.saw(op.state != State.CREATE_PENDING, rt.clock.monotonic())
    return op, created


async def _insert(
    rt: Runtime, req: CreateOperation, args: tuple[Any, ...]
) -> tuple[OperationRecord, bool]:
    # The agent waits on the wire: ahead of the engine's queued writes (``storage.writer``).
    try:
        return await rt.db.run_joined(
            creating.create_operation, *args, key=NEW_OPERATION, first=True
        )
    except Conflict:
        if req.idempotency_key is None:
            raise
        # Lost a race with a request carrying the same key: now it finds that one stored.
        return await rt.db.run_joined(
            creating.create_operation, *args, key=NEW_OPERATION, first=True
        )


async def cancel(rt: Runtime, who: Principal, op_id: str, body: Any) -> OperationRecord:
    operation_id(op_id)
    intent = parse_cancel(body)
    op = await rt.db.run_write(
        commands_cancel, rt.db, rt.journal, rt.providers, op_id, who, intent.reason, rt.clock.now()
    )
    rt.notifier.changed(op.id)
    rt.notifier.wake()
    return op


async def page(rt: Runtime, who: Principal, query: OperationFilter) -> dict[str, Any]:
    if query.provider is not None and query.provider not in rt.providers:
        # A filter that names nothing would answer an empty page, which reads as "none".
        known = ", ".join(sorted(rt.providers)) or "none configured"
        raise InvalidRequest(
            f"unknown provider {shown(query.provider)!r} in the filter; known providers: {known}"
        )

    def load() -> dict[str, Any]:
        with rt.db.read() as conn:
            found = store.list_operations(
                conn,
                who,
                state=query.state,
                provider=query.provider,
                done=query.done,
                awaiting_decision=query.awaiting_decision,
                limit=query.limit,
                cursor=query.cursor,
            )
            views = operation_views(conn, found.items, rt.clock.now())
        return {"operations": views, "next_cursor": found.next_cursor}

    return await rt.db.run(load)


async def history(
    rt: Runtime, who: Principal, op_id: str, limit: int, after: int = 0
) -> dict[str, Any]:
    """One page of the history, oldest first; ``next_cursor`` continues it (null at the end)."""
    operation_id(op_id)

    def load() -> dict[str, Any]:
        with rt.db.read() as conn:
            store.visible_operation(conn, op_id, who)
            entries, last = history_page(conn, op_id, after, limit)
        return {
            "operation_id": op_id,
            "entries": [history_entry_view(e) for e in entries],
            "next_cursor": history_cursor(last),
        }

    return await rt.db.run(load)


async def providers(rt: Runtime, who: Principal) -> dict[str, Any]:
    names = sorted(rt.providers)
    trust: dict[str, dict[str, Any]] = {}
    if who.is_operator:
        # Webhook trust in the words of the console's providers page, read off the loop.
        trust = {n: v.as_dict() for n, v in (await rt.db.run(rt.trust_views)).items()}
    views = [
        provider_view(rt.providers[n], rt.environ, operator=who.is_operator, trust=trust.get(n))
        for n in names
    ]
    return {"providers": views}

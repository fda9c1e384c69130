"""One operation's page, the confirmation of a decision, and the decision itself.

Guarantee: the page tells the operator what stopped, why, and what each option
does, in the operator's words (never the agent's message); the buttons are exactly
the open escalation's options, each with its stated cost and what it did here
before. A decision needs a confirmation page and the session's CSRF token, goes
through ``commands.decide`` (the API's and CLI's command) with the operator token's
name as actor and the operator's optional note, and is refused with the API's
message when it was not offered or was already made; "Decision recorded" is shown
once, on the page the decision leads to (a short-lived cookie, not the URL, so a
reload does not say it again). URLs that may carry credentials in their query
(callback URL, result reference) are shown without it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from reconciler.commands import operator_reads
from reconciler.commands.decide import decide as commands_decide
from reconciler.console import operator_text, timeline
from reconciler.console.web import (
    MAX_ID,
    PREFIX,
    Operator,
    checked_form,
    operator,
    page,
    render,
    runtime_of,
    state_of,
)
from reconciler.core import errors, risk
from reconciler.core.operator_decision import plan_decision
from reconciler.core.records import EscalationRecord, OperationRecord
from reconciler.core.states import State, awaits_decision, is_done
from reconciler.providers.spec import cancel_deadline_seconds
from reconciler.runtime import Runtime
from reconciler.tracing import SpanName
from reconciler.wire import parse_decision
from reconciler.wire.fields import MAX_DECISION_NOTE

FORM_FIELDS = {"csrf", "action", "escalation", "extra_seconds", "extra_status_requests", "note"}
# Names the escalation just decided, for the one page the decision leads to.
DECIDED_COOKIE = "reconciler_console_decided"
DECIDED_SECONDS = 60


def without_query(url: str | None) -> str | None:
    """A URL as an operator may see it: no user info, query or fragment (they may hold keys)."""
    if not url:
        return url
    parts = urlsplit(url)
    if not parts.scheme:
        return url.split("?", 1)[0]
    host = parts.hostname or ""
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    hidden = " (query hidden)" if parts.query or parts.username or parts.password else ""
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + hidden


def _op_id(request: Request) -> str:
    op_id = str(request.path_params["op_id"])
    if len(op_id) > MAX_ID or not op_id.isprintable():
        raise errors.NotFound("no such operation: operation ids look like op_…")
    return op_id


def _load(rt: Runtime, op_id: str) -> dict[str, Any]:
    now = rt.clock.now()
    found = operator_reads.operation_file(rt.db, op_id)
    op, escalations, entries = found.op, found.escalations, found.entries
    story_rows = timeline.rows(entries)
    state = State(op.state)
    awaiting = awaits_decision(state, op.escalation_open)
    last = next((e for e in escalations if e.id == op.escalation_id), None)
    return {
        "op": op,
        "done": is_done(state, op.escalation_open),
        "awaiting_decision": awaiting,
        "summary": operator_text.summary(op.state, awaiting),
        "open": last if last is not None and last.decided_at is None else None,
        "repeat": operator_text.repeat_of(escalations),
        "escalations": escalations,
        "timeline": story_rows,
        "story_chart": timeline.chart(op.id, story_rows),
        "deliveries": timeline.deliveries(found.steps, entries),
        "callback_url": without_query(op.callback_url),
        "result": _result(op.result),
        "risks": risk.risks(op, now, last.reason if last is not None else None),
    }


def _result(stored: Any) -> dict[str, Any] | None:
    """What the page shows of a result: never the document itself (it stays behind the API)."""
    if not isinstance(stored, dict):
        return None
    failed = stored.get("failed_items")
    return {
        "ref": without_query(stored.get("ref")),
        "content_type": stored.get("content_type"),
        "size": stored.get("size"),
        "sha256": stored.get("sha256"),
        "summary": stored.get("summary") if isinstance(stored.get("summary"), dict) else None,
        "failed_items": failed if isinstance(failed, list) else [],
        "failed_items_truncated": bool(stored.get("failed_items_truncated")),
    }


@page
async def operation_page(request: Request) -> Response:
    who = await operator(request)
    rt = runtime_of(request)
    op_id = _op_id(request)
    data = await rt.db.run(_load, rt, op_id)
    flash = request.cookies.get(DECIDED_COOKIE)
    just = next((e for e in data["escalations"] if str(e.id) == flash), None)
    response = render(
        request,
        "operation.html",
        {**data, "just_decided": operator_text.decided(just) if just is not None else None},
        who=who,
    )
    if flash is not None:
        response.delete_cookie(DECIDED_COOKIE, path=_own_path(op_id))
    return response


def _own_path(op_id: str) -> str:
    return f"{PREFIX}/operations/{op_id}"


def _option(rt: Runtime, who: Operator, data: dict[str, Any], action: str) -> dict[str, Any]:
    """The offered option to confirm; refused exactly as the API would refuse the decision."""
    request = parse_decision({"action": action})
    op: OperationRecord = data["op"]
    esc: EscalationRecord | None = data["open"]
    # A dry run of the decision's pure planning: the same refusal, the same words.
    plan_decision(
        op,
        esc,
        request,
        f"operator:{who.name}",
        rt.clock.now(),
        cancel_deadline_seconds(rt.providers.get(op.provider)),
    )
    assert esc is not None  # plan_decision refuses a missing escalation
    return next(dict(o) for o in esc.options if o.get("action") == request.action.value)


@page
async def confirm_page(request: Request) -> Response:
    """The confirmation step: the option, its cost, and the one button that decides."""
    who = await operator(request)
    rt = runtime_of(request)
    op_id = _op_id(request)
    action = request.query_params.get("action", "")
    data = await rt.db.run(_load, rt, op_id)
    option = _option(rt, who, data, action)
    context = {**data, "option": option, "note_limit": MAX_DECISION_NOTE}
    return render(request, "confirm.html", context, who=who)


def _decision_body(form: dict[str, str]) -> dict[str, Any]:
    """The form as the API's decision body, so the API's validation applies unchanged."""
    unknown = sorted(set(form) - FORM_FIELDS)
    if unknown:
        raise errors.InvalidRequest(f"unknown form field(s): {', '.join(unknown)}")
    body: dict[str, Any] = {"action": form.get("action", "")}
    # An empty note box is no note; anything else is the API's to check.
    if form.get("note", "").strip():
        body["note"] = form["note"]
    for name, kind in (("extra_seconds", float), ("extra_status_requests", int)):
        raw = form.get(name, "")
        if raw:
            try:
                body[name] = kind(raw)
            except ValueError:
                raise errors.InvalidRequest(f"'{name}' must be a number, got {raw!r}") from None
    return body


@page
async def decide(request: Request) -> Response:
    who, form = await checked_form(request)
    rt = runtime_of(request)
    op_id = _op_id(request)
    decision = parse_decision(_decision_body(form))

    def check_escalation() -> None:
        # The confirmation named one escalation: refuse if another one is open by now.
        op = operator_reads.operation(rt.db, op_id)
        confirmed = form.get("escalation", "")
        if op.escalation_id is not None and confirmed and confirmed != str(op.escalation_id):
            raise errors.DecisionNotAllowed(
                "the escalation changed since the confirmation page was shown; review it again"
            )

    await rt.db.run(check_escalation)
    op = await rt.db.run_write(
        commands_decide,
        rt.db,
        rt.journal,
        rt.providers,
        op_id,
        who.principal,
        decision,
        rt.clock.now(),
    )
    rt.tracing.mark(op, SpanName.DECISION, decision=decision.action, state=op.state)
    rt.notifier.changed(op.id)
    rt.notifier.wake()
    response = RedirectResponse(f"{_own_path(op.id)}#decided", status_code=303)
    response.set_cookie(
        DECIDED_COOKIE,
        str(op.escalation_id),
        max_age=DECIDED_SECONDS,
        path=_own_path(op.id),
        httponly=True,
        samesite="strict",
        secure=state_of(request).secure_cookie,
    )
    return response

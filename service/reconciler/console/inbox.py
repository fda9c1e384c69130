"""The inbox: what needs a decision first, then what is at risk, counts, filters and search.

Guarantee: a bad filter is a 400 page that names the parameter and the allowed
values, never an empty list that looks like good news. An operation escalated
before says so, with its last decision. The lists refresh themselves when an
escalation opens or is decided anywhere (``stamp``, read from the database, so
every replica sees the same), leaving the filter form as the operator left it; or
the whole page every 30 s without JavaScript.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler.commands import inbox_reads
from reconciler.console import operator_text
from reconciler.console.web import operator, page, render, runtime_of
from reconciler.core import errors, risk
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason
from reconciler.storage.inbox import InboxFilter

PAGE_SIZE = 20
MAX_PAGE = 10_000
MAX_QUERY = 300
PARAMS = ("state", "provider", "reason", "q", "page", "risk_page", "all_page")


@dataclass(frozen=True)
class Query:
    filter: InboxFilter
    pages: dict[str, int]
    raw: dict[str, str]

    def link(self, **changes: Any) -> str:
        """This inbox's URL with some parameters changed (None removes one)."""
        params = {**self.raw, **{k: str(v) for k, v in changes.items() if v is not None}}
        for key, value in changes.items():
            if value is None:
                params.pop(key, None)
        return "?" + urlencode(params) if params else "?"


def _page_number(raw: str, name: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
        raise errors.InvalidRequest(f"'{name}' must be a whole number from 1 to {MAX_PAGE}")
    return int(raw)


def parse_query(params: dict[str, str], providers: set[str]) -> Query:
    """The inbox's query string, checked; every problem is an ``InvalidRequest``."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise errors.InvalidRequest(
            f"unknown parameter(s): {', '.join(unknown)}; the inbox takes {', '.join(PARAMS)}"
        )
    raw = {k: v for k, v in params.items() if v != ""}
    state = reason = None
    if "state" in raw:
        try:
            state = State(raw["state"])
        except ValueError:
            raise errors.InvalidRequest(
                f"'state' must be one of: {', '.join(s.value for s in State)}"
            ) from None
    if "reason" in raw:
        try:
            reason = EscalationReason(raw["reason"])
        except ValueError:
            raise errors.InvalidRequest(
                f"'reason' must be one of: {', '.join(r.value for r in EscalationReason)}"
            ) from None
    provider = raw.get("provider")
    if provider is not None and provider not in providers:
        known = ", ".join(sorted(providers)) or "none yet"
        raise errors.InvalidRequest(f"'provider' must be one of: {known}")
    query = raw.get("q")
    if query is not None:
        query = query.strip()
        if len(query) > MAX_QUERY or not query.isprintable():
            raise errors.InvalidRequest(
                f"'q' must be the start of an operation id, job id or trace id: at most "
                f"{MAX_QUERY} printable characters"
            )
    pages = {name: _page_number(raw[name], name) if name in raw else 1 for name in PARAMS[4:]}
    found = InboxFilter(state=state, provider=provider, reason=reason, query=query or None)
    return Query(found, pages, raw)


@page
async def inbox(request: Request) -> Response:
    who = await operator(request)
    rt = runtime_of(request)
    now = rt.clock.now()

    providers = set(rt.providers) | set(await rt.db.run(inbox_reads.providers_seen, rt.db))
    query = parse_query(dict(request.query_params), providers)
    found = await rt.db.run(
        inbox_reads.read_inbox, rt.db, query.filter, query.pages, PAGE_SIZE, now
    )
    risky = found.at_risk.items if found.at_risk is not None else []
    data = {
        "escalated": found.escalated,
        "at_risk": found.at_risk,
        "matching": found.matching,
        "counts": found.counts,
        "stamp": found.stamp,
        "repeats": {op_id: operator_text.repeat_of(esc) for op_id, esc in found.before.items()},
        # "Failing again" is judged against the reason of the operation's last escalation.
        "risks": {op.id: risk.risks(op, now, found.reasons.get(op.id)) for op in risky},
    }
    return render(
        request,
        "inbox.html",
        {
            **data,
            "query": query,
            "page_size": PAGE_SIZE,
            "states": [s.value for s in State],
            "reasons": [r.value for r in EscalationReason],
            "providers": sorted(providers),
        },
        who=who,
    )


@page
async def inbox_stamp(request: Request) -> Response:
    """A small JSON answer the inbox script polls: it changes when escalations do."""
    await operator(request)
    rt = runtime_of(request)

    return JSONResponse({"stamp": await rt.db.run(inbox_reads.stamp, rt.db)})

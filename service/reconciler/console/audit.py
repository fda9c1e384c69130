"""The audit page: the history chain check (``commands.database.audit``) run on request,
its verdict shown."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from reconciler.commands import database
from reconciler.console.web import operator, page, render, runtime_of
from reconciler.storage.audit import AuditReport


@page
async def audit_page(request: Request) -> Response:
    who = await operator(request)
    rt = runtime_of(request)

    def check() -> tuple[AuditReport, float]:
        started = time.monotonic()
        report = database.audit(rt.db, rt.journal.key)
        return report, time.monotonic() - started

    report, took = await rt.db.run(check)
    return render(request, "audit.html", {"report": report, "took": took}, who=who)

"""Every console route under ``/console``, mounted by ``reconciler.app`` next to the agent API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from reconciler.console.audit import audit_page
from reconciler.console.inbox import inbox, inbox_stamp
from reconciler.console.operation import confirm_page, decide, operation_page
from reconciler.console.providers import providers_page
from reconciler.console.signin import sign_in, sign_in_form, sign_out
from reconciler.console.web import PREFIX, page
from reconciler.core import errors


@page
async def not_found(request: Request) -> Response:
    raise errors.NotFound(f"there is no console page at {request.url.path}")


async def to_inbox(request: Request) -> Response:
    return RedirectResponse(PREFIX, status_code=308)


ROUTES: list[BaseRoute] = [
    Route(PREFIX, inbox, methods=["GET"]),
    Route(f"{PREFIX}/", to_inbox, methods=["GET"]),
    Route(f"{PREFIX}/inbox/stamp", inbox_stamp, methods=["GET"]),
    Route(f"{PREFIX}/sign-in", sign_in_form, methods=["GET"]),
    Route(f"{PREFIX}/sign-in", sign_in, methods=["POST"]),
    Route(f"{PREFIX}/sign-out", sign_out, methods=["POST"]),
    Route(f"{PREFIX}/operations/{{op_id}}", operation_page, methods=["GET"]),
    Route(f"{PREFIX}/operations/{{op_id}}/confirm", confirm_page, methods=["GET"]),
    Route(f"{PREFIX}/operations/{{op_id}}/decisions", decide, methods=["POST"]),
    Route(f"{PREFIX}/providers", providers_page, methods=["GET"]),
    Route(f"{PREFIX}/audit", audit_page, methods=["GET"]),
    Mount(f"{PREFIX}/static", StaticFiles(packages=[("reconciler.console", "static")])),
    # Last: any other console path is an HTML 404, not the agent API's JSON one.
    Route(f"{PREFIX}/{{rest:path}}", not_found, methods=["GET", "POST"]),
]

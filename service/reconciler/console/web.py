"""The console's plumbing: templates, the signed-in operator, forms, error pages, headers.

Guarantee: every console answer is an HTML page (errors too, with the status
``inbound.errors`` gives the same error), rendered with autoescaping on, sent with
a strict Content-Security-Policy and ``no-store``; a page needs a live session
of a valid operator token, re-checked on every request through the token cache
the agent API uses; a POST needs the session's CSRF token.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import jinja2
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from reconciler.console import formatting, operator_text
from reconciler.console.session import SESSION_COOKIE, Session, Signer, key_from
from reconciler.core import errors
from reconciler.core.principal import Principal
from reconciler.core.strict_json import require_field_text, visible
from reconciler.inbound.auth import session_principal
from reconciler.inbound.bodies import read_limited
from reconciler.inbound.errors import status_for
from reconciler.runtime import Runtime

log = logging.getLogger("reconciler.console")

PREFIX = "/console"
MAX_ID = 40  # the longest operation id a console URL may carry
FORM_LIMIT = 16_384
FORM_FIELDS = 20
HEADERS = {
    # Only our own stylesheet and script; no inline code, no framing, forms post here only.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

# Every value a template writes passes ``finalize``: stored text no encoder can write (a
# lone surrogate a provider sent) is shown as a visible escape rather than failing the page.
_env = jinja2.Environment(
    loader=jinja2.PackageLoader("reconciler.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=lambda value: visible(value) if type(value) is str else value,
)
formatting.install(_env)
operator_text.install(_env)
TEMPLATES = Jinja2Templates(env=_env)


@dataclass(frozen=True)
class ConsoleState:
    """What the console keeps per app: the signer, and how its cookie is set."""

    signer: Signer
    session_seconds: float
    secure_cookie: bool

    @classmethod
    def build(cls, runtime: Runtime) -> ConsoleState:
        settings = runtime.settings
        return cls(
            signer=Signer(key_from(settings, runtime.environ)),
            session_seconds=settings.console.session_hours * 3600,
            secure_cookie=urlsplit(settings.public_url()).scheme == "https",
        )


@dataclass(frozen=True)
class Operator:
    """The signed-in operator of this request."""

    principal: Principal
    session: Session
    csrf: str

    @property
    def name(self) -> str:
        return self.principal.name


class SignInNeeded(errors.AuthenticationFailed):
    """A page was asked for without a live session; ``why`` picks the sign-in page's notice."""

    def __init__(self, why: str) -> None:
        super().__init__("sign in with an operator token first")
        self.why = why


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def state_of(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


async def operator(request: Request) -> Operator:
    """The live session's operator, or ``SignInNeeded`` (no, bad, expired or revoked session)."""
    rt, console = runtime_of(request), state_of(request)
    session = console.signer.session(request.cookies.get(SESSION_COOKIE), rt.clock.now())
    if session is None:
        raise SignInNeeded("expired" if SESSION_COOKIE in request.cookies else "none")
    try:
        found = await session_principal(rt, session.token_id)
    except errors.AuthenticationFailed:
        raise SignInNeeded("revoked") from None
    if not found.is_operator or found.name != session.name:
        raise SignInNeeded("revoked")
    return Operator(found, session, console.signer.csrf(session.sid))


async def read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form; anything else is a 400 that says what was wrong."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise errors.InvalidRequest("send the form as application/x-www-form-urlencoded")
    raw = await read_limited(request, FORM_LIMIT)
    try:
        text = raw.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise errors.InvalidRequest("the form is not valid UTF-8 urlencoded data") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        require_field_text("a form field's name", key)
        require_field_text(key, value)
        if key in form:
            raise errors.InvalidRequest(f"the form field {key!r} appears more than once")
        form[key] = value
    return form


async def checked_form(request: Request) -> tuple[Operator, dict[str, str]]:
    """The operator and the form of a POST, after its CSRF token matched the session."""
    try:
        who = await operator(request)
    except SignInNeeded:
        raise errors.PermissionDenied(
            "this form needs a signed-in operator session; sign in and submit it again"
        ) from None
    form = await read_form(request)
    if not state_of(request).signer.csrf_ok(who.session.sid, form.get("csrf")):
        raise errors.PermissionDenied(
            "the form's CSRF token is missing or belongs to another session; nothing was "
            "changed. Reload the page and submit it again"
        )
    return who, form


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    who: Operator | None,
    status: int = 200,
) -> Response:
    rt = runtime_of(request)
    full = {"now": rt.clock.now(), "who": who, "prefix": PREFIX, **context}
    return TEMPLATES.TemplateResponse(request, template, full, status_code=status)


_TITLES = {400: "Bad request", 403: "Not allowed", 404: "Not found", 409: "Not possible"}
# A refusal about an existing operation (a decision already made, a bad amount): back to it.
_BACK_TO_OPERATION = frozenset({400, 403, 409, 413})


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    """An error as a page; one refused on an operation's pages links back to the operation."""
    op_id = request.path_params.get("op_id")
    back = (
        str(op_id) if status in _BACK_TO_OPERATION and op_id and len(str(op_id)) <= MAX_ID else None
    )
    return render(
        request,
        "error.html",
        {"title": title, "message": message, "operation": back},
        who=None,
        status=status,
    )


def _safe_next(request: Request) -> str:
    path = request.url.path
    query = request.url.query
    return quote(path + (f"?{query}" if query else ""), safe="")


Endpoint = Callable[[Request], Awaitable[Response]]


def page(fn: Endpoint) -> Endpoint:
    """Wrap a console endpoint: errors become pages, every answer gets the console's headers."""

    async def endpoint(request: Request) -> Response:
        try:
            response = await fn(request)
        except SignInNeeded as exc:
            target = f"{PREFIX}/sign-in?why={exc.why}&next={_safe_next(request)}"
            response = RedirectResponse(target, status_code=303)
        except errors.ReconcilerError as exc:
            status = status_for(exc)
            if isinstance(exc, errors.Bug) or status >= 500:
                log.error("console error on %s: %s", request.url.path, exc.message, exc_info=exc)
                message = "internal error; the details are in the server log"
                if not isinstance(exc, errors.Bug):
                    message = exc.message
                response = error_page(request, status, "Something went wrong", message)
            else:
                response = error_page(request, status, _TITLES.get(status, "Error"), exc.message)
        except Exception as exc:
            log.error("unexpected console error on %s", request.url.path, exc_info=exc)
            response = error_page(
                request, 500, "Something went wrong", "internal error; see the server log"
            )
        response.headers.update(HEADERS)
        return response

    endpoint.__name__ = fn.__name__
    endpoint.__doc__ = fn.__doc__
    return endpoint


def now_of(request: Request) -> datetime:
    return runtime_of(request).clock.now()

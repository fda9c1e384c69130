"""Signing in with an operator token, and out.

Guarantee: only a valid, unrevoked operator token gets a session; an agent
token, a revoked token and an unknown one are refused with a message that says
which, and get no cookie. The token itself is read once, looked up by its
digest and forgotten: it is never stored in the session, echoed or logged.
After sign-in the operator goes to ``next`` only when it resolves to a console page
(``console.return_to``), else to the inbox.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from reconciler.commands import tokens
from reconciler.console.return_to import return_to
from reconciler.console.session import SESSION_COOKIE, SIGNIN_COOKIE
from reconciler.console.web import (
    PREFIX,
    SignInNeeded,
    operator,
    page,
    read_form,
    render,
    runtime_of,
    state_of,
)
from reconciler.core import errors
from reconciler.storage.tokens import Standing

MAX_TOKEN_CHARS = 200
NOTICES = {
    "none": "",
    "expired": "Your session has ended. Sign in again.",
    "revoked": "Your session has ended: its operator token was revoked. Sign in with a valid one.",
    "signed_out": "You are signed out.",
}


def _form(request: Request, status: int, notice: str, error: str, next_url: str) -> Response:
    rt, console = runtime_of(request), state_of(request)
    cookie, nonce = console.signer.signin_nonce(rt.clock.now())
    response = render(
        request,
        "signin.html",
        {
            "notice": notice,
            "error": error,
            "next_url": next_url,
            "csrf": console.signer.csrf(nonce),
        },
        who=None,
        status=status,
    )
    response.set_cookie(
        SIGNIN_COOKIE,
        cookie,
        max_age=30 * 60,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=console.secure_cookie,
    )
    return response


@page
async def sign_in_form(request: Request) -> Response:
    params = request.query_params
    why = params.get("why", "none")
    if why not in NOTICES:
        raise errors.InvalidRequest(f"'why' must be one of: {', '.join(NOTICES)}")
    next_url = return_to(params.get("next"))
    try:
        await operator(request)
    except SignInNeeded:
        return _form(request, 200, NOTICES[why], "", next_url)
    return RedirectResponse(next_url, status_code=303)


def _refusal(found: Standing | None) -> str | None:
    if found is None:
        return "This token is not known to this service. Check that you pasted all of it."
    if found.revoked:
        return "This token was revoked. Ask for a new operator token."
    if not found.principal.is_operator:
        return (
            "This is an agent token; agent tokens cannot use the console. Sign in with an "
            "operator token (reconciler tokens create --scope operator)."
        )
    return None


@page
async def sign_in(request: Request) -> Response:
    rt, console = runtime_of(request), state_of(request)
    form = await read_form(request)
    now = rt.clock.now()
    next_url = return_to(form.get("next"))
    nonce = console.signer.signin_nonce_of(request.cookies.get(SIGNIN_COOKIE), now)
    if not console.signer.csrf_ok(nonce, form.get("csrf")):
        raise errors.PermissionDenied(
            "the sign-in form's CSRF token is missing, expired or from another browser; "
            "reload the sign-in page and try again"
        )
    token = form.get("token", "").strip()
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        return _form(request, 400, "", "Paste an operator token (it starts with rk_).", next_url)

    found = await rt.db.run(tokens.standing, rt.db, token, now)
    refusal = _refusal(found)
    if refusal is not None or found is None:
        return _form(request, 403, "", refusal or "", next_url)
    cookie, _ = console.signer.issue(
        found.token_id, found.principal.name, now, console.session_seconds
    )
    response = RedirectResponse(next_url, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(console.session_seconds),
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=console.secure_cookie,
    )
    response.delete_cookie(SIGNIN_COOKIE, path=PREFIX)
    return response


@page
async def sign_out(request: Request) -> Response:
    rt, console = runtime_of(request), state_of(request)
    form = await read_form(request)
    session = console.signer.session(request.cookies.get(SESSION_COOKIE), rt.clock.now())
    if session is not None and not console.signer.csrf_ok(session.sid, form.get("csrf")):
        raise errors.PermissionDenied(
            "the sign-out form's CSRF token does not match this session; reload and try again"
        )
    response = RedirectResponse(f"{PREFIX}/sign-in?why=signed_out", status_code=303)
    response.delete_cookie(
        SESSION_COOKIE,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=console.secure_cookie,
    )
    return response

"""A token revoked while its ``GET /v1/operations/{id}/wait`` is open ends that wait.

Before: the HTTP long-poll checked its token once, on arrival, and ran to its full
timeout after the revocation (60.1 s, answered 200 with the Operation), while the same
wait on ``/mcp`` ended about 2 s after it. Now both run under ``inbound.auth``'s one re-check
(``while_authorized``): the wait ends with a 401 that says why.

The token cache's window is what separates the revocation from its effect; the test
empties the cache (the window has passed) instead of waiting it out, and polls the
notifier to know the wait is parked before it revokes, so nothing is ordered by sleeping.
"""

from __future__ import annotations

import threading
import time

import httpx

from reconciler.storage.tokens import create_token, revoke_token
from tests.support import loopback
from tests.support.stack import Stack
from tests.support.waiting import wait_until

NEVER = {"scenario": "never_finishes", "webhooks": "never"}
# Far longer than the re-check: an answer within it can only be the revocation's.
ENDED_WITHIN = 10.0


def _parked(stack: Stack, op_id: str) -> bool:
    return op_id in stack.runtime.notifier._waiters


def test_revoking_a_token_ends_its_open_http_wait_with_a_401(stack: Stack) -> None:
    stack.runtime.token_recheck_seconds = 0.05
    with stack.runtime.db.write() as conn:
        token = create_token(conn, "agent-leaving", "agent", stack.runtime.clock.now())
    headers = {"Authorization": f"Bearer {token}"}
    created = stack.client.post(
        "/v1/operations", json={"provider": "sim", "request": NEVER}, headers=headers
    )
    assert created.status_code == 202, created.text
    op_id = created.json()["id"]
    answers: list[httpx.Response | Exception] = []

    def wait() -> None:
        try:
            answers.append(
                loopback.get(
                    f"{stack.url}/v1/operations/{op_id}/wait",
                    params={"timeout_seconds": 30},
                    headers=headers,
                    timeout=ENDED_WITHIN + 30,
                )
            )
        except httpx.HTTPError as exc:
            answers.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_until(lambda: _parked(stack, op_id), 10, "the wait to park")
    # A re-check within the cache window is a cache hit: the wait goes on.
    with stack.runtime.db.write() as conn:
        revoke_token(conn, "agent-leaving", stack.runtime.clock.now())
    stack.runtime.token_cache.clear()  # the window has passed
    revoked_at = time.monotonic()
    waiter.join(timeout=ENDED_WITHIN)
    assert answers, f"the revoked token's wait is still open {ENDED_WITHIN} s after revocation"
    answer = answers[0]
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 401, answer.text
    assert answer.headers["www-authenticate"] == "Bearer"
    error = answer.json()["error"]
    assert error["code"] == "unauthenticated"
    assert "not valid" in error["message"] and "ended while it waited" in error["message"]
    assert time.monotonic() - revoked_at < ENDED_WITHIN
    # The wait itself is gone, not left running behind the answer.
    wait_until(lambda: not _parked(stack, op_id), 5, "the revoked token's wait to end")


def test_a_wait_whose_token_stays_valid_answers_as_before(stack: Stack) -> None:
    stack.runtime.token_recheck_seconds = 0.05
    created = stack.create(NEVER)
    assert created.status_code == 202, created.text
    answer = stack.client.get(
        f"/v1/operations/{created.json()['id']}/wait",
        params={"timeout_seconds": 0.5},
        headers=stack.headers(),
    )
    assert answer.status_code == 200 and answer.json()["done"] is False
    # Rechecked about ten times over the wait: each a cache hit, none a refusal.
    missing = stack.client.get("/v1/operations/op_missing/wait", headers=stack.headers())
    assert missing.status_code == 404  # the wait's own errors pass unchanged

"""Attacks the service already refused before the matrix, pinned where the matrix needs one
test in this folder: IDOR on every route, token tricks. The rest are referenced from
``test_matrix.py`` where they already live."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconciler.storage.tokens import create_token, revoke_token
from tests.support.stack import Stack
from tests.support.waiting import wait_until


def _other_agent(stack: Stack, name: str = "agent-2") -> dict[str, str]:
    with stack.runtime.db.write() as conn:
        token = create_token(conn, name, "agent", stack.runtime.clock.now())
    return {"Authorization": f"Bearer {token}"}


def test_no_route_reaches_another_agents_operation(stack: Stack) -> None:
    op_id = stack.create({"scenario": "never_finishes", "webhooks": "never"}).json()["id"]
    other = _other_agent(stack)
    for method, path in [
        ("GET", f"/v1/operations/{op_id}"),
        ("GET", f"/v1/operations/{op_id}/wait?timeout_seconds=0"),
        ("GET", f"/v1/operations/{op_id}/history"),
        ("POST", f"/v1/operations/{op_id}/cancel"),
    ]:
        response = stack.client.request(method, path, headers=other)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["message"] == f"operation {op_id} does not exist"
    decision = stack.client.post(
        f"/v1/operations/{op_id}/decisions", json={"action": "abandon"}, headers=other
    )
    assert decision.status_code == 403  # an agent never decides, even its own
    listed = stack.client.get("/v1/operations", headers=other).json()["operations"]
    assert op_id not in {o["id"] for o in listed}
    # Reusing the owner's idempotency key makes the other agent its own operation.
    mine = stack.create({"k": 1}, idempotency_key="shared-key").json()["id"]
    theirs = stack.client.post(
        "/v1/operations",
        json={"provider": "sim", "request": {"k": 1}, "idempotency_key": "shared-key"},
        headers=other,
    )
    assert theirs.status_code == 202 and theirs.json()["id"] != mine
    assert stack.get(op_id)["state"] != "cancel_requested"


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Basic cms6eA==", "Bearer rk_notatoken", "bearer  rk_x  y", "Token rk_x"],
)
def test_token_tricks_are_401(stack: Stack, header: str) -> None:
    response = stack.client.get("/v1/operations", headers={"Authorization": header})
    assert response.status_code == 401


def test_revoked_and_expired_tokens_stop_working(stack: Stack) -> None:
    rt = stack.runtime
    expires_at = rt.clock.now() + timedelta(seconds=1)
    with rt.db.write() as conn:
        brief = create_token(conn, "brief", "agent", rt.clock.now(), expires_at)
        gone = create_token(conn, "gone", "agent", rt.clock.now())
        revoke_token(conn, "gone", rt.clock.now())
    assert (
        stack.client.get("/v1/operations", headers={"Authorization": f"Bearer {gone}"}).status_code
        == 401
    )
    good = {"Authorization": f"Bearer {brief}"}
    assert stack.client.get("/v1/operations", headers=good).status_code == 200
    # The first request once the expiry has passed is refused: it is checked on every
    # request, cached or not (a cached token would still work for CACHE_SECONDS).
    wait_until(lambda: rt.clock.now() > expires_at, 5, "the token's expiry")
    assert stack.client.get("/v1/operations", headers=good).status_code == 401

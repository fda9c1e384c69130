"""Our own PostgreSQL outage, longer than a create or cancel window, is not blamed on the provider.

The service reaches PostgreSQL through a TCP proxy that the test cuts (every
connection reset, new ones refused) and restores; the shared server itself is
never touched. Before the fix, both cases escalated (``provider_failure`` and
``cancellation_unconfirmed``) although the provider had created the job or
cancelled it: the window was checked before the read that would have told.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from tests.support.faults import TcpProxy
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.postgres

WINDOW = 4.0  # the create and cancel windows in these tests
OUTAGE = 2 * WINDOW


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, TcpProxy]]:
    parsed = sa.make_url(pg_url)
    proxy = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432))
    proxy.start()
    try:
        yield parsed.set(port=proxy.port).render_as_string(hide_password=False), proxy
    finally:
        proxy.stop()


def _poll(what: Any, timeout: float = 30) -> Any:
    return wait_until(what, timeout, "the operation's next state")


def _row(db: Database, op_id: str) -> Any:
    with db.read() as conn:
        return store.load_operation(conn, op_id)


def _causes(db: Database, op_id: str) -> list[str]:
    with db.read() as conn:
        return [e.cause for e in history_of(conn, op_id)]


def _outage(proxy: TcpProxy) -> None:
    proxy.stop()
    time.sleep(OUTAGE)  # the outage itself: longer than the window, by design
    proxy.start()


def test_a_create_window_lost_to_our_outage_is_settled_by_a_lookup(
    tmp_path: Path, pg_url: str, proxied: tuple[str, TcpProxy]
) -> None:
    url, proxy = proxied
    direct = Database(pg_url)
    provider = {"create": {"timeout_seconds": 1, "create_deadline_seconds": WINDOW}}
    try:
        with running_stack(tmp_path, url, provider=provider) as stack:
            body = {"scenario": "success", "create_fault": "delay", "create_delay": 30}
            op_id = stack.create(body).json()["id"]
            # The provider made the job; its answer is late, and our database goes away.
            _poll(lambda: stack.sim.jobs)
            _outage(proxy)
            final = _poll(lambda: (op := _row(direct, op_id)).done_at and op, timeout=60)
            causes = _causes(direct, op_id)
        assert final.state == "succeeded", (final.state, causes)
        assert final.escalation_id is None
        assert "storage_outage" in causes
        assert "lookup_confirmed_job" in causes
        assert len(stack.sim.jobs) == 1
    finally:
        direct.dispose()


def test_a_cancel_window_lost_to_our_outage_is_settled_by_a_status_read(
    tmp_path: Path, pg_url: str, proxied: tuple[str, TcpProxy]
) -> None:
    url, proxy = proxied
    direct = Database(pg_url)
    provider = {"cancel": {"cancel_deadline_seconds": WINDOW}, "polling": {"deadline_seconds": 60}}
    try:
        with running_stack(tmp_path, url, provider=provider) as stack:
            body = {"scenario": "never_finishes", "cancel": "normal", "cancel_delay": WINDOW / 2}
            op_id = stack.create(body).json()["id"]
            _poll(lambda: _row(direct, op_id).state == "observing")
            response = stack.client.post(
                f"/v1/operations/{op_id}/cancel", json={}, headers=stack.headers()
            )
            assert response.status_code == 202
            _poll(lambda: _row(direct, op_id).state == "cancelling")
            # The provider cancels during our outage; the window closes before we are back.
            _outage(proxy)
            final = _poll(lambda: (op := _row(direct, op_id)).done_at and op, timeout=60)
            causes = _causes(direct, op_id)
        assert final.state == "cancelled", (final.state, causes)
        assert final.escalation_id is None
        assert "storage_outage" in causes
    finally:
        direct.dispose()

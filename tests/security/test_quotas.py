"""Attacks on shared capacity: instant escalations, unbounded creates, hint floods, endless
history pages, tokens that never expire, metrics open to anyone."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.app import create_app
from reconciler.config import LimitSettings, ServerSettings, Settings
from reconciler.core.clock import ManualClock
from reconciler.core.errors import AuthenticationFailed, ConfigError, QuotaExceeded
from reconciler.core.quotas import IN_FLIGHT_RETRY_SECONDS, Quota, check_quota
from reconciler.core.states import State
from reconciler.runtime import Runtime
from reconciler.storage.database import Database
from reconciler.storage.tokens import authenticate, create_token
from reconciler.storage.webhook_events import IncomingEvent, Outcome, write_batch
from tests.support import loopback
from tests.support.factories import insert_operation
from tests.support.servers import serve_asgi
from tests.support.stack import Stack, running_stack

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def test_a_vanishing_deadline_is_refused(stack: Stack) -> None:
    for deadline in (1e-300, 0.5):
        response = stack.create({"report": "q3"}, deadline_seconds=deadline)
        assert response.status_code == 400, response.text
        assert "'deadline_seconds' must be at least 1" in response.json()["error"]["message"]


def test_quota_verdicts() -> None:
    quota = Quota(max_in_flight=2, max_per_minute=3)
    check_quota(quota, "a", 1, [NOW] * 2, NOW)
    with pytest.raises(QuotaExceeded, match="in flight") as caught:
        check_quota(quota, "a", 2, [], NOW)
    # When one ends is not known; a client honouring Retry-After still comes back later.
    assert caught.value.retry_after_seconds == IN_FLIGHT_RETRY_SECONDS
    recent = [NOW - timedelta(seconds=50), NOW - timedelta(seconds=20), NOW]
    with pytest.raises(QuotaExceeded, match="last minute") as caught:
        check_quota(quota, "a", 0, recent, NOW)
    assert caught.value.retry_after_seconds == 10  # when the oldest leaves the window
    check_quota(Quota(0, 0), "a", 10**6, [NOW] * 10, NOW)  # 0: no limit


@pytest.fixture
def limited(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url) as s:
        yield s


def _limits(stack: Stack, **values: Any) -> None:
    settings = stack.runtime.settings
    object.__setattr__(settings, "limits", LimitSettings(**values))


@pytest.mark.both_backends
def test_creates_beyond_the_rate_are_429_with_retry_after(limited: Stack) -> None:
    _limits(limited, max_creates_per_minute=3)
    job = {"scenario": "never_finishes", "webhooks": "never"}
    first = limited.create({**job, "i": 0}, idempotency_key="k0")
    answers = [first, *(limited.create({**job, "i": i}) for i in range(1, 4))]
    assert [a.status_code for a in answers] == [202, 202, 202, 429]
    assert 1 <= int(answers[3].headers["retry-after"]) <= 60
    assert answers[3].json()["error"]["code"] == "quota_exceeded"
    # An idempotent retry of a stored operation is not a new create: it is still answered.
    assert limited.create({**job, "i": 0}, idempotency_key="k0").status_code == 200


@pytest.mark.both_backends
def test_operations_in_flight_are_capped_per_agent(limited: Stack) -> None:
    _limits(limited, max_operations_in_flight=2, max_creates_per_minute=0)
    job = {"scenario": "never_finishes", "webhooks": "never"}
    assert [limited.create({**job, "i": i}).status_code for i in range(3)] == [202, 202, 429]
    refused = limited.create({**job, "i": 9})
    assert "in flight" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == str(IN_FLIGHT_RETRY_SECONDS)


def _event(event_id: str, job: str) -> IncomingEvent:
    return IncomingEvent("sim", event_id, job, "0" * 64, "{}", NOW)


def test_a_hint_flood_adds_one_history_entry_while_the_read_is_pending(
    db: Database, runtime: Any
) -> None:
    journal = runtime.journal
    op = insert_operation(
        db, journal, NOW, state=State.OBSERVING.value, remote_job_id="job_f", accepted_at=NOW
    )
    outcomes: list[Outcome] = []
    for batch in range(30):
        events = [_event(f"evt_{batch}_{i}", "job_f") for i in range(100)]
        with db.write() as conn:
            outcomes += write_batch(conn, journal, events, NOW)
    with db.read() as conn:
        from reconciler.storage.history import history_of

        kinds = [e.kind for e in history_of(conn, op.id)]
    assert len(outcomes) == 3000 and outcomes.count(Outcome.COALESCED) == 2900
    assert kinds.count("hint") == 1


@pytest.mark.both_backends
def test_history_is_paged_with_a_cursor(stack: Stack) -> None:
    op_id = stack.create({"scenario": "success", "duration": 0.2}).json()["id"]
    stack.wait(op_id)
    whole = stack.history(op_id)
    seen: list[int] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = stack.client.get(
            f"/v1/operations/{op_id}/history", params=params, headers=stack.headers()
        ).json()
        seen += [e["seq"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    # Every entry once, in order (the completion handler may append while we page).
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= len(whole) > 2
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"cursor": "!!"}, {"cursor": "eHl6"}):
        response = stack.client.get(
            f"/v1/operations/{op_id}/history", params=bad, headers=stack.headers()
        )
        assert response.status_code == 400, (bad, response.text)


@pytest.mark.both_backends
def test_expired_tokens_are_refused(db: Database, clock: ManualClock) -> None:
    with db.write() as conn:
        token = create_token(conn, "brief", "agent", clock.now(), clock.now() + timedelta(hours=1))
    with db.read() as conn:
        assert authenticate(conn, f"Bearer {token}", clock.now()).name == "brief"
        clock.advance(3601)
        with pytest.raises(AuthenticationFailed, match="expired"):
            authenticate(conn, f"Bearer {token}", clock.now())


def test_metrics_can_require_a_bearer_token(tmp_path: Path, db_url: str) -> None:
    settings = Settings(
        database_url=db_url,
        providers_dir=str(tmp_path),
        server=ServerSettings(metrics_token_env="RECONCILER_METRICS_TOKEN"),
    )
    with pytest.raises(ConfigError, match="RECONCILER_METRICS_TOKEN is not set"):
        Runtime.build(settings, environ={})
    runtime = Runtime.build(settings, environ={"RECONCILER_METRICS_TOKEN": "metrics-secret"})
    with serve_asgi(create_app(runtime)) as url:
        assert loopback.get(f"{url}/metrics").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert loopback.get(f"{url}/metrics", headers=wrong).status_code == 401
        right = {"Authorization": "Bearer metrics-secret"}
        response = loopback.get(f"{url}/metrics", headers=right)
        assert response.status_code == 200 and b"reconciler_stored_operations" in response.content
        assert "metrics-secret" not in response.text


def test_a_cursor_is_not_a_way_into_another_operation(stack: Stack) -> None:
    mine = stack.create({"scenario": "success", "duration": 0.2}).json()["id"]
    cursor = base64.urlsafe_b64encode(b"seq:0").decode().rstrip("=")
    other = "op_" + "0" * 26
    response = stack.client.get(
        f"/v1/operations/{other}/history", params={"cursor": cursor}, headers=stack.headers()
    )
    assert response.status_code == 404 and mine != other

"""``POST /webhooks/{provider}`` against the real service on uvicorn.

Deliveries are signed with the independent ``standardwebhooks`` package, never the
project's signer. Most tests use a small harness: a runtime on a ``ManualClock`` (so
"now" is fixed and timestamps are chosen to the second), the app without its background
worker (so only the webhook can change the operation), and one operation in
``observing`` for a known job. What follows a hint (the confirming status read, orphans
attached at create time, wake-ups, a second replica) runs the whole stack with the
simulated provider.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from standardwebhooks.webhooks import Webhook, hmac_data

from reconciler.app import create_app
from reconciler.config import Settings
from reconciler.core.clock import Clock, ManualClock, SystemClock
from reconciler.core.states import State
from reconciler.runtime import Runtime
from reconciler.storage.operations import get_operation
from reconciler.storage.tables import EVENTS, HISTORY, OPS
from tests.support import loopback
from tests.support.factories import insert_operation
from tests.support.servers import serve_asgi, unused_port
from tests.support.stack import WEBHOOK_SECRET, Stack, running_stack, sim_provider_table
from tests.support.waiting import wait_until

NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
SECRET_OLD = WEBHOOK_SECRET
SECRET_NEW = "whsec_" + base64.b64encode(b"rotated-webhook-secret-01234567").decode()
SECRET_WRONG = "whsec_" + base64.b64encode(b"somebody-elses-secret-012345678").decode()
BODY_ID_ENV = "SIMBODY_WEBHOOK_SECRETS"
JOB = "job_known_0001"
MAX_BODY = 262144  # the sim's sim.toml [webhook] max_body_bytes


# --- signing (standardwebhooks only) ------------------------------------------------------


def sign(secret: str, msg_id: str, at: datetime, body: bytes) -> str:
    return Webhook(secret).sign(msg_id, at, body.decode("utf-8"))


def sign_raw(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """A ``v1`` signature over any timestamp text and any bytes (not only UTF-8)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac_data(key, f"{msg_id}.{timestamp}.".encode() + body)
    return "v1," + base64.b64encode(mac).decode("ascii")


def signed_headers(secret: str, msg_id: str, at: datetime, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": sign(secret, msg_id, at, body),
    }


def event_body(event_id: str, job_id: str | None = JOB, state: str = "running") -> bytes:
    doc: dict[str, Any] = {"type": f"job.{state}", "id": event_id, "data": {"state": state}}
    if job_id is not None:
        doc["data"]["job_id"] = job_id
    return json.dumps(doc, separators=(",", ":")).encode()


# --- the small harness -------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    events: int
    history: int
    operation: dict[str, Any]


@dataclass
class Endpoint:
    url: str
    runtime: Runtime
    clock: Clock
    op_id: str
    client: httpx.Client

    def post(self, body: Any, headers: dict[str, str], provider: str = "sim") -> httpx.Response:
        return self.client.post(f"/webhooks/{provider}", content=body, headers=headers)

    def deliver(
        self,
        body: bytes,
        msg_id: str,
        *,
        at: datetime | None = None,
        secret: str = SECRET_OLD,
        provider: str = "sim",
    ) -> httpx.Response:
        headers = signed_headers(secret, msg_id, at or self.clock.now(), body)
        return self.post(body, headers, provider)

    def snapshot(self) -> Snapshot:
        with self.runtime.db.read() as conn:
            events = conn.execute(sa.select(sa.func.count()).select_from(EVENTS)).scalar_one()
            history = conn.execute(
                sa.select(sa.func.count())
                .select_from(HISTORY)
                .where(HISTORY.c.operation_id == self.op_id)
            ).scalar_one()
            row = conn.execute(sa.select(OPS).where(OPS.c.id == self.op_id)).mappings().one()
        return Snapshot(int(events), int(history), dict(row))

    def operation(self) -> dict[str, Any]:
        return self.snapshot().operation

    def event_row(self, event_id: str, provider: str = "sim") -> dict[str, Any] | None:
        with self.runtime.db.read() as conn:
            row = (
                conn.execute(
                    sa.select(EVENTS).where(
                        EVENTS.c.provider == provider, EVENTS.c.event_id == event_id
                    )
                )
                .mappings()
                .first()
            )
        return dict(row) if row is not None else None

    def history(self) -> list[dict[str, Any]]:
        return history_rows(self.runtime, self.op_id)

    def assert_nothing_stored(self, before: Snapshot) -> None:
        after = self.snapshot()
        assert after.events == before.events, "a webhook_events row was stored"
        assert after.history == before.history, "a history entry was appended"
        assert after.operation == before.operation, "the operation row changed"


def history_rows(runtime: Runtime, op_id: str) -> list[dict[str, Any]]:
    with runtime.db.read() as conn:
        rows = conn.execute(
            sa.select(HISTORY).where(HISTORY.c.operation_id == op_id).order_by(HISTORY.c.seq)
        ).mappings()
        return [dict(r) for r in rows]


def harness_settings(tmp_path: Path, db_url: str, **settings: Any) -> Settings:
    providers_dir = tmp_path / "no-provider-files"
    providers_dir.mkdir(exist_ok=True)
    base = f"http://127.0.0.1:{unused_port()}"  # nothing listens: no provider call may happen
    body_ids = sim_provider_table(base, webhook={"event_id": "/id", "secrets_env": BODY_ID_ENV})
    return Settings(
        database_url=db_url,
        providers_dir=str(providers_dir),
        providers={"sim": sim_provider_table(base), "simbody": body_ids},
        **settings,
    )


HARNESS_ENV = {
    "SIM_TOKEN": "unused-token",
    "SIM_WEBHOOK_SECRETS": f"{SECRET_OLD}, {SECRET_NEW}",  # rotation: both are current
    BODY_ID_ENV: SECRET_OLD,
}


@contextmanager
def open_endpoint(tmp_path: Path, db_url: str, clock: Clock) -> Iterator[Endpoint]:
    """The service (no background worker) with one operation observing ``JOB``."""
    runtime = Runtime.build(harness_settings(tmp_path, db_url), clock=clock, environ=HARNESS_ENV)
    now = clock.now()
    op = insert_operation(
        runtime.db,
        runtime.journal,
        now,
        state=State.OBSERVING.value,
        remote_job_id=JOB,
        remote_state="running",
        accepted_at=now,
        next_poll_at=now + timedelta(hours=1),
        delay_source="local_backoff",
    )
    with serve_asgi(create_app(runtime, background=False)) as url:
        client = loopback.client(base_url=url, timeout=30.0)
        try:
            yield Endpoint(url, runtime, clock, op.id, client)
        finally:
            client.close()


@pytest.fixture
def ep(tmp_path: Path, db_url: str) -> Iterator[Endpoint]:
    with open_endpoint(tmp_path, db_url, ManualClock(NOW)) as endpoint:
        yield endpoint


# --- the adversarial matrix: 401, nothing stored -----------------------------------------

Build = Callable[[Endpoint, str], tuple[bytes, dict[str, str]]]


def _valid(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body = event_body(msg_id)
    return body, signed_headers(SECRET_OLD, msg_id, ep.clock.now(), body)


def _with_signature(value: Callable[[str], str]) -> Build:
    def build(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
        body, headers = _valid(ep, msg_id)
        headers["webhook-signature"] = value(headers["webhook-signature"])
        return body, headers

    return build


def _without(header: str) -> Build:
    def build(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
        body, headers = _valid(ep, msg_id)
        del headers[header]
        return body, headers

    return build


def _at_offset(seconds: int) -> Build:
    def build(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
        body = event_body(msg_id)
        at = ep.clock.now() + timedelta(seconds=seconds)
        return body, signed_headers(SECRET_OLD, msg_id, at, body)

    return build


def _timestamp_text(text: Callable[[int], str]) -> Build:
    """A signature that is correct over the odd timestamp text, so only its shape is wrong."""

    def build(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
        body = event_body(msg_id)
        stamp = text(int(ep.clock.now().timestamp()))
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": stamp,
            "webhook-signature": sign_raw(SECRET_OLD, msg_id, stamp, body),
        }
        return body, headers

    return build


def _wrong_secret(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body = event_body(msg_id)
    return body, signed_headers(SECRET_WRONG, msg_id, ep.clock.now(), body)


def _body_byte_changed(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body, headers = _valid(ep, msg_id)
    tampered = body.replace(b"running", b"runninG", 1)  # still valid JSON: only the MAC fails
    assert len(tampered) == len(body) and tampered != body
    return tampered, headers


def _id_changed(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body, headers = _valid(ep, msg_id)
    headers["webhook-id"] = msg_id + "x"
    return body, headers


def _reserialised(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body, headers = _valid(ep, msg_id)
    same_data = json.dumps(json.loads(body), indent=2, sort_keys=True).encode()
    assert json.loads(same_data) == json.loads(body) and same_data != body
    return same_data, headers


def _unknown_scheme_only(ep: Endpoint, msg_id: str) -> tuple[bytes, dict[str, str]]:
    body, headers = _valid(ep, msg_id)
    headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v2,", 1)
    return body, headers


REJECTED: dict[str, Build] = {
    "wrong_secret": _wrong_secret,
    "body_byte_changed": _body_byte_changed,
    "id_changed": _id_changed,
    "missing_webhook_id": _without("webhook-id"),
    "missing_webhook_timestamp": _without("webhook-timestamp"),
    "missing_webhook_signature": _without("webhook-signature"),
    "signature_v1": _with_signature(lambda _: "v1"),
    "signature_v1_comma": _with_signature(lambda _: "v1,"),
    "signature_v1_a_b": _with_signature(lambda _: "v1,a,b"),
    "signature_not_base64": _with_signature(lambda _: "v1," + "!" * 43 + "="),
    "signature_truncated": _with_signature(lambda s: s[:-4]),
    "unknown_scheme_only": _unknown_scheme_only,
    "timestamp_301s_old": _at_offset(-301),
    "timestamp_301s_ahead": _at_offset(301),
    "timestamp_hello": _timestamp_text(lambda _: "hello"),
    "timestamp_fraction": _timestamp_text(lambda now: f"{now}.9"),
    "timestamp_fraction_fixed": _timestamp_text(lambda _: "1614265330.9"),
    "timestamp_negative": _timestamp_text(lambda now: f"-{now}"),
    "timestamp_30_digits": _timestamp_text(lambda now: str(now).rjust(30, "1")),
    "reserialised_json": _reserialised,
}


def check_matrix(
    ep: Endpoint, cases: Mapping[str, Callable[[], httpx.Response]], status: int, code: str
) -> None:
    """Send every case on one service; each must get ``status``/``code`` and store nothing.

    All cases run (one database for all keeps the suite fast); the failure lists each case
    that went wrong and how.
    """
    failures: list[str] = []
    for name, send in sorted(cases.items()):
        before = ep.snapshot()
        response = send()
        after = ep.snapshot()
        problems = []
        if response.status_code != status:
            problems.append(f"answered {response.status_code} {response.text[:200]}")
        elif response.json()["error"]["code"] != code:
            problems.append(f"error code {response.json()['error']['code']}")
        if after.events != before.events:
            problems.append("stored a webhook_events row")
        if after.history != before.history:
            problems.append("appended history")
        if after.operation != before.operation:
            problems.append("changed the operation row")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}")
    assert not failures, "\n".join(failures)


def test_rejected_deliveries_are_401_and_store_nothing(ep: Endpoint) -> None:
    def case(build: Build, msg_id: str) -> Callable[[], httpx.Response]:
        return lambda: ep.post(*build(ep, msg_id))

    cases = {name: case(build, f"evt_{name}") for name, build in REJECTED.items()}
    check_matrix(ep, cases, 401, "signature_invalid")


def test_the_valid_delivery_that_the_matrix_mutates_is_accepted(ep: Endpoint) -> None:
    """The control case: without the mutation the same delivery is stored and hints."""
    body, headers = _valid(ep, "evt_control")
    response = ep.post(body, headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "hinted", "event_id": "evt_control"}
    assert ep.event_row("evt_control") is not None


# --- accepted signatures -----------------------------------------------------------------


def assert_stored_and_hinted(ep: Endpoint, before: Snapshot, event_ids: list[str]) -> None:
    after = ep.snapshot()
    assert after.events == before.events + len(event_ids)
    for event_id in event_ids:
        row = ep.event_row(event_id)
        assert row is not None and row["operation_id"] == ep.op_id
    hints = [h for h in ep.history()[before.history :] if h["kind"] == "hint"]
    # Nothing reads the status here, so the first hint stays pending and the rest coalesce.
    pending = before.operation["hinted_at"] is not None
    assert [h["cause"] for h in hints] == ([] if pending else [f"webhook:{event_ids[0]}"])


def test_one_valid_signature_among_several_is_accepted(ep: Endpoint) -> None:
    msg_id = "evt_many_sigs"
    body = event_body(msg_id)
    now = ep.clock.now()
    other = sign(SECRET_WRONG, msg_id, now, body)
    valid = sign(SECRET_OLD, msg_id, now, body)
    headers = signed_headers(SECRET_OLD, msg_id, now, body)
    headers["webhook-signature"] = f"{other} v2,c29tZXRoaW5n {valid} v1,{'A' * 43}="
    before = ep.snapshot()
    response = ep.post(body, headers)
    assert response.status_code == 200, response.text
    assert_stored_and_hinted(ep, before, [msg_id])


def test_rotated_secrets_are_both_accepted(ep: Endpoint) -> None:
    before = ep.snapshot()
    old = ep.deliver(event_body("evt_old_secret"), "evt_old_secret", secret=SECRET_OLD)
    new = ep.deliver(event_body("evt_new_secret"), "evt_new_secret", secret=SECRET_NEW)
    assert (old.status_code, new.status_code) == (200, 200), (old.text, new.text)
    assert_stored_and_hinted(ep, before, ["evt_old_secret", "evt_new_secret"])


@pytest.mark.parametrize("offset", [-299, 299])
def test_timestamp_within_tolerance_is_accepted(ep: Endpoint, offset: int) -> None:
    msg_id = f"evt_offset_{offset}"
    at = ep.clock.now() + timedelta(seconds=offset)
    before = ep.snapshot()
    response = ep.deliver(event_body(msg_id), msg_id, at=at)
    assert response.status_code == 200, response.text
    assert_stored_and_hinted(ep, before, [msg_id])


# --- body size: 413, nothing stored ------------------------------------------------------


def padded_body(msg_id: str, size: int) -> bytes:
    """A valid event of exactly ``size`` bytes."""
    head = event_body(msg_id)[:-1] + b',"pad":"'
    return head + b"a" * (size - len(head) - 2) + b'"}'


def test_oversized_body_is_413(ep: Endpoint) -> None:
    body = padded_body("evt_big", MAX_BODY + 1)
    json.loads(body)
    before = ep.snapshot()
    response = ep.deliver(body, "evt_big")
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "payload_too_large"
    ep.assert_nothing_stored(before)


def test_body_at_the_limit_is_accepted(ep: Endpoint) -> None:
    body = padded_body("evt_at_limit", MAX_BODY)
    before = ep.snapshot()
    response = ep.deliver(body, "evt_at_limit")
    assert response.status_code == 200, response.text
    assert_stored_and_hinted(ep, before, ["evt_at_limit"])


def test_streamed_body_without_length_is_cut_off_at_the_limit(ep: Endpoint) -> None:
    """Chunked, no Content-Length, validly signed: only the streaming limit can refuse it."""
    body = padded_body("evt_stream", 2 * 1024 * 1024)
    headers = signed_headers(SECRET_OLD, "evt_stream", ep.clock.now(), body)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    before = ep.snapshot()
    response = ep.post(chunks(), headers)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413, response.text
    ep.assert_nothing_stored(before)


def raw_exchange(url: str, head: bytes, body: bytes, timeout: float = 5.0) -> bytes:
    """Send hand-made request bytes on one connection; return the start of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + b"\r\n")
        if body:
            sock.sendall(body)
        return sock.recv(65536)


def _head(ep: Endpoint, msg_id: str, body: bytes, framing: bytes) -> bytes:
    headers = signed_headers(SECRET_OLD, msg_id, ep.clock.now(), body)
    lines = [b"POST /webhooks/sim HTTP/1.1", b"Host: 127.0.0.1", framing]
    lines += [f"{k}: {v}".encode() for k, v in headers.items()]
    return b"\r\n".join(lines) + b"\r\n"


def test_huge_declared_length_is_413_before_the_body_arrives(ep: Endpoint) -> None:
    """Only a small part of the declared gigabyte is sent: waiting for it would time out."""
    body = event_body("evt_declared")
    before = ep.snapshot()
    # Nothing of the body is sent before the answer is read: the header alone must decide.
    answer = raw_exchange(
        ep.url, _head(ep, "evt_declared", body, b"Content-Length: 1000000000"), b""
    )
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    ep.assert_nothing_stored(before)


def test_small_declared_length_with_a_huge_chunked_body_is_refused(ep: Endpoint) -> None:
    """Content-Length: 10 in front of a chunked megabyte (the smuggling shape)."""
    body = padded_body("evt_lying", 1024 * 1024)
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(part), part)
        for part in (body[i : i + 65536] for i in range(0, len(body), 65536))
    )
    framing = b"Content-Length: 10\r\nTransfer-Encoding: chunked"
    before = ep.snapshot()
    try:
        answer = raw_exchange(ep.url, _head(ep, "evt_lying", body, framing), chunked + b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        answer = b"HTTP/1.1 400 connection closed while sending"
    # The HTTP server refuses the contradictory framing (400) or our limit cuts it off (413).
    assert answer.split(b" ", 2)[1] in (b"400", b"413"), answer[:200]
    ep.assert_nothing_stored(before)


# --- verified but unusable bodies: 400, nothing stored -----------------------------------

INVALID_BODIES: dict[str, bytes] = {
    "deep_nesting": b'{"data":{"job_id":"'
    + JOB.encode()
    + b'","x":'
    + b"[" * 200
    + b"]" * 200
    + b"}}",
    "huge_integer": b'{"data":{"job_id":"' + JOB.encode() + b'"},"n":1' + b"0" * 200 + b"}",
    "not_utf8": b'{"data":{"job_id":"' + JOB.encode() + b'","note":"\xff\xfe"}}',
    "not_json": b"job finished, trust me",
    "empty": b"",
    "nan": b'{"data":{"job_id":"' + JOB.encode() + b'"},"x":NaN}',
}


def test_validly_signed_unusable_bodies_are_400_and_store_nothing(ep: Endpoint) -> None:
    def case(name: str, body: bytes) -> Callable[[], httpx.Response]:
        msg_id = f"evt_{name}"
        stamp = str(int(ep.clock.now().timestamp()))
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": stamp,
            "webhook-signature": sign_raw(SECRET_OLD, msg_id, stamp, body),
        }
        return lambda: ep.post(body, headers)

    cases = {name: case(name, body) for name, body in INVALID_BODIES.items()}
    check_matrix(ep, cases, 400, "invalid_request")


# --- event id and job id taken from the body ("simbody": event_id = "/id") ----------------


def body_doc(**fields: Any) -> bytes:
    return json.dumps({"type": "job.running", **fields}, separators=(",", ":")).encode()


BAD_IDS: dict[str, bytes] = {
    "no_event_id": body_doc(data={"job_id": JOB}),
    "null_event_id": body_doc(id=None, data={"job_id": JOB}),
    "object_event_id": body_doc(id={"a": 1}, data={"job_id": JOB}),
    "bool_event_id": body_doc(id=True, data={"job_id": JOB}),
    "empty_event_id": body_doc(id="", data={"job_id": JOB}),
    "long_event_id": body_doc(id="e" * 301, data={"job_id": JOB}),
    "list_job_id": body_doc(id="evt_list_job", data={"job_id": [JOB]}),
    "bool_job_id": body_doc(id="evt_bool_job", data={"job_id": False}),
    "long_job_id": body_doc(id="evt_long_job", data={"job_id": "j" * 301}),
}


def test_unusable_event_or_job_ids_are_400_and_store_nothing(ep: Endpoint) -> None:
    def case(name: str, body: bytes) -> Callable[[], httpx.Response]:
        return lambda: ep.deliver(body, f"hdr_{name}", provider="simbody")

    cases = {name: case(name, body) for name, body in BAD_IDS.items()}
    check_matrix(ep, cases, 400, "invalid_request")


def test_event_id_from_the_body_is_the_dedup_key(ep: Endpoint) -> None:
    body = body_doc(id="evt_in_body", data={"job_id": JOB})
    first = ep.deliver(body, "hdr_1", provider="simbody")
    # Job ids are per provider: the operation observing JOB belongs to "sim".
    assert first.json() == {"status": "orphan", "event_id": "evt_in_body"}
    # Another delivery header id, same event id in the body: the same event.
    again = ep.deliver(body, "hdr_2", provider="simbody")
    assert again.json() == {"status": "duplicate", "event_id": "evt_in_body"}
    assert ep.event_row("hdr_1", provider="simbody") is None
    row = ep.event_row("evt_in_body", provider="simbody")
    assert row is not None and row["duplicates"] == 1


def test_event_without_a_job_id_is_kept_as_an_orphan(ep: Endpoint) -> None:
    body = body_doc(id="evt_no_job", data={"state": "running"})
    before = ep.snapshot()
    response = ep.deliver(body, "hdr_no_job", provider="simbody")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "orphan"
    row = ep.event_row("evt_no_job", provider="simbody")
    assert row is not None
    assert row["remote_job_id"] is None and row["operation_id"] is None
    after = ep.snapshot()
    assert (after.history, after.operation) == (before.history, before.operation)


# --- provider and job resolution ---------------------------------------------------------


def test_unknown_provider_is_404(ep: Endpoint) -> None:
    body = event_body("evt_nobody")
    before = ep.snapshot()
    response = ep.deliver(body, "evt_nobody", provider="nobody")
    assert response.status_code == 404, response.text
    ep.assert_nothing_stored(before)


def test_unknown_job_is_kept_as_an_orphan_without_a_hint(ep: Endpoint) -> None:
    before = ep.snapshot()
    response = ep.deliver(event_body("evt_orphan", job_id="job_unknown"), "evt_orphan")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "orphan", "event_id": "evt_orphan"}
    row = ep.event_row("evt_orphan")
    assert row is not None
    assert row["remote_job_id"] == "job_unknown" and row["operation_id"] is None
    after = ep.snapshot()
    assert after.events == before.events + 1
    assert (after.history, after.operation) == (before.history, before.operation)


# --- effects ------------------------------------------------------------------------------


def test_new_event_hints_the_observing_operation(ep: Endpoint) -> None:
    body = event_body("evt_hint")
    before = ep.snapshot()
    response = ep.deliver(body, "evt_hint")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "hinted", "event_id": "evt_hint"}
    op = ep.operation()
    assert op["hinted_at"] == NOW
    assert op["next_poll_at"] == NOW  # was an hour away
    assert op["delay_source"] == "webhook_hint"
    assert op["state"] == "observing"
    assert op["version"] == before.operation["version"] + 1
    new = ep.history()[before.history :]
    assert [(h["kind"], h["cause"], h["delay_source"]) for h in new] == [
        ("hint", "webhook:evt_hint", "webhook_hint")
    ]
    row = ep.event_row("evt_hint")
    assert row is not None
    assert row["operation_id"] == ep.op_id and row["remote_job_id"] == JOB
    assert row["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert row["body"] == body.decode()
    assert (row["duplicates"], row["conflicts"]) == (0, 0)


def test_repeated_event_id_is_acknowledged_without_effect(ep: Endpoint) -> None:
    body = event_body("evt_twice")
    assert ep.deliver(body, "evt_twice").json()["status"] == "hinted"
    after_first = ep.snapshot()
    again = ep.deliver(body, "evt_twice")
    # A provider's retry is signed afresh, with a later timestamp.
    retry = ep.deliver(body, "evt_twice", at=NOW + timedelta(seconds=30))
    for response in (again, retry):
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "duplicate", "event_id": "evt_twice"}
    ep.assert_nothing_stored(after_first)  # no row, no hint entry, row unchanged
    row = ep.event_row("evt_twice")
    assert row is not None and (row["duplicates"], row["conflicts"]) == (2, 0)


def test_same_event_id_with_another_body_is_a_conflict_without_effect(ep: Endpoint) -> None:
    first = event_body("evt_conflict", state="running")
    other = event_body("evt_conflict", state="succeeded")
    assert ep.deliver(first, "evt_conflict").json()["status"] == "hinted"
    after_first = ep.snapshot()
    response = ep.deliver(other, "evt_conflict")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "conflict", "event_id": "evt_conflict"}
    ep.assert_nothing_stored(after_first)
    row = ep.event_row("evt_conflict")
    assert row is not None
    assert (row["duplicates"], row["conflicts"]) == (0, 1)
    assert row["body"] == first.decode()  # the first body stays the record


def test_success_webhook_only_hints(ep: Endpoint) -> None:
    response = ep.deliver(event_body("evt_says_done", state="succeeded"), "evt_says_done")
    assert response.json()["status"] == "hinted"
    op = ep.operation()
    assert (op["state"], op["remote_state"], op["done_at"]) == ("observing", "running", None)
    with ep.runtime.db.read() as conn:
        stored = get_operation(conn, ep.op_id)
    assert stored is not None and stored.result is None and not op["completion_pending"]


# --- a 2xx only after the commit ----------------------------------------------------------


def test_failed_commit_is_503_and_the_retry_is_stored_once(ep: Endpoint) -> None:
    def refuse_commit(conn: sa.Connection) -> None:
        raise sa.exc.OperationalError("COMMIT", None, RuntimeError("injected commit failure"))

    body = event_body("evt_commit")
    before = ep.snapshot()
    sa.event.listen(ep.runtime.db.engine, "commit", refuse_commit)
    try:
        failed = ep.deliver(body, "evt_commit")
    finally:
        sa.event.remove(ep.runtime.db.engine, "commit", refuse_commit)
    assert failed.status_code == 503, failed.text
    assert failed.headers.get("retry-after")
    ep.assert_nothing_stored(before)
    assert ep.event_row("evt_commit") is None

    retried = ep.deliver(body, "evt_commit", at=NOW + timedelta(seconds=5))
    assert retried.status_code == 200, retried.text
    assert retried.json() == {"status": "hinted", "event_id": "evt_commit"}
    assert_stored_and_hinted(ep, before, ["evt_commit"])
    row = ep.event_row("evt_commit")
    assert row is not None and (row["duplicates"], row["conflicts"]) == (0, 0)


# --- with the whole stack: the status read confirms ----------------------------------------


def deliver_live(stack_url: str, body: bytes, msg_id: str, secret: str = WEBHOOK_SECRET) -> Any:
    headers = signed_headers(secret, msg_id, datetime.now(UTC), body)
    response = loopback.post(f"{stack_url}/webhooks/sim", content=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
    return wait_until(check, timeout, what)


def status_reads(stack: Stack, job_id: str) -> list[float]:
    job = stack.sim.jobs[job_id]
    return [r.at for r in list(job.requests["status"])]


def test_success_webhook_is_confirmed_by_a_status_read(tmp_path: Path, db_url: str) -> None:
    """``early_lie``: job.succeeded arrives 4 s before the job ends; only polling sees the end."""
    polling = {"base_delay_seconds": 0.5, "max_delay_seconds": 0.5}
    with running_stack(tmp_path, db_url, provider={"polling": polling}) as stack:
        request = {
            "scenario": "success",
            "duration": 5.0,
            "webhooks": "early_lie",
            "early_lie_lead": 4.0,
            "webhook_on_running": False,
        }
        op_id = stack.create(request).json()["id"]
        job_id = wait_for("the job id", lambda: stack.get(op_id)["remote_job_id"])
        lie = wait_for("the early success event", lambda: _stored_event(stack, job_id), 8)
        hint_seq = wait_for("the hint", lambda: _hint_seq(stack, op_id, lie["event_id"]), 5)
        read = wait_for(
            "a status read after the hint", lambda: _read_after(stack, op_id, hint_seq), 5
        )
        # The job is still running at the provider, and the operation says so.
        assert read["detail"]["remote_state"] == "running"
        assert stack.sim.jobs[job_id].state == "running", "the test missed the window"
        op = stack.get(op_id)
        assert (op["state"], op["done"]) == ("observing", False), op

        final = stack.wait(op_id, timeout=15)
        assert final["state"] == "succeeded", final
        entries = stack.history(op_id)
        done = next(e for e in entries if e["cause"] == "status_confirmed_done")
        reads = [e for e in entries if e["cause"] == "status_read" and e["seq"] < done["seq"]]
        assert reads[-1]["detail"]["remote_state"] == "succeeded"
        assert all(e["detail"].get("remote_state") == "running" for e in reads[:-1])
        assert done["seq"] > hint_seq


def _stored_event(stack: Stack, job_id: str) -> dict[str, Any] | None:
    with stack.runtime.db.read() as conn:
        row = conn.execute(sa.select(EVENTS).where(EVENTS.c.remote_job_id == job_id)).mappings()
        return next((dict(r) for r in row if '"job.succeeded"' in (r["body"] or "")), None)


def _hint_seq(stack: Stack, op_id: str, event_id: str) -> int | None:
    entries = stack.history(op_id)
    return next((e["seq"] for e in entries if e["cause"] == f"webhook:{event_id}"), None)


def _read_after(stack: Stack, op_id: str, seq: int) -> dict[str, Any] | None:
    entries = stack.history(op_id)
    return next((e for e in entries if e["cause"] == "status_read" and e["seq"] > seq), None)


# Loose on purpose (the suites share two cores): the point is "not at the next tick" (30 s)
# and "not at the next scheduled read" (60 s).
WAKE_BOUND = 3.0
SLOW_POLLING = {"base_delay_seconds": 60.0, "max_delay_seconds": 60.0, "jitter_floor": 1.0}


def test_orphan_is_attached_when_the_job_id_is_learned(tmp_path: Path, db_url: str) -> None:
    """The create answer comes 4 s late; the event for its job arrives meanwhile."""
    provider: dict[str, dict[str, Any]] = {
        "polling": SLOW_POLLING,
        "create": {"timeout_seconds": 10},
    }
    with running_stack(tmp_path, db_url, provider=provider) as stack:
        request = {
            "scenario": "never_finishes",
            "webhooks": "never",
            "create_fault": "delay",
            "create_delay": 4.0,
        }
        op_id = stack.create(request).json()["id"]
        job_id = wait_for("the job at the provider", lambda: next(iter(list(stack.sim.jobs)), None))
        answer = deliver_live(stack.url, event_body("evt_early", job_id=job_id), "evt_early")
        assert answer == {"status": "orphan", "event_id": "evt_early"}
        assert stack.get(op_id)["remote_job_id"] is None  # still waiting for the create answer
        with stack.runtime.db.read() as conn:
            row = conn.execute(sa.select(EVENTS).where(EVENTS.c.event_id == "evt_early")).one()
        assert row.operation_id is None and row.remote_job_id == job_id

        read = wait_for("the first status read", lambda: _read_after(stack, op_id, 0), 15)
        with stack.runtime.db.read() as conn:
            row = conn.execute(sa.select(EVENTS).where(EVENTS.c.event_id == "evt_early")).one()
        assert row.operation_id == op_id
        entries = stack.history(op_id)
        hint = next(e for e in entries if e["cause"] == "webhook:evt_early")
        assert hint["kind"] == "hint" and hint["detail"]["orphan"] is True
        # Attached by the accept's write, and made the hint in the same transaction: the
        # entry follows the move to observing and brings the first read forward.
        observing = next(e for e in entries if e["to"] == "observing")
        assert observing["seq"] < hint["seq"] < read["seq"]
        assert hint["delay_source"] == "webhook_hint"
        # Without the orphan the first read would be 60 s away (SLOW_POLLING).
        assert len(status_reads(stack, job_id)) == 1


# --- wake-ups -----------------------------------------------------------------------------


def _observing_job(stack: Stack) -> tuple[str, str]:
    op_id = stack.create({"scenario": "never_finishes", "webhooks": "never"}).json()["id"]
    op = stack.wait_state(op_id, {"observing"}, timeout=10)
    assert op["state"] == "observing", op
    # The claim that accepted the job must be over, or it could read the status itself.
    wait_for("the worker to let go", lambda: _lease_free(stack, op_id))
    return op_id, str(op["remote_job_id"])


def _lease_free(stack: Stack, op_id: str) -> bool:
    with stack.runtime.db.read() as conn:
        owner = conn.execute(sa.select(OPS.c.lease_owner).where(OPS.c.id == op_id)).scalar()
    return owner is None


@pytest.mark.both_backends
def test_hint_wakes_the_scheduler_at_once(tmp_path: Path, db_url: str) -> None:
    provider = {"polling": SLOW_POLLING}
    with running_stack(tmp_path, db_url, provider=provider, tick_seconds=30.0) as stack:
        op_id, job_id = _observing_job(stack)
        assert status_reads(stack, job_id) == []
        sent_at = stack.sim.now()
        answer = deliver_live(stack.url, event_body("evt_wake", job_id=job_id), "evt_wake")
        assert answer["status"] == "hinted"
        reads = wait_for("a status read", lambda: status_reads(stack, job_id), 10)
        assert reads[0] - sent_at < WAKE_BOUND, f"read {reads[0] - sent_at:.2f} s after"
        # The read the hint brought forward is the operation's first, 60 s early.
        read = wait_for("the read's record", lambda: _read_after(stack, op_id, 0))
        hint_seq = _hint_seq(stack, op_id, "evt_wake")
        assert hint_seq is not None and read["seq"] > hint_seq


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_hint_on_one_replica_wakes_another(tmp_path: Path, db_url: str) -> None:
    """The webhook goes to replica A (no scheduler); B reads the status via LISTEN/NOTIFY."""
    provider = {"polling": SLOW_POLLING}
    with running_stack(tmp_path, db_url, provider=provider, tick_seconds=30.0) as stack:
        op_id, job_id = _observing_job(stack)
        b = stack.runtime
        a = Runtime.build(b.settings, clock=SystemClock(), environ=b.environ)
        with serve_asgi(create_app(a, background=False)) as a_url:
            assert status_reads(stack, job_id) == []
            sent_at = stack.sim.now()
            answer = deliver_live(a_url, event_body("evt_cross", job_id=job_id), "evt_cross")
            assert answer["status"] == "hinted"
            reads = wait_for("a status read by replica B", lambda: status_reads(stack, job_id))
            assert reads[0] - sent_at < WAKE_BOUND, f"read {reads[0] - sent_at:.2f} s after"
        read = wait_for("the read's record", lambda: _read_after(stack, op_id, 0))
        assert read["actor"].endswith(b.worker_id)

"""Attack: one agent forging another agent's completion callback.

Each agent's callbacks are signed with its own secret, derived from the service
key and its token's salt; the independent ``standardwebhooks`` package checks it.
"""

from __future__ import annotations

import base64
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.signatures import decode_whsec, sign_standard_webhook
from reconciler.storage.database import Database
from reconciler.storage.tables import TOKENS
from reconciler.storage.tokens import (
    callback_keys,
    callback_salt,
    create_token,
    rotate_callback_salt,
)
from tests.support import forked
from tests.support.hooks import serve_receiver
from tests.support.stack import CALLBACK_SECRET, ROOT, Stack
from tests.support.waiting import wait_until

SERVICE_KEY = decode_whsec(CALLBACK_SECRET)
NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _signed(keys: list[bytes], body: bytes) -> dict[str, str]:
    now = int(datetime.now(UTC).timestamp())
    return sign_standard_webhook(keys[0], "op_x", now, body, *keys[1:])


@pytest.mark.both_backends
def test_agent_a_cannot_sign_a_callback_that_verifies_for_agent_b(db: Database) -> None:
    with db.write() as conn:
        create_token(conn, "agent-a", "agent", NOW)
        create_token(conn, "agent-b", "agent", NOW)
        keys_a = callback_keys(conn, "agent-a", SERVICE_KEY, NOW)
        keys_b = callback_keys(conn, "agent-b", SERVICE_KEY, NOW)
    assert keys_a and keys_b and keys_a[0] != keys_b[0] and SERVICE_KEY not in keys_a + keys_b
    forged = json.dumps({"type": "operation.completed", "operation": {"state": "succeeded"}})
    # A holds its own secret and signs the forgery with it: B's receiver refuses it.
    headers = _signed(keys_a, forged.encode())
    Webhook(as_whsec(keys_a[0])).verify(forged, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(as_whsec(keys_b[0])).verify(forged, headers)


@pytest.mark.both_backends
def test_secrets_are_stored_nowhere_in_clear(db: Database) -> None:
    with db.write() as conn:
        create_token(conn, "agent-a", "agent", NOW)
        (key,) = callback_keys(conn, "agent-a", SERVICE_KEY, NOW) or []
        rows = conn.execute(sa.select(TOKENS)).mappings().all()
    text = json.dumps([dict(r) for r in rows], default=str)
    for needle in (as_whsec(key), base64.b64encode(key).decode(), key.hex()):
        assert needle not in text


@pytest.mark.both_backends
def test_rotation_signs_with_both_secrets_inside_the_window_only(db: Database) -> None:
    with db.write() as conn:
        create_token(conn, "agent-a", "agent", NOW)
        (old,) = callback_keys(conn, "agent-a", SERVICE_KEY, NOW) or []
        rotate_callback_salt(conn, "agent-a", NOW, timedelta(hours=1))
        during = callback_keys(conn, "agent-a", SERVICE_KEY, NOW + timedelta(minutes=30)) or []
        after = callback_keys(conn, "agent-a", SERVICE_KEY, NOW + timedelta(hours=2)) or []
    assert len(during) == 2 and during[1] == old and during[0] != old
    assert after == during[:1]
    body = b'{"type":"operation.completed"}'
    headers = _signed(during, body)
    for secret in (old, during[0]):  # a receiver on either secret verifies the same delivery
        Webhook(as_whsec(secret)).verify(body, headers)


@pytest.mark.both_backends
def test_tokens_from_before_per_agent_secrets_keep_the_shared_one_until_rotated(
    db: Database,
) -> None:
    with db.write() as conn:
        create_token(conn, "legacy", "agent", NOW)
        conn.execute(sa.update(TOKENS).where(TOKENS.c.name == "legacy").values(callback_salt=None))
        assert callback_keys(conn, "legacy", SERVICE_KEY, NOW) == [SERVICE_KEY]
        rotate_callback_salt(conn, "legacy", NOW, timedelta(hours=1))
        keys = callback_keys(conn, "legacy", SERVICE_KEY, NOW) or []
    assert keys[1] == SERVICE_KEY and keys[0] != SERVICE_KEY


def test_the_agent_gets_its_secret_once_and_can_rotate_it(db_url: str, tmp_path: Path) -> None:
    env = {"RECONCILER_DATABASE_URL": db_url, "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return forked.run(args, {**env, "PATH": "/usr/bin:/bin"}, ROOT)

    made = cli("tokens", "create", "--name", "agent-a", "--scope", "agent")
    assert made.returncode == 0, made.stderr
    assert made.stdout.count("\n") == 1 and made.stdout.startswith("rk_")  # stdout: the token
    shown = made.stderr.split("shown only this once): ")[1].strip()
    db = Database(db_url)
    try:
        with db.read() as conn:
            salt = callback_salt(conn, "agent-a")
    finally:
        db.dispose()
    assert salt is not None and shown == as_whsec(agent_key(SERVICE_KEY, salt))
    rotated = cli("tokens", "rotate-callback-secret", "--name", "agent-a", "--window", "1h")
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.strip().startswith("whsec_") and rotated.stdout.strip() != shown
    assert "old and the new" in rotated.stderr
    operator = cli("tokens", "create", "--name", "ops", "--scope", "operator")
    assert "callback secret" not in operator.stderr


def test_a_delivered_callback_verifies_with_the_agents_own_secret_only(stack: Stack) -> None:
    with serve_receiver() as (receiver, cb_url):
        op = stack.create({"scenario": "success", "duration": 0.2}, callback_url=f"{cb_url}/cb/a")
        assert op.status_code == 202, op.text
        [delivery] = wait_until(lambda: receiver.deliveries("a"), 20, "the callback")
    event = Webhook(stack.callback_secret()).verify(delivery.body, delivery.headers)
    assert event["operation"]["id"] == op.json()["id"]
    with pytest.raises(WebhookVerificationError):  # the shared secret no longer signs it
        Webhook(CALLBACK_SECRET).verify(delivery.body, delivery.headers)

"""The complete step: each downstream step (hooks, then the agent's callback) runs once.

Hooks are the recorders of ``tests.support.hooks`` (one fsynced line per run); the
callback goes through ``httpx.MockTransport`` to a receiver that answers by script.
Signatures are checked with the independent ``standardwebhooks`` package.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from reconciler.config import HookSpec
from reconciler.core.chain import Entry
from reconciler.core.errors import ConfigError
from reconciler.core.vocabulary import HistoryKind
from reconciler.engine.hooks import load_hooks
from reconciler.storage.tokens import SALTS
from tests.support import hooks
from tests.support.statements import recording
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

CALLBACK_URL = "http://127.0.0.1:9/cb/agent"
MAX_ATTEMPTS = 3
CALLBACKS = {"max_attempts": MAX_ATTEMPTS, "base_delay_seconds": 1.0, "max_delay_seconds": 4.0}
HOOKS = (hooks.RECORD, hooks.RECORD_ASYNC, hooks.AUDIT)


class Receiver:
    """The agent's callback endpoint: records each request, answers from a script."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.script: list[httpx.Response | Exception] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.script.pop(0) if self.script else httpx.Response(204)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def events(self, secret: str) -> list[dict[str, Any]]:
        """The bodies, each after the independent library's signature with the agent's own
        secret matched the one sent.

        The package's ``verify`` also compares the timestamp with the wall clock, and
        these were signed on the test's clock: the signature is recomputed instead.
        """
        signer = Webhook(secret)
        found = []
        for r in self.requests:
            at = datetime.fromtimestamp(int(r.headers["webhook-timestamp"]), UTC)
            expected = signer.sign(r.headers["webhook-id"], at, r.content.decode())
            assert expected in r.headers["webhook-signature"].split(" ")
            found.append(json.loads(r.content))
        return found


@pytest.fixture
def hook_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(path))
    yield path


async def finished(rig: StepRig, **fields: Any) -> str:
    """An operation whose job succeeded and whose result is verified; completion is next."""
    op_id = rig.submit(**fields)
    op = await rig.step(op_id)
    rig.provider.finish(op.remote_job_id or "")
    for _ in range(2):  # the confirming status read, then the result
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
    assert op.state == "succeeded" and op.completion_pending
    return op_id


def _one_hook_rig(tmp_path: Path, db_url: str, receiver: Receiver) -> Any:
    """A rig with one recording hook and a callback to ``receiver``."""
    return step_rig(
        tmp_path,
        db_url,
        hooks=(hooks.RECORD,),
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    )


def failures(rig: StepRig, op_id: str) -> list[dict[str, Any]]:
    return [e.detail or {} for e in rig.history(op_id) if e.cause == "step_failed:callback"]


async def test_hooks_then_the_callback_run_once_each_in_order(
    tmp_path: Path, db_url: str, hook_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    async with step_rig(
        tmp_path,
        db_url,
        hooks=HOOKS,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        op = await rig.step(op_id)
        # The hooks ran in their share; the callback is handed, due now, to its host's.
        assert op.completion_pending and op.completion_lane == "cb:127.0.0.1"
        assert op.next_poll_at is not None and op.next_poll_at <= rig.clock.now()
        assert receiver.requests == [] and len(hooks.read_runs(hook_log)) == len(HOOKS)
        assert hooks.completion_steps(rig.runtime.db, op_id)["callback"]["attempts"] == 0
        with recording(monkeypatch) as ran:
            op = await rig.step(op_id)
        assert not op.completion_pending and op.next_poll_at is None
        # The agent's signing salts came with the round's rows (PostgreSQL: one statement).
        salts = [sql for sql, _ in ran if sql.startswith(SALTS.text.split(" WHERE")[0])]
        assert len(salts) == (1 if rig.runtime.db.sqlite else 0)
        assert hooks.completion_finished(rig.runtime.db, op_id)
        # Each hook once, in the configured order, with its own idempotency key.
        runs = hooks.read_runs(hook_log)
        assert [r.hook for r in runs] == list(HOOKS)
        assert [r.key for r in runs] == [hooks.hook_key(op_id, h) for h in HOOKS]
        assert {r.state for r in runs} == {"succeeded"}
        # One signed callback carrying the finished operation, with a stable webhook-id.
        [request] = receiver.requests
        [event] = receiver.events(rig.callback_secret())
        assert request.headers["webhook-id"] == op_id
        assert request.headers["content-type"] == "application/json"
        assert event["type"] == "operation.completed"
        assert event["operation"]["id"] == op_id and event["operation"]["done"] is True
        assert event["operation"]["result"]["sha256"] == rig.view(op_id)["result"]["sha256"]
        steps = hooks.completion_steps(rig.runtime.db, op_id)
        assert {n: (r["status"], r["attempts"]) for n, r in steps.items()} == {
            **{f"hook:{h}": ("done", 1) for h in HOOKS},
            "callback": ("done", 1),
        }
        # Nothing is due any more: a day of ticks runs nothing again.
        rig.advance(86_400)
        assert await rig.tick() == 0
        assert len(receiver.requests) == 1 and len(hooks.read_runs(hook_log)) == len(HOOKS)


async def test_retries_keep_the_webhook_id_and_wait_for_their_time(
    tmp_path: Path, db_url: str
) -> None:
    receiver = Receiver()
    receiver.script = [httpx.Response(500), httpx.Response(503), httpx.Response(200)]
    async with step_rig(
        tmp_path,
        db_url,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        await rig.step(op_id)
        retry_at = rig.row(op_id).next_poll_at
        assert retry_at is not None and retry_at > rig.clock.now()
        rig.clock.set(retry_at - timedelta(milliseconds=1))
        assert await rig.tick() == 0  # not before its time
        await rig.run(op_id, ["succeeded"])
        assert [r.headers["webhook-id"] for r in receiver.requests] == [op_id] * 3
        assert [f["http_status"] for f in failures(rig, op_id)] == [500, 503]
        assert rig.view(op_id)["escalation"] is None


async def test_a_retry_after_on_429_is_the_earliest_next_attempt(
    tmp_path: Path, db_url: str
) -> None:
    receiver = Receiver()
    receiver.script = [httpx.Response(429, headers={"Retry-After": "3"})]
    async with step_rig(
        tmp_path,
        db_url,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        now = rig.clock.now()
        await rig.step(op_id)
        assert rig.row(op_id).next_poll_at == now + timedelta(seconds=3)
        await rig.run(op_id, ["succeeded"])
        assert len(receiver.requests) == 2


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (httpx.Response(410), "HTTP 410"),
        (httpx.Response(302, headers={"Location": "http://169.254.169.254/"}), "redirects"),
    ],
)
async def test_a_permanent_refusal_is_not_retried_and_asks_a_person(
    tmp_path: Path, db_url: str, reply: httpx.Response, error: str
) -> None:
    receiver = Receiver()
    receiver.script = [reply]
    async with step_rig(
        tmp_path,
        db_url,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        await rig.step(op_id)
        view = rig.view(op_id)
        # The outcome stands; only the delivery needs a person.
        assert view["state"] == "succeeded" and view["done"] is True
        assert view["escalation"]["reason"] == "callback_undeliverable"
        [failure] = failures(rig, op_id)
        assert failure["http_status"] == reply.status_code and failure["gave_up"] is True
        assert error in failure["error"]
        rig.advance(86_400)
        await rig.tick()
        assert [str(r.url) for r in receiver.requests] == ["http://127.0.0.1:9/cb/agent"]
        assert all("169.254.169.254" not in str(e.detail) for e in rig.history(op_id))


async def test_exhausted_attempts_escalate_and_an_extension_redelivers(
    tmp_path: Path, db_url: str
) -> None:
    receiver = Receiver()
    receiver.script = [httpx.Response(500)] * MAX_ATTEMPTS
    async with step_rig(
        tmp_path,
        db_url,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        result = rig.view(op_id)["result"]
        for _ in range(MAX_ATTEMPTS):
            rig.advance_to_due(op_id)
            await rig.step(op_id)
        view = rig.view(op_id)
        assert view["escalation"]["reason"] == "callback_undeliverable"
        assert "extend" in {o["action"] for o in view["escalation"]["options"]}
        assert [f["gave_up"] for f in failures(rig, op_id)] == [False, False, True]
        assert view["state"] == "succeeded" and view["result"] == result

        rig.decide(op_id, {"action": "extend"})
        await rig.run(op_id, ["succeeded"])
        assert [r.headers["webhook-id"] for r in receiver.requests] == [op_id] * 4
        assert receiver.events(rig.callback_secret())[-1]["operation"]["state"] == "succeeded"
        steps = hooks.completion_steps(rig.runtime.db, op_id)
        assert (steps["callback"]["status"], steps["callback"]["attempts"]) == ("done", 1)
        assert rig.view(op_id)["escalation"]["decided"] is True


async def test_a_timed_out_callback_is_retried(tmp_path: Path, db_url: str) -> None:
    receiver = Receiver()
    receiver.script = [httpx.ReadTimeout("no answer")]
    async with step_rig(
        tmp_path,
        db_url,
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        await rig.step(op_id)
        [failure] = failures(rig, op_id)
        assert failure["gave_up"] is False and failure["http_status"] is None
        await rig.run(op_id, ["succeeded"])
        assert len(receiver.requests) == 2
        assert rig.view(op_id)["escalation"] is None


async def test_a_failing_hook_is_retried_with_the_same_key_before_the_callback(
    tmp_path: Path, db_url: str, hook_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    calls: list[str] = []

    def flaky(operation: dict[str, Any], idempotency_key: str) -> None:
        calls.append(idempotency_key)
        if len(calls) == 1:
            raise RuntimeError("downstream is down")

    monkeypatch.setattr(hooks, "flaky", flaky, raising=False)
    async with step_rig(
        tmp_path,
        db_url,
        hooks=("tests.support.hooks:flaky",),
        callbacks=CALLBACKS,
        callback_transport=httpx.MockTransport(receiver.handle),
    ) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        await rig.step(op_id)
        assert len(calls) == 1 and receiver.requests == []  # the callback waits its turn
        failed = [e for e in rig.history(op_id) if e.cause.startswith("step_failed:hook:")]
        assert failed and "RuntimeError: downstream is down" in (failed[0].detail or {})["error"]
        await rig.run(op_id, ["succeeded"])
        assert calls == [hooks.hook_key(op_id, "tests.support.hooks:flaky")] * 2
        assert len(receiver.requests) == 1


async def test_no_callback_url_means_no_callback(tmp_path: Path, db_url: str) -> None:
    receiver = Receiver()
    async with step_rig(
        tmp_path, db_url, callback_transport=httpx.MockTransport(receiver.handle)
    ) as rig:
        op_id = await finished(rig)
        await rig.step(op_id)
        assert receiver.requests == [] and hooks.completion_finished(rig.runtime.db, op_id)
        assert rig.provider.requests[-1].endpoint == "result"


async def test_a_transactional_hook_writes_in_the_commit_that_records_its_step(
    tmp_path: Path, db_url: str, hook_log: Path
) -> None:
    """Its row and its step's ``done`` are one commit; a plain hook beside it keeps its key."""
    specs = (HookSpec(target=hooks.EFFECT, transactional=True), hooks.RECORD)
    async with step_rig(tmp_path, db_url, hooks=specs) as rig:
        hooks.create_effects_table(rig.runtime.db)
        op_id = await finished(rig)
        op = await rig.step(op_id)
        assert not op.completion_pending
        key = hooks.hook_key(op_id, hooks.EFFECT)
        assert hooks.effects_by_key(rig.runtime.db) == {key: 1}
        assert hooks.finished_by_key(hook_log) == {hooks.hook_key(op_id, hooks.RECORD): 1}
        [done] = [e for e in rig.history(op_id) if e.cause == f"step_done:hook:{hooks.EFFECT}"]
        assert done.detail == {
            "step": f"hook:{hooks.EFFECT}",
            "attempt": 1,
            "idempotency_key": key,
            "transactional": True,
        }
        rig.advance(86_400)
        assert await rig.tick() == 0
        assert hooks.effects_by_key(rig.runtime.db) == {key: 1}


async def test_a_failing_transactional_hook_leaves_nothing_and_is_retried(
    tmp_path: Path, db_url: str
) -> None:
    specs = (HookSpec(target=hooks.FAILING_EFFECT, transactional=True),)
    async with step_rig(tmp_path, db_url, hooks=specs, callbacks=CALLBACKS) as rig:
        hooks.create_effects_table(rig.runtime.db)
        op_id = await finished(rig)
        op = await rig.step(op_id)
        # What it wrote before failing went with its savepoint; the failure is recorded.
        assert hooks.effects_by_key(rig.runtime.db) == {}
        assert op.completion_pending and op.next_poll_at is not None
        [failed] = [
            e for e in rig.history(op_id) if e.cause == f"step_failed:hook:{hooks.FAILING_EFFECT}"
        ]
        assert failed.detail is not None
        assert failed.detail["error"] == "RuntimeError: the downstream system said no"
        step = hooks.completion_steps(rig.runtime.db, op_id)[f"hook:{hooks.FAILING_EFFECT}"]
        assert (step["status"], step["attempts"]) == ("pending", 1)


def test_a_transactional_hook_must_be_a_plain_function() -> None:
    with pytest.raises(ConfigError, match="is async; a transactional hook must be a plain"):
        load_hooks([HookSpec(target=hooks.RECORD_ASYNC, transactional=True)], "reconciler.toml")
    with pytest.raises(ConfigError, match="listed twice"):
        load_hooks([hooks.RECORD, HookSpec(target=hooks.RECORD)], "reconciler.toml")


async def test_the_write_that_records_the_last_hook_starts_the_callback(
    tmp_path: Path, db_url: str, hook_log: Path
) -> None:
    """The callback runs in a share of its host's, apart from the hooks: the task takes a
    slot of it before it records the last hook, so that record also marks the callback
    running, and the callback goes out without a transaction of its own to start it."""
    receiver = Receiver()
    async with _one_hook_rig(tmp_path, db_url, receiver) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        db = rig.runtime.db
        writes, version = db.write_transactions, rig.row(op_id).version
        assert await rig.tick() == 1
        assert len(receiver.requests) == 1 and len(hooks.read_runs(hook_log)) == 1
        assert hooks.completion_finished(db, op_id)
        # The claim (it starts the hook), the hook's record (it starts the callback), and
        # the callback's record (it closes the round and gives the lease back).
        assert db.write_transactions - writes == 3
        # The hook's record moves the operation to the callback's share and starts the
        # callback in one change of the row, not a move and then a start.
        assert rig.row(op_id).version - version == 3
        steps = hooks.completion_steps(db, op_id)
        assert {n: (r["status"], r["attempts"]) for n, r in steps.items()} == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 1),
        }
        # Every slot went back: the hooks' and the host's shares are whole again.
        shares = rig.worker.shares
        assert shares.used("cb:127.0.0.1") == 0 and shares.used(":hooks") == 0


async def test_the_hint_to_completion_lag_is_observed_once_a_round(
    tmp_path: Path, db_url: str, hook_log: Path
) -> None:
    """The lag is observed when the round's first step starts; the callback, started
    later in a share of its own, resumes the round and observes nothing more."""
    receiver = Receiver()
    async with _one_hook_rig(tmp_path, db_url, receiver) as rig:
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        rt = rig.runtime
        with rt.db.write() as conn:
            rt.journal.write(
                conn,
                rig.row(op_id),
                now=rig.clock.now(),
                entries=[Entry(kind=HistoryKind.HINT, actor="test", cause="webhook:test")],
            )
        rig.advance(2)
        await rig.step(op_id)  # the hook: the round starts
        await rig.step(op_id)  # the callback
        assert len(receiver.requests) == 1
        [count] = [
            s.value for s in rt.metrics.lag.collect()[0].samples if s.name.endswith("_count")
        ]
        [total] = [s.value for s in rt.metrics.lag.collect()[0].samples if s.name.endswith("_sum")]
        assert (count, total) == (1, 2.0)


async def test_each_claim_starts_the_step_it_expects_in_one_statement(
    tmp_path: Path, db_url: str, hook_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move that ends an operation makes its round's rows, pending. A claim of the
    hooks' share then starts the hook, and one of the host's share the callback, each in
    the statement of the operation's own write (PostgreSQL); a round that stands otherwise
    (its rows gone, here) is read and made as before."""
    receiver = Receiver()
    async with _one_hook_rig(tmp_path, db_url, receiver) as rig:
        db = rig.runtime.db
        op_id = await finished(rig, callback_url=CALLBACK_URL)
        made = hooks.completion_steps(db, op_id)
        assert {n: (r["status"], r["attempts"]) for n, r in made.items()} == {
            f"hook:{hooks.RECORD}": ("pending", 0),
            "callback": ("pending", 0),
        }
        for share in (":hooks", "cb:127.0.0.1"):
            with recording(monkeypatch) as ran:
                op = await rig.step(op_id)
            on_steps = [sql for sql, _ in ran if "completion_steps" in sql]
            # PostgreSQL: the start and the step's record, nothing read first.
            assert len(on_steps) == (2 if not db.sqlite else 4), (share, on_steps)
        assert not op.completion_pending and len(receiver.requests) == 1
        assert len(hooks.read_runs(hook_log)) == 1
        steps = hooks.completion_steps(db, op_id)
        assert {n: (r["status"], r["attempts"]) for n, r in steps.items()} == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 1),
        }

        # A second operation whose round's rows are gone: made and read by the claim.
        other = await finished(rig, callback_url=CALLBACK_URL)
        with db.write() as conn:
            conn.exec_driver_sql(f"DELETE FROM completion_steps WHERE operation_id = '{other}'")
        await rig.step(other)
        await rig.step(other)
        steps = hooks.completion_steps(db, other)
        assert {n: (r["status"], r["attempts"]) for n, r in steps.items()} == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 1),
        }
        assert len(receiver.requests) == 2 and len(hooks.read_runs(hook_log)) == 2

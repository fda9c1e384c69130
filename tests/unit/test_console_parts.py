"""The console's pure parts: session signing and CSRF, the inbox query, URLs, the timeline,
and the words an operator reads (what stopped, decisions as sentences, repeats)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.config import ConsoleSettings, Settings, load_settings
from reconciler.console import operator_text
from reconciler.console.inbox import parse_query
from reconciler.console.operation import without_query
from reconciler.console.session import Signer, key_from
from reconciler.console.timeline import deliveries, rows
from reconciler.core.errors import ConfigError, InvalidRequest
from reconciler.core.escalation import EscalationFacts, render_message
from reconciler.core.records import EscalationRecord, HistoryRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction, EscalationReason
from reconciler.storage.completion_steps import StepRecord, StepStatus

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def test_a_session_survives_only_unaltered_and_unexpired() -> None:
    signer = Signer(b"k" * 32)
    cookie, session = signer.issue(7, "ops-1", NOW, 3600)
    assert signer.session(cookie, NOW) == session
    assert signer.session(cookie, NOW + timedelta(seconds=3601)) is None
    assert Signer(b"j" * 32).session(cookie, NOW) is None  # another replica's key
    body, _, mac = cookie.rpartition(".")
    assert signer.session(body[:-1] + "A." + mac, NOW) is None
    for junk in (None, "", ".", "x" * 5000, "é.x", "abc.def"):
        assert signer.session(junk, NOW) is None
    assert "kkkk" not in repr(signer)


def test_csrf_tokens_are_bound_to_their_session() -> None:
    signer = Signer(b"k" * 32)
    _, one = signer.issue(1, "a", NOW, 60)
    _, two = signer.issue(1, "a", NOW, 60)
    assert one.sid != two.sid
    assert signer.csrf_ok(one.sid, signer.csrf(one.sid))
    assert not signer.csrf_ok(one.sid, signer.csrf(two.sid))
    assert not signer.csrf_ok(one.sid, None)
    assert not signer.csrf_ok(None, signer.csrf(one.sid))
    cookie, nonce = signer.signin_nonce(NOW)
    assert signer.signin_nonce_of(cookie, NOW) == nonce
    assert signer.signin_nonce_of(cookie, NOW + timedelta(hours=1)) is None


def test_the_session_key_comes_from_the_environment_or_the_process() -> None:
    settings = Settings()
    shared = {"RECONCILER_CONSOLE_SECRET": "s" * 40}
    assert key_from(settings, shared) == key_from(settings, shared)
    assert key_from(settings, {}) != key_from(settings, {})
    with pytest.raises(ConfigError, match="at least 32 characters") as caught:
        key_from(settings, {"RECONCILER_CONSOLE_SECRET": "short-secret"})
    assert "short-secret" not in str(caught.value)
    renamed = settings.model_copy(update={"console": ConsoleSettings(session_secret_env="MINE")})
    assert key_from(renamed, {"MINE": "m" * 40}) != key_from(settings, shared)


def test_public_url_is_checked() -> None:
    assert load_settings(environ={}).public_url() == "http://127.0.0.1:8080"
    env = {"RECONCILER_SERVER_PUBLIC_URL": "https://ops.example/"}
    assert load_settings(environ=env).public_url() == "https://ops.example"
    with pytest.raises(ConfigError, match="server.public_url"):
        load_settings(environ={"RECONCILER_SERVER_PUBLIC_URL": "ops.example"})


def test_the_inbox_query_is_parsed_strictly() -> None:
    query = parse_query({"reason": "unknown_state", "q": " op_1 ", "page": "2"}, {"sim"})
    assert query.filter.reason is EscalationReason.UNKNOWN_STATE
    assert query.filter.query == "op_1" and query.pages["page"] == 2
    assert query.link(page=3) == "?reason=unknown_state&q=+op_1+&page=3"
    assert query.link(page=None) == "?reason=unknown_state&q=+op_1+"
    with pytest.raises(InvalidRequest, match="'provider' must be one of: sim"):
        parse_query({"provider": "other"}, {"sim"})
    assert parse_query({"state": "", "q": ""}, set()).filter == parse_query({}, set()).filter


def test_urls_lose_what_may_carry_credentials() -> None:
    assert (
        without_query("https://u:p@h.example:8443/a?sig=x#f")
        == "https://h.example:8443/a (query hidden)"
    )
    assert without_query("https://h.example/a") == "https://h.example/a"
    assert without_query("s3-key/only?x=1") == "s3-key/only"
    assert without_query(None) is None


def _message(reason: str, detail: str = "HTTP 429 3 times in a row (limit 3)") -> str:
    """The escalation message as the service writes it (``core.escalation``)."""
    facts = EscalationFacts(
        operation_id="op_1",
        provider="sim",
        reason=EscalationReason(reason),
        detail=detail,
        started_at=NOW,
        now=NOW,
        status_requests_used=3,
        max_status_requests=12,
    )
    return render_message(facts, (DecisionAction.EXTEND, DecisionAction.ABANDON))


def _escalation(
    id: int, reason: str, decision: dict[str, object] | None = None, minute: int = 0
) -> EscalationRecord:
    at = NOW + timedelta(minutes=minute)
    known = reason in {r.value for r in EscalationReason}
    message = _message(reason) if known else "External job needs a decision"
    return EscalationRecord(
        id=id,
        operation_id="op_1",
        reason=reason,
        message=message,
        options=[{"action": "extend"}, {"action": "abandon"}],
        resume_state="observing",
        created_at=at,
        decided_at=at + timedelta(minutes=1) if decision else None,
        decided_by="operator:ana" if decision else None,
        decision=decision,
    )


EXTEND = {"action": "extend", "extra_seconds": 900.0, "extra_status_requests": 4}


def test_what_stopped_and_why_in_the_operators_words() -> None:
    esc = _escalation(1, "rate_limited")
    assert operator_text.why(esc) == "HTTP 429 3 times in a row (limit 3)"
    assert operator_text.stopped(esc) == "The provider kept answering 429: too many requests."
    assert set(operator_text.REASONS) == set(EscalationReason)
    assert set(operator_text.STATES) == set(State)
    odd = _escalation(2, "brand_new_reason")
    assert operator_text.stopped(odd) == "Stopped: brand_new_reason."
    assert operator_text.why(odd) == ""
    bare = _escalation(3, "deadline_exceeded")
    bare = dataclasses.replace(bare, message=_message("deadline_exceeded", detail=""))
    assert operator_text.why(bare) == ""
    assert operator_text.summary("observing", awaiting_decision=False).startswith("Running")
    late = operator_text.summary("result_timed_out", awaiting_decision=True)
    assert late.endswith("An operator's decision is needed.")


def test_decisions_read_as_sentences() -> None:
    made = operator_text.decided(_escalation(1, "rate_limited", {**EXTEND, "note": "429s stop"}))
    assert made is not None
    assert made.sentence == (
        "extended by 15 minutes and 4 status reads — ana, 2026-12-01 10:01:00 UTC"
    )
    assert made.note == "429s stop"
    delivery = operator_text.what_was_decided(
        "callback_undeliverable",
        {"action": "extend", "extra_seconds": 60.0, "extra_status_requests": 1},
    )
    assert delivery == "delivery extended by 1 minute and 1 attempt"
    assert operator_text.what_was_decided("deadline_exceeded", {"action": "abandon"}) == (
        "abandoned"
    )
    assert operator_text.decided(_escalation(2, "rate_limited")) is None
    assert operator_text.person("operator:ana") == "ana"


def test_an_escalation_after_a_decision_is_said_to_repeat() -> None:
    first = _escalation(1, "rate_limited", EXTEND)
    second = _escalation(2, "rate_limited", EXTEND, minute=5)
    third = _escalation(3, "rate_limited", minute=10)
    assert operator_text.repeat_of([_escalation(1, "rate_limited")]) is None
    assert operator_text.repeat_of([first]) is None  # nothing open: nothing repeats
    repeat = operator_text.repeat_of([first, second, third])
    assert repeat is not None
    assert repeat.sentence == (
        "escalated again (3 times; last decision: extended by 15 minutes and 4 status reads "
        "at 2026-12-01 10:06:00 UTC by ana)"
    )
    assert repeat.tried_text("extend") == (
        "Tried 2 times before: extended by 15 minutes and 4 status reads — ana, "
        "2026-12-01 10:06:00 UTC and it stopped again the same way."
    )
    assert repeat.tried_text("abandon") == ""
    other = operator_text.repeat_of([first, _escalation(2, "deadline_exceeded")])
    assert other is not None and not other.same_reason
    assert other.tried_text("extend").startswith("Tried once before:")


def _entry(seq: int, kind: str, cause: str, at: datetime, **detail: object) -> HistoryRecord:
    return HistoryRecord(
        id=seq,
        operation_id="op_1",
        seq=seq,
        at=at,
        kind=kind,
        actor="worker:1",
        from_state=None,
        to_state=None,
        cause=cause,
        delay_source=None,
        detail=detail,
        prev_hash="",
        hash="",
    )


def test_timeline_rows_and_delivery_attempts() -> None:
    read = _entry(
        1,
        "observation",
        "status_read",
        NOW,
        http_status=200,
        remote_state="running",
        decision="wait",
        next_poll_at="2026-12-01T10:00:05+00:00",
    )
    [row] = rows([read])
    assert (row.http, row.remote_state) == ("HTTP 200", "running")
    assert row.next_poll == NOW + timedelta(seconds=5)
    failed = _entry(
        2,
        "step",
        "step_failed:callback",
        NOW,
        step="callback",
        attempt=1,
        error="HTTP 500",
        http_status=500,
        gave_up=False,
        retry_at="2026-12-01T10:00:02+00:00",
    )
    done = _entry(3, "step", "step_done:callback", NOW, step="callback", attempt=2, http_status=204)
    step = StepRecord(1, "callback", StepStatus.DONE, 2, NOW, NOW, None, None)
    [delivery] = deliveries([step], [read, failed, done])
    assert [(a.number, a.answer, a.outcome) for a in delivery.tried] == [
        (1, "HTTP 500", "failed, retry at 2026-12-01 10:00:02 UTC"),
        (2, "HTTP 204", "delivered"),
    ]

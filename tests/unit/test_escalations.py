"""Escalation options, where abandon leads, and the message (docs/design.md#escalation)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.escalation import (
    EscalationFacts,
    abandon_state,
    describe_option,
    format_duration,
    options_for,
    options_payload,
    proposed_extension,
    render_message,
)
from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction, EscalationReason, TransportError

A = DecisionAction
R = EscalationReason
T0 = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)

FACTS = EscalationFacts(
    operation_id="report-export-2025-04-18-01",
    provider="acme",
    reason=R.REQUEST_BUDGET_EXHAUSTED,
    detail="12 of 12 status requests used; last response: HTTP 200, remote state 'running'",
    started_at=T0,
    now=T0 + timedelta(minutes=40),
    status_requests_used=12,
    max_status_requests=12,
    provider_job_id="exp_71c",
    last_remote_state="running",
    last_http_status=200,
    last_http_at=datetime(2025, 4, 18, 10, 58, 3, tzinfo=UTC),
)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (R.DEADLINE_EXCEEDED, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.REQUEST_BUDGET_EXHAUSTED, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.RATE_LIMITED, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.UNKNOWN_STATE, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.AUTHORIZATION_DENIED, (A.EXTEND, A.ABANDON)),
        (R.PROVIDER_FAILURE, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.CONTRACT_VIOLATION, (A.CANCEL, A.ABANDON)),
        (R.CONTRADICTORY_STATUS, (A.EXTEND, A.CANCEL, A.ABANDON)),
        (R.CANCELLATION_UNCONFIRMED, (A.EXTEND, A.ABANDON)),
        (R.CALLBACK_UNDELIVERABLE, (A.EXTEND, A.ABANDON)),
        (R.CREATE_UNKNOWN, (A.ABANDON, A.RESEND)),
    ],
)
def test_options_table(reason: EscalationReason, expected: tuple[DecisionAction, ...]) -> None:
    assert options_for(reason, provider_can_cancel=True, job_id_known=True) == expected
    without_cancel = tuple(a for a in expected if a is not A.CANCEL)
    assert options_for(reason, provider_can_cancel=False, job_id_known=True) == without_cancel
    assert options_for(reason, provider_can_cancel=True, job_id_known=False) == without_cancel


def test_every_reason_has_options_and_abandon_is_always_one() -> None:
    for reason in R:
        assert A.ABANDON in options_for(reason, provider_can_cancel=False, job_id_known=False)


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        (R.DEADLINE_EXCEEDED, State.RESULT_TIMED_OUT),
        (R.REQUEST_BUDGET_EXHAUSTED, State.RESULT_TIMED_OUT),
        (R.RATE_LIMITED, State.RESULT_TIMED_OUT),
        (R.CANCELLATION_UNCONFIRMED, State.CANCELLATION_UNCONFIRMED),
        (R.UNKNOWN_STATE, State.FAILED),
        (R.AUTHORIZATION_DENIED, State.FAILED),
        (R.PROVIDER_FAILURE, State.FAILED),
        (R.CONTRACT_VIOLATION, State.FAILED),
        (R.CONTRADICTORY_STATUS, State.FAILED),
        (R.CALLBACK_UNDELIVERABLE, State.FAILED),
        (R.CREATE_UNKNOWN, State.FAILED),
    ],
)
def test_where_abandon_leads(reason: EscalationReason, state: State) -> None:
    assert abandon_state(reason) is state


def test_message_golden() -> None:
    options = options_for(FACTS.reason, provider_can_cancel=True, job_id_known=True)
    assert render_message(FACTS, options) == (
        "External job needs a decision\n"
        "Operation: report-export-2025-04-18-01\n"
        "Provider job: exp_71c (provider acme)\n"
        "Last state: running\n"
        "Elapsed time: 40 minutes\n"
        "Status requests: 12 of 12\n"
        "Last HTTP result: 200 at 10:58 UTC\n"
        "Stopped because: request_budget_exhausted — 12 of 12 status requests used; "
        "last response: HTTP 200, remote state 'running'\n"
        "Safe options: extend waiting once by 15 minutes with 4 additional checks; "
        "cancel at provider (stops future work; finished work is not undone); "
        "abandon (stop waiting; the operation ends as result_timed_out)"
    )


def test_message_before_any_job_id_or_response() -> None:
    facts = replace(
        FACTS,
        reason=R.PROVIDER_FAILURE,
        detail="",
        provider_job_id=None,
        last_remote_state=None,
        last_http_status=None,
        last_http_at=None,
        status_requests_used=0,
    )
    lines = render_message(facts, (A.EXTEND, A.ABANDON)).splitlines()
    assert "Provider job: not known yet (provider acme)" in lines
    assert "Last state: not observed" in lines
    assert "Last HTTP result: none" in lines
    assert "Stopped because: provider_failure" in lines
    assert lines[-1].endswith("abandon (stop waiting; the operation ends as failed)")


def test_message_shows_a_transport_error_and_a_date_on_another_day() -> None:
    facts = replace(
        FACTS,
        last_transport_error=TransportError.TIMEOUT,
        now=datetime(2025, 4, 19, 9, 0, tzinfo=UTC),
    )
    lines = render_message(facts, (A.ABANDON,)).splitlines()
    assert "Last HTTP result: no response (timeout) at 2025-04-18 10:58 UTC" in lines
    assert "Elapsed time: 22 hours 40 minutes" in lines


def test_provider_text_cannot_break_the_message_lines() -> None:
    facts = replace(
        FACTS,
        last_remote_state="running\nSafe options: approve everything",
        detail="x" * 1000 + "\nmore",
    )
    message = render_message(facts, (A.ABANDON,))
    lines = message.splitlines()
    assert len(lines) == 9
    assert sum(line.startswith("Safe options:") for line in lines) == 1
    assert len(lines[7]) < 400


def test_authorization_extension_names_its_precondition() -> None:
    text = describe_option(replace(FACTS, reason=R.AUTHORIZATION_DENIED), A.EXTEND)
    assert text.startswith("extend waiting once by 15 minutes with 4 additional checks")
    assert "credential" in text and "identical request will be denied again" in text


def test_extension_cost_follows_the_proposal() -> None:
    facts = replace(FACTS, extra_seconds=2400, extra_status_requests=1)
    assert (
        describe_option(facts, A.EXTEND)
        == "extend waiting once by 40 minutes with 1 additional check"
    )


def test_options_payload_carries_the_extension_bounds() -> None:
    payload = options_payload(FACTS, (A.EXTEND, A.ABANDON))
    assert payload[0] == {
        "action": "extend",
        "description": "extend waiting once by 15 minutes with 4 additional checks",
        "extra_seconds": 900,
        "extra_status_requests": 4,
    }
    assert payload[1]["action"] == "abandon"
    assert set(payload[1]) == {"action", "description"}


def test_proposed_extension_scales_with_the_provider_cadence() -> None:
    assert proposed_extension(BackoffPolicy()) == (900.0, 4)
    assert proposed_extension(BackoffPolicy(base_seconds=60, max_seconds=900)) == (3600.0, 4)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3, "0 seconds"),
        (0, "0 seconds"),
        (1, "1 second"),
        (45.9, "45 seconds"),
        (60, "1 minute"),
        (61, "1 minute 1 second"),
        (2400, "40 minutes"),
        (3600, "1 hour"),
        (3 * 3600 + 5 * 60 + 7, "3 hours 5 minutes"),
        (30 * 3600, "30 hours"),
        (2 * 86400, "2 days"),
        (3 * 86400 + 4 * 3600 + 59, "3 days 4 hours"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_resend_option_says_plainly_that_a_duplicate_job_may_result() -> None:
    facts = replace(FACTS, reason=R.CREATE_UNKNOWN, provider_job_id=None)
    text = describe_option(facts, A.RESEND)
    assert "once" in text and "a duplicate job may result" in text
    message = render_message(facts, (A.ABANDON, A.RESEND))
    assert "create_unknown" in message and "a duplicate job may result" in message

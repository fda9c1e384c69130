"""The pure create decisions (``reconciler.core.create``): accepted, rejected, ambiguous."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.create import (
    Accepted,
    Ambiguous,
    CreateObservation,
    Rejected,
    before_create,
    decide_create,
)
from reconciler.core.errors import InvalidObservation
from reconciler.core.poll_values import Stop
from reconciler.core.vocabulary import DelaySource, EscalationReason, TransportError

R = EscalationReason
T0 = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)

CREATE_DEADLINE = NOW + timedelta(seconds=120)
BACKOFF = BackoffPolicy()


def stop(decision: Any, reason: EscalationReason) -> Stop:
    assert isinstance(decision, Stop), decision
    assert decision.reason is reason
    return decision


def create(observation: CreateObservation, now: datetime = NOW, attempts: int = 1) -> Any:
    return decide_create(CREATE_DEADLINE, attempts, observation, now, random.Random(1), BACKOFF)


def test_create_with_a_job_id_is_accepted() -> None:
    assert create(CreateObservation(at=NOW, http_status=201, job_id="job_1")) == Accepted("job_1")


def test_a_job_id_found_after_the_create_deadline_is_still_accepted() -> None:
    late = CREATE_DEADLINE + timedelta(seconds=1)
    d = create(CreateObservation(at=late, http_status=200, job_id="job_1"), now=late)
    assert d == Accepted("job_1")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_definitive_4xx_rejects_with_the_provider_error(status: int) -> None:
    error = {"code": "bad_request", "message": "rows must be positive"}
    d = create(CreateObservation(at=NOW, http_status=status, error=error))
    assert d == Rejected(status, error)


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 200])
def test_ambiguous_create_results_retry_at_backoff(status: int) -> None:
    d = create(CreateObservation(at=NOW, http_status=status), attempts=1)
    assert isinstance(d, Ambiguous)
    assert d.source is DelaySource.LOCAL_BACKOFF
    assert 5 <= (d.retry_at - NOW).total_seconds() <= 10
    assert f"HTTP {status}" in d.detail


def test_a_create_timeout_is_ambiguous() -> None:
    d = create(CreateObservation(at=NOW, transport_error=TransportError.TIMEOUT))
    assert isinstance(d, Ambiguous)
    assert d.detail == "no response (timeout)"


def test_create_honours_retry_after() -> None:
    d = create(CreateObservation(at=NOW, http_status=429, retry_after="30"))
    assert d == Ambiguous(NOW + timedelta(seconds=30), DelaySource.PROVIDER_RETRY_AFTER, "HTTP 429")


def test_a_create_retry_past_the_deadline_waits_for_the_deadline_then_stops() -> None:
    d = create(CreateObservation(at=NOW, http_status=503, retry_after="600"))
    assert isinstance(d, Ambiguous)
    assert d.retry_at == CREATE_DEADLINE
    s = before_create(CREATE_DEADLINE, d.retry_at)
    assert s is not None and s.reason is R.PROVIDER_FAILURE
    assert before_create(CREATE_DEADLINE, NOW) is None


def test_an_ambiguous_create_after_the_deadline_stops() -> None:
    d = create(CreateObservation(at=CREATE_DEADLINE, http_status=503), now=CREATE_DEADLINE)
    s = stop(d, R.PROVIDER_FAILURE)
    assert "create deadline" in s.detail and "HTTP 503" in s.detail


def test_a_create_observation_needs_a_status_or_a_transport_error() -> None:
    with pytest.raises(InvalidObservation):
        create(CreateObservation(at=NOW))


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "\uff11\uff12", "1\u00b2"])
def test_retry_after_with_non_ascii_digits_is_invalid_not_a_crash(value: str) -> None:
    # str.isdigit() is true for these, but a header means ASCII digits only (and int()
    # raises on a superscript): found by the whole-run property.
    assert parse_retry_after(value, datetime(2025, 4, 18, tzinfo=UTC)) is None

"""Establishing the provider's job id (``create_pending`` / ``create_unknown``): pure decisions.

Guarantee: one remote job per operation. A create or lookup outcome is decided
here as a value (accepted, rejected, ambiguous, stop); the shell in
``engine.steps.create`` sends the calls and writes what is decided.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.clock import isoformat
from reconciler.core.errors import InvalidObservation
from reconciler.core.outcome_parts import (
    CREDENTIALS_REFUSED,
    LOOKUP_REJECTED,
    REQUEST_REJECTED,
    one_line,
    provider_message,
)
from reconciler.core.poll_values import Stop
from reconciler.core.vocabulary import RETRYABLE_4XX, DelaySource, EscalationReason, TransportError

# 409: the provider is still working on a request with the same idempotency key.
RETRYABLE_CREATE_4XX = RETRYABLE_4XX | {409}


@dataclass(frozen=True)
class CreateObservation:
    """Outcome of one create call or idempotency-key lookup."""

    at: datetime
    http_status: int | None = None
    transport_error: TransportError | None = None
    job_id: str | None = None
    retry_after: str | None = None
    error: Any = None  # the provider's error body, kept verbatim on rejection
    rate_limited: bool = False  # a 403 that says the rate limit is spent is not a refusal


@dataclass(frozen=True)
class Accepted:
    job_id: str


@dataclass(frozen=True)
class Rejected:
    """A definitive refusal: the operation fails with the provider's error preserved."""

    http_status: int
    error: Any

    def error_record(self, via: str) -> dict[str, Any]:
        """The operation's ``error``. A refused create is its own outcome: the provider said
        no to the request, so nothing ran and the agent must fix it
        (``request_rejected``); a refused look-up is the provider's answer about a job that
        may exist (``lookup_rejected``); a 401 or 403 refuses this service's credential, which
        no change to the request can cure (``authorization_denied``)."""
        code = REQUEST_REJECTED if via == "create" else LOOKUP_REJECTED
        if self.http_status in (401, 403):
            code = CREDENTIALS_REFUSED  # the service's credential, not the agent's request
        return {
            "code": code,
            "http_status": self.http_status,
            "provider_message": provider_message(self.error),
            "provider_error": self.error,
        }


@dataclass(frozen=True)
class Ambiguous:
    """The job may or may not exist: stay in create_unknown; look up or resend at ``retry_at``."""

    retry_at: datetime
    source: DelaySource
    detail: str


CreateDecision = Accepted | Rejected | Ambiguous | Stop


def before_create(create_deadline_at: datetime, now: datetime) -> Stop | None:
    """Checked before every create call or lookup, so a late wake cannot exceed the deadline."""
    if now >= create_deadline_at:
        return Stop(
            EscalationReason.PROVIDER_FAILURE,
            f"job id not established before the create deadline {isoformat(create_deadline_at)}",
        )
    return None


def next_try_at(
    create_deadline_at: datetime,
    attempts: int,
    now: datetime,
    rng: random.Random,
    backoff: BackoffPolicy,
) -> datetime:
    """When the next create or lookup may go out if this one leaves no answer on record.

    Written with the call's reservation, before it is sent: a call whose outcome is
    lost (a crash, a write that lost every race) still waits one backoff step, so the
    create path never turns into a tight loop. ``attempts`` counts calls made, this
    one included; the wait never passes the create deadline.
    """
    at = now + timedelta(seconds=backoff.delay(attempts, rng))
    return min(at, create_deadline_at)


def decide_create(
    create_deadline_at: datetime,
    attempts: int,
    observation: CreateObservation,
    now: datetime,
    rng: random.Random,
    backoff: BackoffPolicy,
) -> CreateDecision:
    """Decide one create/lookup outcome; ``attempts`` counts calls made, this one included.

    A job id always wins, even late: the job exists and must be tracked. A
    retry that would fall past the create deadline is scheduled at the
    deadline (a webhook for the orphan job may still resolve it meanwhile);
    ``before_create`` then stops at that wake.
    """
    obs = observation
    status = obs.http_status
    if obs.transport_error is None and status is not None:
        if 200 <= status < 300 and obs.job_id:
            return Accepted(obs.job_id)
        if 400 <= status < 500 and status not in RETRYABLE_CREATE_4XX and not obs.rate_limited:
            return Rejected(status, obs.error)
    return retry_create(
        create_deadline_at, attempts, _create_detail(obs), now, rng, backoff, obs.retry_after
    )


def retry_create(
    create_deadline_at: datetime,
    attempts: int,
    detail: str,
    now: datetime,
    rng: random.Random,
    backoff: BackoffPolicy,
    retry_after: str | None = None,
) -> Ambiguous | Stop:
    """Try again one backoff step (or the provider's ``Retry-After``) away, never past the
    create deadline; at or after it, stop."""
    if now >= create_deadline_at:
        return Stop(
            EscalationReason.PROVIDER_FAILURE,
            f"job id not established before the create deadline "
            f"{isoformat(create_deadline_at)}; last result: {detail}",
        )
    offset = timedelta(seconds=backoff.delay(attempts, rng))
    source = DelaySource.LOCAL_BACKOFF
    minimum = parse_retry_after(retry_after, now)
    if minimum is not None and minimum >= offset:
        offset, source = minimum, DelaySource.PROVIDER_RETRY_AFTER
    retry_at = create_deadline_at if offset > create_deadline_at - now else now + offset
    return Ambiguous(retry_at, source, detail)


def may_have_landed(
    http_status: int | None,
    transport_error: TransportError | None,
    maybe_delivered: bool,
    rate_limited: bool = False,
) -> bool:
    """Whether a create that gave no job id may still have made one.

    No: it never reached the provider, or the provider answered that it did not take it
    (408, 425, 429, 409, a rate-limited 403). Yes: a timeout or reset after sending, any
    5xx, a 2xx without a job id, or an answer nobody knows how to read. Where the provider takes no
    idempotency key this is what separates a safe retry from a possible duplicate job.
    """
    if not maybe_delivered or rate_limited:
        return False
    if transport_error is None and http_status is not None:
        return http_status not in RETRYABLE_CREATE_4XX
    return True


MAX_ERROR_TEXT = 1000


def body_text(data: bytes | None) -> str | None:
    """An error answer that is not JSON, as one line of text a record can keep."""
    if not data:
        return None
    return one_line(data[: MAX_ERROR_TEXT * 4].decode("utf-8", "replace"), MAX_ERROR_TEXT) or None


def _create_detail(obs: CreateObservation) -> str:
    if obs.transport_error is not None:
        return f"no response ({obs.transport_error.value})"
    if obs.http_status is None:
        raise InvalidObservation("a create observation needs an HTTP status or a transport error")
    if 200 <= obs.http_status < 300:
        return f"HTTP {obs.http_status} without a job id"
    return f"HTTP {obs.http_status}"

"""Establishing the provider's job id (``create_pending`` / ``create_unknown``): pure decisions.

Guarantee: one remote job per operation. Which call the create step makes is decided
here (``plan_create``, the one answer both the claim's ``prepare`` and the step go by),
and so is what its outcome means (accepted, rejected, ambiguous, stop, or ``Unsettled``:
a person decides); the shell in ``engine.steps.create`` sends the calls and writes what
is decided.

Where the provider takes no idempotency key (``Settling``), a create that may have made
a job is never resent on the service's own: a further attempt goes out only on evidence
kept in the history (``allows_resend``): the last attempt certainly made no job
(``RESEND_SAFE``), or an operator decided ``resend`` since (``RESEND_DECISION``). Each
piece of evidence names the attempt count it was given at, and the count goes up before
every send, so one piece of evidence allows one create, also across a crash.
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
from reconciler.core.provider_calls import CallResult, answer_words
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import (
    RETRYABLE_4XX,
    DecisionAction,
    DelaySource,
    EscalationReason,
    TransportError,
)

# 409: the provider is still working on a request with the same idempotency key.
RETRYABLE_CREATE_4XX = RETRYABLE_4XX | {409}
RESEND_SAFE = "resend_safe_at_attempt"  # in a create_response: that attempt made no job
RESEND_DECISION = f"decision:{DecisionAction.RESEND.value}"


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
    no_credential: str | None = None  # why the credential's source refused: nothing was sent


@dataclass(frozen=True)
class Accepted:
    job_id: str


@dataclass(frozen=True)
class Rejected:
    """A definitive refusal: the operation fails with the provider's error preserved."""

    http_status: int | None  # None: the credential's source refused, nothing was sent
    error: Any

    def error_record(self, via: str) -> dict[str, Any]:
        """The operation's ``error``. A refused create is its own outcome: the provider said
        no to the request, so nothing ran and the agent must fix it
        (``request_rejected``); a refused look-up is the provider's answer about a job that
        may exist (``lookup_rejected``); a 401 or 403 refuses this service's credential, which
        no change to the request can cure (``authorization_denied``)."""
        code = REQUEST_REJECTED if via == "create" else LOOKUP_REJECTED
        if self.http_status in (401, 403, None):
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


@dataclass(frozen=True)
class Unsettled:
    """A create that may have made a job, which no key dedupes and no lookup settled: it
    is not resent without a person's decision (``create_unknown``)."""

    why: str

    @property
    def detail(self) -> str:
        return (
            f"{self.why}, and the provider takes no idempotency key and no lookup settled "
            "it: it is not resent without a decision"
        )


@dataclass(frozen=True)
class Settling:
    """How a create that may have reached the provider is settled: the provider dedupes
    on our key (``keyed``), or it can be asked (``lookup``). With neither (``blind``) a
    resend may make a second job."""

    keyed: bool
    lookup: bool

    @property
    def blind(self) -> bool:
        return not self.keyed and not self.lookup


@dataclass(frozen=True)
class FirstSend:
    """The first create: it cannot have reached the provider yet (the claim may prepare it)."""


@dataclass(frozen=True)
class Resend:
    """Send the create again with the same key: the provider dedupes on it."""


@dataclass(frozen=True)
class LookUp:
    """A create may have reached the provider: ask its lookup before resending."""


@dataclass(frozen=True)
class NeedsEvidence:
    """A create may have reached a provider that takes no key: only evidence on record
    allows another (``allows_resend``); without it the lookup asks (``lookup``), or
    nothing can settle it (``Unsettled``)."""

    lookup: bool


CreatePlan = Stop | FirstSend | Resend | LookUp | NeedsEvidence


def before_create(create_deadline_at: datetime, now: datetime) -> Stop | None:
    """Checked before every create call or lookup, so a late wake cannot exceed the deadline."""
    if now >= create_deadline_at:
        return Stop(
            EscalationReason.PROVIDER_FAILURE,
            f"job id not established before the create deadline {isoformat(create_deadline_at)}",
        )
    return None


def may_have_sent(state: State, create_attempts: int) -> bool:
    """A create may already have reached the provider: in create_unknown, and also in
    create_pending after a restart with an attempt on record."""
    return state is State.CREATE_UNKNOWN or create_attempts > 0


def plan_create(op: OperationRecord, now: datetime, settling: Settling) -> CreatePlan:
    """The call the create step makes on ``op`` at ``now``: the create window's end
    (``Stop``: looked at before escalating), the first create, or for a create that may
    have landed already a look before any resend."""
    stop = before_create(op.create_deadline_at, now)
    if stop is not None:
        return stop
    if not may_have_sent(State(op.state), op.create_attempts):
        return FirstSend()
    if not settling.keyed:
        return NeedsEvidence(settling.lookup)
    return LookUp() if settling.lookup else Resend()


def allows_resend(cause: str, detail: Any, create_attempts: int) -> bool:
    """Whether the last create answer or resend decision on record (``cause``, ``detail``)
    allows one more create of a provider without a key, at ``create_attempts``."""
    if not isinstance(detail, dict):
        return False
    if cause == RESEND_DECISION:
        return bool(detail.get("create_attempts") == create_attempts)
    return bool(detail.get(RESEND_SAFE) == create_attempts)


def resend_safe(call: CallResult, settling: Settling, *, via_lookup: bool) -> bool:
    """A create answer that is evidence for the next try of a blind provider: this
    attempt made no job, so one more is safe."""
    landed = may_have_landed(
        call.http_status, call.transport_error, call.maybe_delivered, call.rate_limited
    )
    return settling.blind and not via_lookup and not landed


def unsettled(
    decision: CreateDecision,
    call: CallResult,
    state: State,
    settling: Settling,
    *,
    via_lookup: bool,
) -> Unsettled | None:
    """A person's call instead of ``decision``, for a provider without a key: a blind
    retry of a create that may have landed, or a window that closed (while a call was
    out, as between calls) on a create that may have made a job."""
    if settling.keyed:
        return None
    landed = may_have_landed(
        call.http_status, call.transport_error, call.maybe_delivered, call.rate_limited
    )
    if settling.blind and landed and isinstance(decision, Ambiguous):
        return Unsettled(_ambiguity(call))
    if (
        isinstance(decision, Stop)
        and decision.reason is EscalationReason.PROVIDER_FAILURE
        and (via_lookup or landed or state is State.CREATE_UNKNOWN)
    ):
        return Unsettled(f"{decision.detail}; the create may have made a job")
    return None


def window_unsettled(op: OperationRecord, settling: Settling, *, answered: bool) -> bool:
    """At the create window's end: a create that may have made a job, without a key,
    that no lookup answered (``answered``: one did, found or not) is a person's call
    (abandon or resend), not a provider failure."""
    return (
        not settling.keyed and may_have_sent(State(op.state), op.create_attempts) and not answered
    )


def given_back_until(
    op: OperationRecord, outage_started_at: datetime, now: datetime
) -> datetime | None:
    """The create window given back once after our own outage during it: what was left of
    it when the outage began, never past the operation's deadline; None when nothing is."""
    left = op.create_deadline_at - max(outage_started_at, op.created_at)
    until = min(now + left, op.deadline_at)
    return until if until > now else None


def create_observation(call: CallResult, job_id: str | None) -> CreateObservation:
    """A create or lookup call as the decision reads it (a refusal's body kept verbatim)."""
    error = None
    if call.http_status is not None and call.http_status >= 400:
        error = call.body if call.body is not None else body_text(call.body_bytes)
    return CreateObservation(
        at=call.sent_at,
        http_status=call.http_status,
        transport_error=call.transport_error,
        job_id=job_id,
        retry_after=call.retry_after,
        error=error,
        rate_limited=call.rate_limited,
        no_credential=call.refused if call.credential_refused else None,
    )


def unsettled_lookup(call: CallResult, problem: str | None) -> str:
    """Why a lookup settled nothing (docs/design.md#create_unknown): it is looked up again."""
    why = problem or answer_words(call)
    if not problem and call.http_status is not None:
        error = create_observation(call, None).error
        said = provider_message(error) if error is not None else None
        if said:
            why += f" ({said})"
    return f"the lookup settled nothing: {why}"


def _ambiguity(call: CallResult) -> str:
    if call.transport_error is not None:
        return (
            f"the create got no answer ({call.transport_error.value}) after it may have been sent"
        )
    return f"the create was answered HTTP {call.http_status} without a job id"


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
    if obs.no_credential is not None:
        return Rejected(None, obs.no_credential)
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

"""Which call the create step makes, and when a person decides (``reconciler.core.create``).

``plan_create`` is the one plan the claim's ``prepare`` and the step both follow: the
claim prepares exactly the first create of a window still open, never a create that may
have reached the provider already.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.create import (
    RESEND_DECISION,
    RESEND_SAFE,
    Accepted,
    Ambiguous,
    CreateDecision,
    FirstSend,
    LookUp,
    NeedsEvidence,
    Rejected,
    Resend,
    Settling,
    Unsettled,
    allows_resend,
    create_observation,
    given_back_until,
    may_have_landed,
    plan_create,
    resend_safe,
    retry_create,
    unsettled,
    unsettled_lookup,
    window_unsettled,
)
from reconciler.core.poll_values import Stop
from reconciler.core.provider_calls import CallResult
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason, TransportError
from tests.support.factories import new_operation

NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
CREATE_STATES = (State.CREATE_PENDING, State.CREATE_UNKNOWN)


def op_in(state: State = State.CREATE_PENDING, **fields: Any) -> OperationRecord:
    values: dict[str, Any] = {
        "state": state.value,
        "created_at": NOW - timedelta(minutes=1),
        "create_deadline_at": NOW + timedelta(minutes=1),
        "deadline_at": NOW + timedelta(minutes=40),
    }
    return new_operation(NOW, **{**values, **fields})


def call(**fields: Any) -> CallResult:
    return CallResult(
        **{"method": "POST", "target": "/jobs", "sent_at": NOW, "elapsed_ms": 1.0, **fields}
    )


settlings = st.builds(Settling, keyed=st.booleans(), lookup=st.booleans())
calls = st.builds(
    call,
    http_status=st.one_of(st.none(), st.sampled_from([200, 202, 400, 403, 409, 429, 500, 503])),
    transport_error=st.one_of(st.none(), st.sampled_from(list(TransportError))),
    maybe_delivered=st.booleans(),
    rate_limited=st.booleans(),
)


# --- the plan ------------------------------------------------------------------------------


@given(
    state=st.sampled_from(CREATE_STATES),
    attempts=st.integers(0, 4),
    settling=settlings,
    offset=st.integers(-120, 120),
)
def test_the_claim_prepares_exactly_the_first_create_of_an_open_window(
    state: State, attempts: int, settling: Settling, offset: int
) -> None:
    op = op_in(state, create_attempts=attempts)
    now = op.create_deadline_at + timedelta(seconds=offset)
    plan = plan_create(op, now, settling)
    first = now < op.create_deadline_at and state is State.CREATE_PENDING and attempts == 0
    assert (plan == FirstSend()) is first


@given(
    state=st.sampled_from(CREATE_STATES),
    attempts=st.integers(0, 4),
    settling=settlings,
    offset=st.integers(-120, 120),
)
def test_a_create_that_may_have_landed_is_looked_at_before_any_resend(
    state: State, attempts: int, settling: Settling, offset: int
) -> None:
    op = op_in(state, create_attempts=attempts)
    now = op.create_deadline_at + timedelta(seconds=offset)
    plan = plan_create(op, now, settling)
    if now >= op.create_deadline_at:
        assert isinstance(plan, Stop)
        assert plan.reason is EscalationReason.PROVIDER_FAILURE
        return
    maybe_sent = state is State.CREATE_UNKNOWN or attempts > 0
    if not maybe_sent:
        assert plan == FirstSend()
    elif not settling.keyed:
        # Without a key a resend may make a second job: evidence first, then the lookup.
        assert plan == NeedsEvidence(lookup=settling.lookup)
    elif settling.lookup:
        assert plan == LookUp()
    else:
        assert plan == Resend()  # the provider dedupes on the key


# --- when a person decides ---------------------------------------------------------------


def test_a_blind_retry_of_a_create_that_may_have_landed_is_a_persons_call() -> None:
    timed_out = call(http_status=None, transport_error=TransportError.TIMEOUT)
    retry = retry_create(NOW + timedelta(minutes=1), 1, "x", NOW, random.Random(1), BackoffPolicy())
    assert isinstance(retry, Ambiguous)
    blind = Settling(keyed=False, lookup=False)
    person = unsettled(retry, timed_out, State.CREATE_PENDING, blind, via_lookup=False)
    assert person == Unsettled("the create got no answer (timeout) after it may have been sent")
    assert "not resent without a decision" in person.detail
    # With a lookup the step asks it next time; with a key a resend is deduplicated.
    for other in (Settling(keyed=False, lookup=True), Settling(keyed=True, lookup=False)):
        assert unsettled(retry, timed_out, State.CREATE_PENDING, other, via_lookup=False) is None


def test_a_window_that_closes_on_a_create_that_may_have_made_a_job_is_a_persons_call() -> None:
    ended = Stop(EscalationReason.PROVIDER_FAILURE, "job id not established before ...")
    unanswered = call(http_status=503)
    no_key = Settling(keyed=False, lookup=True)
    person = unsettled(ended, unanswered, State.CREATE_PENDING, no_key, via_lookup=False)
    assert person is not None
    assert person.why == "job id not established before ...; the create may have made a job"
    # A create that certainly made none, in create_pending, is the provider's failure.
    refused = call(
        http_status=None, transport_error=TransportError.CONNECTION_REFUSED, maybe_delivered=False
    )
    assert unsettled(ended, refused, State.CREATE_PENDING, no_key, via_lookup=False) is None
    # In create_unknown an earlier attempt may have landed, whatever this call did.
    assert unsettled(ended, refused, State.CREATE_UNKNOWN, no_key, via_lookup=False) is not None


@given(
    decision=st.sampled_from(
        [
            Accepted("job_1"),
            Rejected(400, {"error": "bad"}),
            Ambiguous(NOW, DelaySource.LOCAL_BACKOFF, "x"),
            Stop(EscalationReason.PROVIDER_FAILURE, "ended"),
            Stop(EscalationReason.AUTHORIZATION_DENIED, "denied"),
        ]
    ),
    answer=calls,
    state=st.sampled_from(CREATE_STATES),
    settling=settlings,
    via_lookup=st.booleans(),
)
def test_only_a_create_without_a_key_that_may_have_made_a_job_waits_for_a_person(
    decision: CreateDecision,
    answer: CallResult,
    state: State,
    settling: Settling,
    via_lookup: bool,
) -> None:
    person = unsettled(decision, answer, state, settling, via_lookup=via_lookup)
    if person is None:
        return
    assert not settling.keyed, "a key dedupes a resend: never a person's call"
    assert isinstance(decision, Ambiguous | Stop), "an answer that settled it stands"
    landed = may_have_landed(
        answer.http_status, answer.transport_error, answer.maybe_delivered, answer.rate_limited
    )
    if isinstance(decision, Ambiguous):
        assert settling.blind and landed
    else:
        assert decision.reason is EscalationReason.PROVIDER_FAILURE
        assert via_lookup or landed or state is State.CREATE_UNKNOWN


@given(state=st.sampled_from(CREATE_STATES), attempts=st.integers(0, 3), settling=settlings)
def test_at_the_window_end_an_answered_lookup_settles_the_question(
    state: State, attempts: int, settling: Settling
) -> None:
    op = op_in(state, create_attempts=attempts)
    assert not window_unsettled(op, settling, answered=True)
    maybe_sent = state is State.CREATE_UNKNOWN or attempts > 0
    assert window_unsettled(op, settling, answered=False) is (maybe_sent and not settling.keyed)


# --- evidence for one more create ---------------------------------------------------------


@given(answer=calls, settling=settlings, via_lookup=st.booleans())
def test_an_attempt_is_evidence_for_a_resend_only_when_it_made_no_job(
    answer: CallResult, settling: Settling, via_lookup: bool
) -> None:
    safe = resend_safe(answer, settling, via_lookup=via_lookup)
    landed = may_have_landed(
        answer.http_status, answer.transport_error, answer.maybe_delivered, answer.rate_limited
    )
    assert safe is (settling.blind and not via_lookup and not landed)


@given(at=st.integers(0, 5), now=st.integers(0, 5))
def test_one_piece_of_evidence_allows_the_one_create_it_names(at: int, now: int) -> None:
    assert allows_resend("create_response", {RESEND_SAFE: at}, now) is (at == now)
    assert allows_resend(RESEND_DECISION, {"create_attempts": at}, now) is (at == now)
    # Each cause reads its own mark only; a detail that is no object allows nothing.
    assert not allows_resend("create_response", {"create_attempts": now}, now)
    assert not allows_resend(RESEND_DECISION, {RESEND_SAFE: now}, now)
    assert not allows_resend("create_response", None, now)


# --- the window given back ---------------------------------------------------------------


@given(
    started=st.integers(-300, 120),
    now_after=st.integers(0, 3600),
    deadline_after=st.integers(0, 3600),
)
def test_the_window_given_back_is_what_was_left_never_past_the_deadline(
    started: int, now_after: int, deadline_after: int
) -> None:
    op = op_in(deadline_at=NOW + timedelta(seconds=deadline_after))
    outage_started = op.created_at + timedelta(seconds=started)
    now = op.create_deadline_at + timedelta(seconds=now_after)
    until = given_back_until(op, outage_started, now)
    left = op.create_deadline_at - max(outage_started, op.created_at)
    if until is None:
        assert min(now + left, op.deadline_at) <= now
        return
    assert now < until <= op.deadline_at
    assert until - now <= left


# --- what a call says -----------------------------------------------------------------------


def test_a_refused_creates_body_is_kept_verbatim_and_a_lookup_says_why_it_settled_nothing() -> None:
    refused = call(http_status=400, body={"error": {"message": "bad"}})
    assert create_observation(refused, None).error == {"error": {"message": "bad"}}
    assert create_observation(call(http_status=201, body={}), "j").error is None
    assert create_observation(call(http_status=502, body_bytes=b"Bad gateway\n"), None).error == (
        "Bad gateway"
    )
    assert unsettled_lookup(call(http_status=500), None) == "the lookup settled nothing: HTTP 500"
    assert unsettled_lookup(call(refused="job id"), None).endswith("not sent (job id)")
    assert unsettled_lookup(call(http_status=200), "a list not read to its end").endswith(
        "a list not read to its end"
    )

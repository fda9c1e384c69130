"""What one result fetch means (``result_collecting``): retry, unavailable, invalid or verified.

Guarantee: success is declared only for a result that was fetched and
validated (required fields; content type, size and checksum where the
provider gives them). Pure: the fetch's outcome and the record's counters in,
a decision out; ``engine.steps.collect`` sends the fetch and writes it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import Any

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.provider_calls import CallResult, ResultCheck, answer_words
from reconciler.core.states import State
from reconciler.core.vocabulary import RETRYABLE_4XX, RemoteCategory

INLINE_RESULT_BYTES = 65_536
MAX_FAILED_ITEMS = 50


@dataclass(frozen=True)
class RetryFetch:
    """A failure a later fetch may cure, within the failure budget: fetch again after a delay."""

    delay_seconds: float


@dataclass(frozen=True)
class Unavailable:
    """The result could not be fetched (refused, or failures past the budget)."""

    error: dict[str, Any]


@dataclass(frozen=True)
class Invalid:
    """The result arrived and failed validation."""

    error: dict[str, Any]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Verified:
    """The result is valid: the operation ends in ``state`` with ``record`` as its result."""

    state: State
    record: dict[str, Any]


@dataclass(frozen=True)
class Denied:
    """The provider refused this service's credential for the fetch (a fresh one did not
    cure it), or its source refused: a person decides (``authorization_denied``)."""

    detail: str


CollectDecision = RetryFetch | Unavailable | Invalid | Verified | Denied


class CollectPlan(Enum):
    """What the collect step does with a confirmed success: the one answer both the claim's
    ``prepare`` (which counts a fetch ahead only for ``FETCH``) and the step go by."""

    SUCCEED = "succeed"  # the provider file names no result: the confirmed status is it
    FETCH = "fetch"
    NO_JOB_ID = "no_job_id"  # nothing to fetch from: a state no transition leaves one in


def plan_collect(has_result: bool, remote_job_id: str | None) -> CollectPlan:
    """Fetch the result, unless the provider file names none (``has_result``)."""
    if not has_result:
        return CollectPlan.SUCCEED
    return CollectPlan.FETCH if remote_job_id is not None else CollectPlan.NO_JOB_ID


def retryable(call: CallResult) -> bool:
    """A network failure, a 5xx, a "not now" 4xx or a rate-limited 403: worth another fetch."""
    if call.transport_error is not None or call.rate_limited:
        return True
    status = call.http_status
    return status is not None and (status >= 500 or status in RETRYABLE_4XX)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def result_record(check: ResultCheck, ref: str | None, call: CallResult) -> dict[str, Any]:
    """What the operation keeps of a valid result: a reference, digest, size and summary."""
    record: dict[str, Any] = {
        "ref": ref,
        "sha256": check.sha256,
        "size": check.size if check.size is not None else len(call.body_bytes or b""),
        "content_type": call.content_type,
        "summary": check.summary or None,
    }
    if check.failed_items:
        total = len(check.failed_items) if check.failed_total is None else check.failed_total
        record["failed_items"] = list(check.failed_items[:MAX_FAILED_ITEMS])
        record["failed_items_truncated"] = total > MAX_FAILED_ITEMS
    if record["size"] is not None and record["size"] <= INLINE_RESULT_BYTES:
        record["data"] = check.document
    return record


def decide_collect(
    call: CallResult,
    check: ResultCheck | None,
    *,
    ref: str | None,
    category: RemoteCategory,
    attempts: int,
    max_failures: int,
    detail: dict[str, Any],
    backoff: BackoffPolicy,
    rng: random.Random,
) -> CollectDecision:
    """Decide one fetch; ``attempts`` counts fetches made, this one included.

    ``check`` is the validation of an answered fetch (None when it was not answered
    with a 2xx); ``detail`` is the call's history detail, kept in the error.
    """
    if call.denied:
        said = answer_words(call)
        return Denied(f"the result fetch was refused for this service's credential ({said})")
    if call.refused is None and retryable(call) and attempts < max_failures:
        # The provider's Retry-After (also retry-after-ms, a reset header) is a minimum.
        asked = parse_retry_after(call.retry_after, call.sent_at)
        wait = backoff.delay(attempts, rng)
        return RetryFetch(max(wait, asked.total_seconds()) if asked is not None else wait)
    if call.refused is not None or not call.ok or check is None:
        return Unavailable({"code": "result_unavailable", "detail": detail, "attempts": attempts})
    if not check.ok:
        problems = tuple(check.problems)
        return Invalid({"code": "result_invalid", "problems": list(problems)}, problems)
    record = result_record(check, ref, call)
    failed = _count(check.summary.get("failed")) if check.summary else None
    partial = category is RemoteCategory.PARTIAL or bool(failed) or bool(check.failed_items)
    return Verified(State.COMPLETED_WITH_ERRORS if partial else State.SUCCEEDED, record)

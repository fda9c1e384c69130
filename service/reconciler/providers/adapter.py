"""The adapter protocol, the typed result of one provider call, and the views read from it.

An adapter never raises for network trouble: every call returns a ``CallResult``
that says what happened (an HTTP answer, a transport error, or a refusal to
send). Reading meaning out of a body is done by the pure functions below
(value in, view out), with the provider file's pointers, so the poller, the
create reconciliation and the completion handler share one reading and tests
need no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from reconciler.core.cancel import CancelAnswer, cancel_answer
from reconciler.core.provider_calls import CallResult
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import RemoteCategory
from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.spec import AnswerRule, LookupSpec, ProviderSpec, ResultSpec
from reconciler.providers.state_table import state_word

MAX_JOB_ID_CHARS = 300  # operations.remote_job_id
_ENDED_WITH_RESULT = (RemoteCategory.SUCCESS, RemoteCategory.PARTIAL)


@dataclass(frozen=True, slots=True)
class Subject:
    """What a call is about: the values a provider file's templates may use.

    ``idempotency_key`` is the operation's own token (``idem_…``), never the agent's key:
    the provider sees one key per operation, whoever started it.
    """

    operation_id: str
    idempotency_key: str
    trace_id: str
    job_id: str | None = None

    @classmethod
    def of(cls, op: OperationRecord) -> Subject:
        return cls(op.id, op.idempotency_token, op.trace_id, op.remote_job_id)


@dataclass(frozen=True)
class CreateOutcome:
    call: CallResult
    job_id: str | None = None
    job_id_problem: str | None = None  # why a 2xx answer gave no usable job ID
    remote_state: str | None = None
    category: RemoteCategory | None = None  # None when create.state is not configured
    duplicate: bool = False  # the answer is create.duplicate: this key already made a job


class LookupVerdict(StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"  # no usable answer: transport error, 5xx, bad body


@dataclass(frozen=True)
class LookupOutcome:
    call: CallResult
    verdict: LookupVerdict
    job_id: str | None = None
    job_id_problem: str | None = None


@dataclass(frozen=True)
class StatusView:
    """What a status body says, raw values as the provider sent them.

    Hints (``poll_after``, ``next_check_at``, ``expires_at``) are not validated
    here: the poller owns what counts as a usable hint. ``missing_required``
    lists what a success or partial body lacks (``result_ref`` and
    ``status.required``); it is empty for every other category.
    """

    remote_state: str | None
    category: RemoteCategory
    rule: int | None = None
    job_id: str | None = None
    job_id_matches: bool | None = None  # None when status.job_id is not configured
    poll_after: Any = None
    next_check_at: Any = None
    expires_at: Any = None
    error: Any = None
    progress: Any = None
    result_ref: Any = None
    errors_ref: Any = None
    checksum: Any = None
    size: Any = None
    missing_required: tuple[str, ...] = ()

    @property
    def required_fields_ok(self) -> bool:
        return not self.missing_required


@dataclass(frozen=True)
class StatusOutcome:
    call: CallResult
    view: StatusView | None = None  # only for a 2xx answer with a JSON body
    not_found: bool = False  # a 404, or the answer [status] not_found names


@runtime_checkable
class ProviderAdapter(Protocol):
    """What the service needs from a provider. None of these raise for network trouble."""

    async def create(self, request: Any, subject: Subject) -> CreateOutcome:
        """Create the job; ``request`` is the agent's, before the file's ``create.set``."""
        ...

    async def lookup(self, subject: Subject) -> LookupOutcome: ...

    async def status(self, subject: Subject) -> StatusOutcome: ...

    async def cancel(self, subject: Subject) -> CallResult: ...

    async def fetch_result(self, subject: Subject, result_ref: str | None) -> CallResult: ...

    async def aclose(self) -> None: ...


PROTOCOL_METHODS = ("create", "lookup", "status", "cancel", "fetch_result", "aclose")


def _present(value: Any) -> bool:
    return value is not MISSING and value is not None


def _get(pointer: Pointer | None, body: Any) -> Any:
    if pointer is None:
        return None
    value = pointer.resolve(body)
    return None if value is MISSING else value


def job_id_text(value: Any, where: str) -> tuple[str | None, str | None]:
    """A usable job ID from a JSON value, or (None, why not)."""
    if value is MISSING or value is None:
        return None, f"no job ID at {where}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 128:
        return str(value), None
    if not isinstance(value, str):
        return None, f"the job ID at {where} is not a string"
    if not value or len(value) > MAX_JOB_ID_CHARS or not value.isprintable():
        return None, f"the job ID at {where} is empty, too long or not printable"
    if any(segment in ("", ".", "..") for segment in value.split("/")):
        return None, f"the job ID at {where} has an empty, '.' or '..' path segment"
    return value, None


def _json_body(call: CallResult) -> tuple[bool, str | None]:
    """Whether a 2xx JSON body is there to read, else why not."""
    if not call.ok:
        return False, None
    if call.too_large:
        return False, "the response body is larger than the limit"
    if call.parse_error:
        return False, call.parse_error
    if call.body is None:
        return False, "the response has no JSON body"
    return True, None


def answer_is(rule: AnswerRule | None, call: CallResult) -> bool:
    """Whether ``call``'s answer is the one ``rule`` names (a duplicate, "no such job", ...)."""
    return rule is not None and rule.matches(call.http_status, call.body_bytes)


def cancel_outcome(spec: ProviderSpec, call: CallResult) -> CancelAnswer:
    """What a cancel's answer came to, with the file's ``[cancel] refused`` rule applied."""
    rule = spec.cancel.refused if spec.cancel is not None else None
    return cancel_answer(call, answer_is(rule, call))


def create_outcome(spec: ProviderSpec, call: CallResult) -> CreateOutcome:
    if answer_is(spec.create.duplicate, call):
        return CreateOutcome(call, duplicate=True)
    readable, why = _json_body(call)
    if not readable:
        return CreateOutcome(call, job_id_problem=why)
    job_id, problem = job_id_text(spec.create.job_id.resolve(call.body), str(spec.create.job_id))
    word, category = None, None
    if spec.create.state is not None:
        word = state_word(spec.create.state.resolve(call.body))
        category = spec.states.category_of(word)
    return CreateOutcome(call, job_id, problem, word, category)


def _matches(item: Any, wanted: tuple[tuple[Pointer, str], ...]) -> bool:
    for pointer, value in wanted:
        found = pointer.resolve(item)
        if isinstance(found, bool) or not isinstance(found, str | int) or str(found) != value:
            return False
    return True


def _candidate(lookup: LookupSpec, body: Any, wanted: tuple[tuple[Pointer, str], ...]) -> Any:
    """The object the job ID is read from: the body, or the one matching item of the list.

    Returns ``MISSING`` when nothing matches, or a problem string when the answer cannot
    be read (no list where ``items`` points, or more than one match: which job is ours?).
    """
    if lookup.items is None:
        return body if _matches(body, wanted) else MISSING
    items = lookup.items.resolve(body)
    if not isinstance(items, list):
        return _Problem(f"no list at {lookup.items} in the lookup answer")
    found = [item for item in items if _matches(item, wanted)]
    if len(found) > 1:
        return _Problem(f"{len(found)} items of the lookup answer match; which job is ours?")
    return found[0] if found else MISSING


@dataclass(frozen=True)
class _Problem:
    text: str


def lookup_outcome(
    spec: ProviderSpec, call: CallResult, wanted: tuple[tuple[Pointer, str], ...] = ()
) -> LookupOutcome:
    """One lookup page read; ``wanted`` is ``lookup.match`` with its templates filled."""
    if call.http_status == 404 or (spec.lookup and answer_is(spec.lookup.not_found, call)):
        return LookupOutcome(call, LookupVerdict.NOT_FOUND)
    readable, why = _json_body(call)
    if not readable or spec.lookup is None:
        return LookupOutcome(call, LookupVerdict.UNKNOWN, job_id_problem=why)
    candidate = _candidate(spec.lookup, call.body, wanted)
    if isinstance(candidate, _Problem):
        return LookupOutcome(call, LookupVerdict.UNKNOWN, job_id_problem=candidate.text)
    value = MISSING if candidate is MISSING else spec.lookup.job_id.resolve(candidate)
    if not _present(value):
        return LookupOutcome(call, LookupVerdict.NOT_FOUND)
    job_id, problem = job_id_text(value, str(spec.lookup.job_id))
    if job_id is None:
        return LookupOutcome(call, LookupVerdict.UNKNOWN, job_id_problem=problem)
    return LookupOutcome(call, LookupVerdict.FOUND, job_id)


def next_page(lookup: LookupSpec, body: Any) -> tuple[str | int | None, str | None]:
    """(the cursor of the next lookup page, None), (None, None) at the end of the list, or
    (None, why) when the list says it goes on but gives no cursor to follow.

    The end: no paging is declared, ``has_more`` is not true, or (without ``has_more``)
    there is no cursor. A cursor is a string or an integer (an offset stays one for a
    body), never empty.
    """
    if lookup.next is None or lookup.next_param is None:
        return None, None
    more = lookup.has_more.resolve(body) if lookup.has_more is not None else None
    if lookup.has_more is not None and more is not True:
        return None, None
    value = lookup.next.resolve(body)
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
        if more is True:
            return None, f"the lookup answer says it has more but gives no cursor at {lookup.next}"
        return None, None
    return value, None


def _missing_required(spec: ProviderSpec, body: Any, category: RemoteCategory) -> tuple[str, ...]:
    if category not in _ENDED_WITH_RESULT:
        return ()
    missing = [str(p) for p in spec.status.required if not _present(p.resolve(body))]
    ref = spec.status.result_ref
    if ref is not None:
        value = ref.resolve(body)
        if not (isinstance(value, str | int) and not isinstance(value, bool) and str(value)):
            missing.append(str(ref))
    return tuple(missing)


def status_view(spec: ProviderSpec, body: Any, job_id: str | None = None) -> StatusView:
    """Read a parsed status body with the provider's pointers. Never raises."""
    status = spec.status
    verdict = spec.classify(body)
    echoed, matches = None, None
    if status.job_id is not None:
        echoed, _ = job_id_text(status.job_id.resolve(body), str(status.job_id))
        matches = echoed is not None and (job_id is None or echoed == job_id)
    result = spec.result or ResultSpec()
    return StatusView(
        remote_state=verdict.word,
        category=verdict.category,
        rule=verdict.rule,
        job_id=echoed,
        job_id_matches=matches,
        poll_after=_get(status.poll_after_seconds, body),
        next_check_at=_get(status.next_check_at, body),
        expires_at=_get(status.expires_at, body),
        error=_get(status.error, body),
        progress=_get(status.progress, body),
        result_ref=_get(status.result_ref, body),
        errors_ref=_get(status.errors_ref, body),
        checksum=_get(result.checksum, body),
        size=_get(result.size, body),
        missing_required=_missing_required(spec, body, verdict.category),
    )


def status_outcome(
    spec: ProviderSpec, call: CallResult, job_id: str | None = None
) -> StatusOutcome:
    if call.http_status == 404 or answer_is(spec.status.not_found, call):
        return StatusOutcome(call, not_found=True)
    readable, _ = _json_body(call)
    return StatusOutcome(call, status_view(spec, call.body, job_id) if readable else None)

"""``reconciler providers check NAME``: a provider file tried against the live API.

With ``--job-id`` one status read of that job (and its result when it has ended); with
``--request`` a real job through create, a lookup by its idempotency key, status reads
until it ends (or a cancel, then reads until that settles) and its result. Each call is
printed with its answer's status and what the file made of it (every pointer's value or
"absent", the state word's class), then a one-line verdict. The first call the file
cannot read ends the check with a non-zero exit.

Guarantee: nothing printed holds a secret. The credential is named by where it comes
from, never shown; no request or response header is printed; the answer's values are
printed as the file reads them, each cut to a line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.core.cancel import CancelAnswer
from reconciler.core.create import body_text
from reconciler.core.errors import CredentialUnavailable
from reconciler.core.ids import idempotency_token, trace_id
from reconciler.core.outcome_parts import provider_message
from reconciler.core.provider_calls import CallResult
from reconciler.core.strict_json import shown
from reconciler.core.vocabulary import RemoteCategory
from reconciler.providers.adapter import (
    LookupVerdict,
    ProviderAdapter,
    StatusOutcome,
    Subject,
    cancel_outcome,
)
from reconciler.providers.credentials import Credential
from reconciler.providers.pointer import MISSING
from reconciler.providers.result_check import check_result, release
from reconciler.providers.spec import ProviderSpec

VALUE_CHARS = 80
INDENT = "        "
_ENDED = frozenset(
    {
        RemoteCategory.SUCCESS,
        RemoteCategory.PARTIAL,
        RemoteCategory.FAILURE,
        RemoteCategory.CANCELLED,
        RemoteCategory.EXPIRED,
    }
)


class Unreadable(Exception):
    """A call whose answer the provider file cannot read: the check stops here."""


@dataclass
class Report:
    """What the check printed, line by line, and whether every call read."""

    out: Callable[[str], None]
    failed: bool = False

    def say(self, line: str) -> None:
        self.out(line)

    def call(self, name: str, call: CallResult) -> None:
        self.say(f"{name:<7} {call.method} {call.target} -> {_answer(call)}")

    def value(self, key: str, pointer: Any, value: Any) -> None:
        if pointer is None:
            return
        shown_value = "absent" if value is None or value is MISSING else _short(value)
        self.say(f"{INDENT}{key} {pointer} = {shown_value}")

    def ok(self, text: str) -> None:
        self.say(f"{INDENT}ok: {text}")

    def fail(self, text: str) -> Unreadable:
        self.failed = True
        self.say(f"{INDENT}FAILED: {text}")
        return Unreadable(text)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return shown(text, VALUE_CHARS)


def _answer(call: CallResult) -> str:
    if call.refused:
        return f"not sent: {call.refused}"
    if call.transport_error is not None:
        return f"no answer ({call.transport_error.value}: {call.transport_detail or ''})".rstrip()
    size = len(call.body_bytes or b"")
    return f"HTTP {call.http_status}, {size} bytes in {call.elapsed_ms:.0f} ms"


def _why_not_read(call: CallResult) -> str:
    if call.refused or call.transport_error is not None:
        return _answer(call)
    if call.parse_error:
        return f"HTTP {call.http_status}: {call.parse_error}"
    said = provider_message(call.body) if call.body is not None else body_text(call.body_bytes)
    words = f": {shown(said, 160)}" if said else ""
    if call.http_status in (401, 403):
        return f"HTTP {call.http_status}, the provider refused this credential{words}"
    return f"HTTP {call.http_status}, not an answer the file reads{words}"


class Check:
    """One check's calls, through the provider's own adapter (the service's request builder)."""

    def __init__(self, spec: ProviderSpec, adapter: ProviderAdapter, report: Report) -> None:
        self.spec = spec
        self.adapter = adapter
        self.report = report

    async def status(self, subject: Subject) -> StatusOutcome:
        spec, report = self.spec, self.report
        outcome = await self.adapter.status(subject)
        report.call("status", outcome.call)
        if outcome.not_found:
            report.ok(f"no such job {subject.job_id} (a 404, or what [status] not_found names)")
            return outcome
        view = outcome.view
        if view is None:
            raise report.fail(_why_not_read(outcome.call))
        status = spec.status
        report.say(f"{INDENT}state {status.state} = {_short(view.remote_state)} -> {view.category}")
        for key, pointer, value in (
            ("job_id", status.job_id, view.job_id),
            ("progress", status.progress, view.progress),
            ("error", status.error, view.error),
            ("poll_after_seconds", status.poll_after_seconds, view.poll_after),
            ("next_check_at", status.next_check_at, view.next_check_at),
            ("expires_at", status.expires_at, view.expires_at),
            ("result_ref", status.result_ref, view.result_ref),
            ("errors_ref", status.errors_ref, view.errors_ref),
        ):
            report.value(key, pointer, value)
        if view.category is RemoteCategory.UNKNOWN:
            raise report.fail(f"state {_short(view.remote_state)} is in no class of [states]")
        if view.job_id_matches is False:
            raise report.fail(f"the answer names job {view.job_id}, not {subject.job_id}")
        if view.missing_required:
            missing = ", ".join(view.missing_required)
            raise report.fail(f"{view.category} but required fields are absent: {missing}")
        report.ok(f"{view.category}")
        return outcome

    async def result(self, subject: Subject, outcome: StatusOutcome) -> None:
        report = self.report
        view = outcome.view
        ref = view.result_ref if view is not None else None
        call = await self.adapter.fetch_result(subject, None if ref is None else str(ref))
        try:
            report.call("result", call)
            checked = check_result(self.spec, call, outcome.call.body)
        finally:
            release(call)
        if not call.ok:
            raise report.fail(_why_not_read(call))
        for name, value in checked.summary.items():
            report.say(f"{INDENT}summary {name} = {_short(value)}")
        if checked.problems:
            raise report.fail("; ".join(checked.problems))
        report.ok(f"the result is valid ({checked.size or len(call.body_bytes or b'')} bytes)")

    async def create(self, request: Any, subject: Subject) -> str:
        report = self.report
        outcome = await self.adapter.create(request, subject)
        report.call("create", outcome.call)
        report.value("job_id", self.spec.create.job_id, outcome.job_id)
        if outcome.duplicate:
            raise report.fail("the answer is [create] duplicate for a key never used before")
        if outcome.job_id is None:
            raise report.fail(outcome.job_id_problem or _why_not_read(outcome.call))
        report.ok(f"job {outcome.job_id} created with idempotency key {subject.idempotency_key}")
        return outcome.job_id

    async def lookup(self, subject: Subject, job_id: str) -> None:
        report = self.report
        if self.spec.lookup is None:
            report.say("lookup  (no [lookup] table: an ambiguous create is settled otherwise)")
            return
        found = await self.adapter.lookup(subject)
        report.call("lookup", found.call)
        if found.verdict is not LookupVerdict.FOUND:
            problem = found.job_id_problem or f"the lookup says {found.verdict.value}"
            raise report.fail(f"the job just created is not found by its key: {problem}")
        if found.job_id != job_id:
            raise report.fail(f"the lookup finds job {found.job_id}, not {job_id}")
        report.ok(f"the lookup finds job {job_id} by its idempotency key")

    async def cancel(self, subject: Subject) -> CancelAnswer:
        report = self.report
        call = await self.adapter.cancel(subject)
        report.call("cancel", call)
        answer = cancel_outcome(self.spec, call)
        if answer is not CancelAnswer.ACCEPTED:
            raise report.fail(
                f"the provider did not take the cancel ({answer.value}): " + _why_not_read(call)
            )
        report.ok("the provider took the cancel; only its cancelled state confirms it")
        return answer

    async def until_ended(
        self, subject: Subject, sleep: Callable[[float], Any], max_reads: int
    ) -> StatusOutcome:
        """Status reads at the file's pace until the job ends (or the reads run out)."""
        backoff = self.spec.polling.backoff()
        outcome = await self.status(subject)
        for attempt in range(max_reads - 1):
            if outcome.view is not None and outcome.view.category in _ENDED:
                return outcome
            await sleep(backoff.raw(attempt))
            outcome = await self.status(subject)
        if outcome.view is None or outcome.view.category not in _ENDED:
            raise self.report.fail(f"the job had not ended after {max_reads} status reads")
        return outcome


async def check_job(check: Check, job_id: str) -> None:
    """One status read of an existing job, and its result when it has ended well."""
    subject = Subject("op_check", idempotency_token(), trace_id(), job_id)
    outcome = await check.status(subject)
    ended = outcome.view.category if outcome.view is not None else None
    if ended in (RemoteCategory.SUCCESS, RemoteCategory.PARTIAL):
        await check.result(subject, outcome)


async def check_request(
    check: Check,
    request: Any,
    *,
    cancel: bool,
    max_reads: int,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> None:
    """A real job through every call the file describes."""
    subject = Subject("op_check", idempotency_token(), trace_id())
    job_id = await check.create(request, subject)
    subject = Subject(subject.operation_id, subject.idempotency_key, subject.trace_id, job_id)
    await check.lookup(subject, job_id)
    if cancel:
        await check.status(subject)
        await check.cancel(subject)
    outcome = await check.until_ended(subject, sleep, max_reads)
    ended = outcome.view.category if outcome.view is not None else None
    if ended in (RemoteCategory.SUCCESS, RemoteCategory.PARTIAL):
        await check.result(subject, outcome)
    elif cancel and ended is RemoteCategory.CANCELLED:
        check.report.ok("the cancel is confirmed by the provider's own state")


def verdict(report: Report, name: str) -> str:
    if report.failed:
        return f"verdict: {name}: a call the file cannot read (above); fix the file and check again"
    return f"verdict: {name}: every call read as the file says"


def headline(spec: ProviderSpec) -> str:
    origin = f"preset {spec.preset} in {spec.source}" if spec.preset else spec.source
    return f"provider {spec.name} ({origin}), base_url {spec.base_url}"


async def obtain_credential(report: Report, credential: Credential | None) -> None:
    """The credential first, and where it came from (never its value)."""
    if credential is None:
        report.say("credential: none (auth type none)")
        return
    try:
        source = await credential.obtain()
    except CredentialUnavailable as exc:
        report.say(f"credential: {credential.source}")
        raise report.fail(f"the credential could not be obtained: {exc.message}") from None
    report.say(f"credential: {source} (obtained; not shown)")

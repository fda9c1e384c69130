"""Recording a verified webhook delivery: what the webhook door hands over once the
signature and the JSON are checked.

The event's id, type and job id are read where the provider file says; an event that is
a hint must name its job in storable text (else a ``400``); an event that is not is kept
for the record with what can be kept. One commit is shared with concurrent deliveries
(``storage.webhook_events``), and the verified event's span links to its operation's
trace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from reconciler.core.errors import InvalidRequest, UnstorableContent
from reconciler.core.strict_json import is_storable, is_text
from reconciler.providers.pointer import MISSING
from reconciler.providers.spec import WebhookSpec
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.webhook_events import IncomingEvent, Outcome, kept_body
from reconciler.tracing import stored_context

__all__ = ["Outcome", "is_hint", "record_event"]

MAX_ID_CHARS = 300
MAX_TYPE_CHARS = 200  # webhook_events.event_type


def _text(value: object, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidRequest(f"webhook {what} must be a string")
    text = str(value)
    if not text or len(text) > MAX_ID_CHARS:
        raise InvalidRequest(f"webhook {what} must be 1-{MAX_ID_CHARS} characters")
    if "\x00" in text or not is_text(text):
        raise UnstorableContent(
            f"webhook {what} is not storable text (a NUL or a lone surrogate); it can never "
            "be stored, so retrying will not help"
        )
    return text


async def record_event(
    runtime: Runtime,
    name: str,
    spec: WebhookSpec,
    headers: Mapping[str, str],
    body: bytes,
    payload: object,
) -> tuple[Outcome, str]:
    """Record a verified delivery (its body ``body``, parsed ``payload``) in one commit
    shared with concurrent deliveries; the outcome and the event's id. ``UnstorableContent``
    when the database refuses its content."""
    raw_event = spec.event_id.extract(headers, payload)
    if raw_event is MISSING or raw_event is None:
        raise InvalidRequest(f"webhook has no event id at {spec.event_id}")
    event_id = _text(raw_event, "event id")
    event_type = _event_type(spec, headers, payload)
    hint = _hinted(spec, event_type)
    raw_job = spec.job_id.extract(headers, payload)
    if hint:
        job_id = None if raw_job is MISSING or raw_job is None else _text(raw_job, "job id")
    else:  # kept for the record only: an id it cannot keep is not a reason to refuse it
        job_id = _kept_text(raw_job)
    body.decode("utf-8")  # a body that is not UTF-8 is unstorable (UnicodeError below)
    event = IncomingEvent(
        provider=name,
        event_id=event_id,
        remote_job_id=job_id,
        body_sha256=hashlib.sha256(body).hexdigest(),
        body=kept_body(body),
        received_at=runtime.clock.now(),
        event_type=event_type,
        body_size=len(body),
        ignored=not hint,
    )
    outcome = await runtime.webhooks.submit(event)
    if runtime.tracing.enabled:
        await _traced(runtime, name, job_id, outcome, event_id)
    return outcome, event_id


async def _traced(
    runtime: Runtime, provider: str, job_id: str | None, outcome: Outcome, event_id: str
) -> None:
    """The verified event's span: its outcome, and a link to its operation's trace."""
    tracing = runtime.tracing
    tracing.note(outcome=outcome, webhook_event=event_id)
    if job_id is None or outcome in (Outcome.ORPHAN, Outcome.IGNORED):
        return

    def find() -> tuple[str, str, str | None] | None:
        with runtime.db.read() as conn:
            return store.trace_of_job(conn, provider, job_id)

    found = await runtime.db.run(find)
    if found is not None:
        tracing.note(operation=found[0])
        tracing.link(stored_context(*found))


def is_hint(spec: WebhookSpec, headers: Mapping[str, str], payload: object) -> bool:
    """Whether a verified event is a hint: every event, or one of ``[webhook] types``."""
    return _hinted(spec, _event_type(spec, headers, payload))


def _hinted(spec: WebhookSpec, event_type: str | None) -> bool:
    return not spec.types or event_type in spec.types


def _event_type(spec: WebhookSpec, headers: Mapping[str, str], payload: object) -> str | None:
    """The event's type where the provider file says it is (``[webhook] event_type``)."""
    source = spec.event_type
    found = MISSING if source is None else source.extract(headers, payload)
    return _kept_text(found, MAX_TYPE_CHARS)


def _kept_text(value: object, limit: int = MAX_ID_CHARS) -> str | None:
    """``value`` as text the event can keep, or None: not a string or number, too long,
    or not storable."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    if not text or len(text) > limit or not is_storable(text):
        return None
    return text

"""The public endpoint providers call: ``POST /webhooks/{provider}``.

Order matters: unknown provider (404) before reading; the body limit while
reading (413); the signature over the raw bytes before anything is parsed
or stored (401, nothing stored); then JSON (400); then one commit shared
with concurrent deliveries, and 2xx only after it.

Signed content that no database can store (an id holding a lone surrogate or a
NUL) is a 400, counted as ``unstorable``: a 503 would have the provider retry
it forever. A sender that hangs up mid-body is counted ``client_disconnected``
and logged at info; neither is a storage failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.core.errors import (
    ClientDisconnected,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ReconcilerError,
    SignatureRejected,
    StorageUnavailable,
    UnstorableContent,
)
from reconciler.core.signatures import Verifier
from reconciler.core.strict_json import is_storable, is_text, parse_json
from reconciler.inbound.bodies import read_limited
from reconciler.providers.pointer import MISSING
from reconciler.providers.spec import WebhookSpec
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.webhook_events import IncomingEvent, Outcome, kept_body
from reconciler.tracing import SpanName, stored_context

log = logging.getLogger("reconciler.webhooks")

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


async def receive(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    name = request.path_params["provider"]
    intake = runtime.webhook_intakes.get(name)
    if intake is None:
        runtime.metrics.webhook("unknown", "unknown_provider")
        raise NotFound(f"no webhook endpoint for provider '{name}'")
    with runtime.tracing.request(SpanName.WEBHOOK, request.headers, provider=name):
        return await _receive(runtime, request, name, intake)


async def _receive(
    runtime: Runtime, request: Request, name: str, intake: tuple[WebhookSpec, Verifier]
) -> Response:
    count = runtime.metrics.webhook
    try:
        outcome, event_id = await _store(runtime, request, name, *intake)
    except SignatureRejected as exc:
        count(name, f"rejected_{exc.reason.value}")
        raise
    except PayloadTooLarge:
        count(name, "too_large")
        raise
    except ClientDisconnected:
        count(name, "client_disconnected")
        raise
    except UnstorableContent:
        count(name, "unstorable")
        raise
    except InvalidRequest:
        count(name, "invalid")
        raise
    except ReconcilerError:
        count(name, "store_failed")
        raise
    except UnicodeError:
        count(name, "unstorable")
        raise _unstorable(name) from None
    except Exception:
        count(name, "store_failed")
        log.exception("webhook could not be stored")
        raise StorageUnavailable("the event could not be stored; retry later") from None
    count(name, outcome.value)
    # Rendered by hand: this answer is sent thousands of times a second.
    body = f'{{"status":"{outcome.value}","event_id":{json.dumps(event_id)}}}'
    return Response(body, media_type="application/json")


def _unstorable(provider: str) -> UnstorableContent:
    """The content itself was refused (not UTF-8, or by the database): the same bytes
    will always be refused, so the provider is told not to retry them."""
    log.warning("webhook content could not be stored", extra={"provider": provider})
    return UnstorableContent(
        "the event's content cannot be stored; retrying the same content will not help"
    )


async def _store(
    runtime: Runtime, request: Request, name: str, spec: WebhookSpec, verifier: Verifier
) -> tuple[Outcome, str]:
    body = await read_limited(request, spec.max_body_bytes)
    verifier.verify(request.headers, body)  # SignatureRejected -> 401, nothing stored
    payload = parse_json(body, "webhook body")
    raw_event = spec.event_id.extract(request.headers, payload)
    if raw_event is MISSING or raw_event is None:
        raise InvalidRequest(f"webhook has no event id at {spec.event_id}")
    event_id = _text(raw_event, "event id")
    event_type = _event_type(spec, request.headers, payload)
    hint = _hinted(spec, event_type)
    raw_job = spec.job_id.extract(request.headers, payload)
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
    try:
        outcome = await runtime.webhooks.submit(event)
    except UnstorableContent:
        raise _unstorable(name) from None  # the database's refusal (storage.database)
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


ROUTES = [Route("/webhooks/{provider}", receive, methods=["POST"])]

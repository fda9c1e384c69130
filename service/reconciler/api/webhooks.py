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

import json
import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.commands.webhooks import Outcome, record_event
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
from reconciler.core.strict_json import parse_json
from reconciler.inbound.bodies import read_limited
from reconciler.providers.spec import WebhookSpec
from reconciler.runtime import Runtime
from reconciler.tracing import SpanName

log = logging.getLogger("reconciler.webhooks")


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
    try:
        return await record_event(runtime, name, spec, request.headers, body, payload)
    except UnstorableContent:
        raise _unstorable(name) from None  # the database's refusal (storage.database)


ROUTES = [Route("/webhooks/{provider}", receive, methods=["POST"])]

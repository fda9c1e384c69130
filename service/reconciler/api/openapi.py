"""The OpenAPI 3.1 description of the agent API, the webhook endpoint and health checks.

The bodies are the wire models' own schemas (``reconciler.wire.schemas``); the paths
are written out here, with the running service's settings (its providers, its wait
cap), so the document cannot drift from what the endpoints accept.
"""

from __future__ import annotations

from typing import Any

from reconciler import __version__
from reconciler.wire import (
    MAX_PAGE,
    CancelOperation,
    CreateOperation,
    ErrorBody,
    History,
    Operation,
    OperationPage,
    OperatorDecision,
    ProviderList,
)
from reconciler.wire.schemas import components, with_values

# Every body a path takes or answers with; their components are generated from these.
WIRE_MODELS = (
    CreateOperation,
    CancelOperation,
    OperatorDecision,
    Operation,
    OperationPage,
    History,
    ProviderList,
    ErrorBody,
)
SCHEMAS = components(WIRE_MODELS)


def _json(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Invalid input; the message says what to fix.",
        401: "Missing or bad token.",
        403: "Needs an operator token.",
        404: "Not found (or not yours).",
        409: "Conflicts with what is recorded.",
        410: "Removed by retention; the message names the operation and when it ended.",
        413: "Body too large.",
        415: "The body is not declared as JSON (application/json or a +json type).",
        429: "A quota of this agent is reached; Retry-After says when to try again.",
        503: "Storage unavailable; retry.",
    }
    return {str(c): {"description": words[c], **_json("ErrorBody")} for c in codes}


def _op_id() -> dict[str, Any]:
    return {"name": "op_id", "in": "path", "required": True, "schema": {"type": "string"}}


def document(
    providers: list[str], wait_max_seconds: float, history_page_max: int = 1000
) -> dict[str, Any]:
    """The OpenAPI document for this running service.

    The one value the models cannot know: the providers ``provider`` may name (any other
    is refused with 400, so the document lists exactly those).
    """
    schemas = dict(SCHEMAS)
    if providers:
        schemas["CreateOperation"] = with_values(
            schemas["CreateOperation"], {"provider": {"enum": providers}}
        )
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "reconciler",
            "version": __version__,
            "description": "Start long-running jobs at remote providers and get exactly one "
            "verified answer back.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "paths": {
            "/v1/operations": {
                "post": {
                    "summary": "Start an operation (idempotent with idempotency_key).",
                    "security": secured,
                    "requestBody": {"required": True, **_json("CreateOperation")},
                    "responses": {
                        "202": {
                            "description": "Stored; the create runs in the background.",
                            **_json("Operation"),
                        },
                        "200": {
                            "description": "Same key and request: the stored operation.",
                            **_json("Operation"),
                        },
                        **_errors(400, 401, 409, 410, 413, 415, 429, 503),
                    },
                },
                "get": {
                    "summary": "List operations, newest first.",
                    "security": secured,
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"$ref": "#/components/schemas/State"},
                        },
                        {"name": "provider", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "done",
                            "in": "query",
                            "description": "false: not done (running, or awaiting a decision).",
                            "schema": {"type": "string", "enum": ["true", "false"]},
                        },
                        {
                            "name": "awaiting_decision",
                            "in": "query",
                            "description": "true: only operations awaiting an operator.",
                            "schema": {"type": "string", "enum": ["true", "false"]},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {"description": "A page.", **_json("OperationPage")},
                        **_errors(400, 401, 503),
                    },
                },
            },
            "/v1/operations/{op_id}": {
                "get": {
                    "summary": "Read one operation.",
                    "security": secured,
                    "parameters": [_op_id()],
                    "responses": {
                        "200": {"description": "The operation.", **_json("Operation")},
                        **_errors(401, 404, 410, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/wait": {
                "get": {
                    "summary": "Long-poll until done, until a decision becomes pending or "
                    "is made, or until the timeout (then done is false).",
                    "security": secured,
                    "parameters": [
                        _op_id(),
                        {
                            "name": "timeout_seconds",
                            "in": "query",
                            "schema": {"type": "number", "minimum": 0, "maximum": wait_max_seconds},
                        },
                    ],
                    "responses": {
                        "200": {"description": "The operation.", **_json("Operation")},
                        **_errors(400, 401, 404, 410, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/cancel": {
                "post": {
                    "summary": "Record the intent to cancel; the provider must confirm.",
                    "security": secured,
                    "parameters": [_op_id()],
                    "requestBody": {"required": False, **_json("CancelOperation")},
                    "responses": {
                        "202": {"description": "Recorded.", **_json("Operation")},
                        **_errors(400, 401, 404, 409, 410, 413, 415, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/decisions": {
                "post": {
                    "summary": "Operator decision on an escalation (only offered options).",
                    "security": secured,
                    "parameters": [_op_id()],
                    "requestBody": {"required": True, **_json("OperatorDecision")},
                    "responses": {
                        "200": {"description": "Recorded.", **_json("Operation")},
                        **_errors(400, 401, 403, 404, 409, 410, 413, 415, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/history": {
                "get": {
                    "summary": "Transitions and observations, oldest first, a page at a time.",
                    "security": secured,
                    "parameters": [
                        _op_id(),
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": history_page_max,
                            },
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {"description": "One page of the history.", **_json("History")},
                        **_errors(400, 401, 404, 410, 503),
                    },
                },
            },
            "/v1/providers": {
                "get": {
                    "summary": "The providers an operation may be started at, with what to send.",
                    "security": secured,
                    "responses": {
                        "200": {"description": "The providers.", **_json("ProviderList")},
                        **_errors(401, 503),
                    },
                },
            },
            "/healthz": {
                "get": {
                    "summary": "Process alive.",
                    "responses": {"200": {"description": "Alive."}},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Database reachable and schema current.",
                    "responses": {
                        "200": {"description": "Ready."},
                        "503": {"description": "Not ready."},
                    },
                }
            },
        },
    }

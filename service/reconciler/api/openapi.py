"""The OpenAPI 3.1 description of the agent API, the webhook endpoint and health checks.

Built from the same enums the code uses, and from the running service's
settings (its providers, its wait cap), so the document cannot drift from
what the endpoints accept.
"""

from __future__ import annotations

from typing import Any

from reconciler import __version__
from reconciler.api.validation import MAX_CANCEL_REASON, MAX_KEY_LENGTH
from reconciler.core.signatures import WebhookScheme
from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction, DelaySource, EscalationReason, HistoryKind
from reconciler.storage.operations import MAX_PAGE


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}

TIME = {"type": "string", "format": "date-time"}

ESCALATION = {
    "type": "object",
    "required": ["reason", "message", "options", "created_at", "decided", "decision"],
    "properties": {
        "reason": {"type": "string", "enum": [r.value for r in EscalationReason]},
        "message": {"type": "string"},
        "options": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["action", "description"],
                "properties": {
                    "action": {"type": "string", "enum": [a.value for a in DecisionAction]},
                    "description": {"type": "string"},
                    "extra_seconds": {"type": "number"},
                    "extra_status_requests": {"type": "integer"},
                },
            },
        },
        "created_at": TIME,
        "decided": {"type": "boolean"},
        "decision": _nullable({"type": "object"}),
    },
}

OPERATION = {
    "type": "object",
    "required": [
        "id",
        "provider",
        "state",
        "done",
        "remote_job_id",
        "remote_state",
        "message",
        "poll_after_seconds",
        "progress",
        "deadline_at",
        "budget",
        "result",
        "error",
        "escalation",
    ],
    "properties": {
        "id": {"type": "string", "pattern": "^op_"},
        "provider": {"type": "string"},
        "state": {"type": "string", "enum": [s.value for s in State]},
        "done": {"type": "boolean", "description": "True only in an end state."},
        "remote_job_id": _nullable({"type": "string"}),
        "remote_state": _nullable({"type": "string"}),
        "message": {"type": "string", "description": "What the state means and what to do."},
        "poll_after_seconds": _nullable({"type": "number"}),
        "progress": {},
        "deadline_at": TIME,
        "budget": {
            "type": "object",
            "required": ["status_requests_used", "max_status_requests"],
            "properties": {
                "status_requests_used": {"type": "integer"},
                "max_status_requests": {"type": "integer"},
            },
        },
        "result": _nullable({"type": "object"}),
        "error": _nullable({"type": "object"}),
        "escalation": _nullable(ESCALATION),
        "idempotency_key": _nullable({"type": "string"}),
        "trace_id": {"type": "string"},
        "callback_url": _nullable({"type": "string"}),
        "metadata": _nullable({"type": "object"}),
        "created_at": TIME,
        "updated_at": TIME,
        "done_at": _nullable(TIME),
        "cancel_requested": {"type": "boolean"},
    },
}

HISTORY_ENTRY = {
    "type": "object",
    "required": ["seq", "at", "kind", "actor", "from", "to", "cause", "delay_source"],
    "properties": {
        "seq": {"type": "integer"},
        "at": TIME,
        "kind": {"type": "string", "enum": [k.value for k in HistoryKind]},
        "actor": {"type": "string"},
        "from": _nullable({"type": "string"}),
        "to": _nullable({"type": "string"}),
        "cause": {"type": "string"},
        "delay_source": _nullable({"type": "string", "enum": [d.value for d in DelaySource]}),
        "detail": _nullable({"type": "object"}),
        "hash": {"type": "string"},
    },
}


WEBHOOK_SETTINGS = {
    "type": "object",
    "required": ["scheme", "tolerance_seconds", "secrets_env", "secrets_set"],
    "properties": {
        "scheme": {"type": "string", "enum": [s.value for s in WebhookScheme]},
        "tolerance_seconds": {"type": "integer"},
        "max_body_bytes": {"type": "integer"},
        "event_id": {"type": "string"},
        "job_id": {"type": "string"},
        "secrets_env": {"type": "string", "description": "The variable; never its value."},
        "secrets_set": {"type": "boolean"},
    },
}

PROVIDER = {
    "type": "object",
    "required": [
        "name",
        "preset",
        "description",
        "request_schema",
        "set_by_service",
        "can_cancel",
        "max_deadline_seconds",
        "max_status_requests",
    ],
    "properties": {
        "name": {"type": "string"},
        "preset": {
            **_nullable({"type": "string"}),
            "description": "The shipped preset the provider is configured from (null: none).",
        },
        "description": _nullable({"type": "string"}),
        "request_schema": _nullable(
            {"type": "object", "description": "A JSON Schema that `request` must match."}
        ),
        "set_by_service": {
            "type": "array",
            "items": {"type": "string"},
            "description": "JSON pointers the service writes into every `request`; a "
            "`request` that already holds one is refused with 400.",
        },
        "can_cancel": {"type": "boolean"},
        "max_deadline_seconds": {"type": "number"},
        "max_status_requests": {"type": "integer"},
        "webhook": {
            **_nullable(WEBHOOK_SETTINGS),
            "description": "Operators only: how this provider's webhooks are verified.",
        },
        "webhook_trust": {
            **_nullable({"type": "object"}),
            "description": "Operators only: the provider's webhook trust.",
        },
    },
}

PROVIDER_LIST = {
    "type": "object",
    "required": ["providers"],
    "properties": {"providers": {"type": "array", "items": PROVIDER}},
}


def _json(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Invalid input; the message says what to fix.",
        401: "Missing or bad token.",
        403: "Needs an operator token.",
        404: "Not found (or not yours).",
        409: "Conflicts with what is recorded.",
        413: "Body too large.",
        429: "A quota of this agent is reached; Retry-After says when to try again.",
        503: "Storage unavailable; retry.",
    }
    return {str(c): {"description": words[c], **_json("Error")} for c in codes}


def _op_id() -> dict[str, Any]:
    return {"name": "op_id", "in": "path", "required": True, "schema": {"type": "string"}}


def document(
    providers: list[str], wait_max_seconds: float, history_page_max: int = 1000
) -> dict[str, Any]:
    """The OpenAPI document for this running service."""
    create = {
        "type": "object",
        "required": ["provider", "request"],
        "additionalProperties": False,
        "properties": {
            "provider": {"type": "string", "enum": providers} if providers else {"type": "string"},
            "request": {"type": "object", "description": "The provider's create body, sent as is."},
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
            "callback_url": {"type": "string", "format": "uri"},
            "deadline_seconds": {"type": "number", "exclusiveMinimum": 0},
            "max_status_requests": {"type": "integer", "minimum": 1},
            "metadata": {"type": "object"},
        },
    }
    decision = {
        "type": "object",
        "required": ["action"],
        "additionalProperties": False,
        "properties": {
            "action": {"type": "string", "enum": [a.value for a in DecisionAction]},
            "extra_seconds": {"type": "number", "exclusiveMinimum": 0},
            "extra_status_requests": {"type": "integer", "minimum": 1},
        },
    }
    cancel = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"reason": {"type": "string", "maxLength": MAX_CANCEL_REASON}},
    }
    page = {
        "type": "object",
        "required": ["operations", "next_cursor"],
        "properties": {
            "operations": {"type": "array", "items": {"$ref": "#/components/schemas/Operation"}},
            "next_cursor": _nullable({"type": "string"}),
        },
    }
    history = {
        "type": "object",
        "required": ["operation_id", "entries", "next_cursor"],
        "properties": {
            "operation_id": {"type": "string"},
            "entries": {"type": "array", "items": {"$ref": "#/components/schemas/HistoryEntry"}},
            "next_cursor": _nullable({"type": "string"}),
        },
    }
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
            "schemas": {
                "Error": ERROR,
                "Operation": OPERATION,
                "OperationPage": page,
                "CreateOperation": create,
                "Decision": decision,
                "Cancel": cancel,
                "History": history,
                "HistoryEntry": HISTORY_ENTRY,
                "Escalation": ESCALATION,
                "ProviderList": PROVIDER_LIST,
            },
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
                        **_errors(400, 401, 409, 413, 429, 503),
                    },
                },
                "get": {
                    "summary": "List operations, newest first.",
                    "security": secured,
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"type": "string", "enum": [s.value for s in State]},
                        },
                        {"name": "provider", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "done",
                            "in": "query",
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
                        **_errors(401, 404, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/wait": {
                "get": {
                    "summary": "Long-poll until done or the timeout (then done is false).",
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
                        **_errors(400, 401, 404, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/cancel": {
                "post": {
                    "summary": "Record the intent to cancel; the provider must confirm.",
                    "security": secured,
                    "parameters": [_op_id()],
                    "requestBody": {"required": False, **_json("Cancel")},
                    "responses": {
                        "202": {"description": "Recorded.", **_json("Operation")},
                        **_errors(400, 401, 404, 409, 413, 503),
                    },
                },
            },
            "/v1/operations/{op_id}/decisions": {
                "post": {
                    "summary": "Operator decision on an escalation (only offered options).",
                    "security": secured,
                    "parameters": [_op_id()],
                    "requestBody": {"required": True, **_json("Decision")},
                    "responses": {
                        "200": {"description": "Recorded.", **_json("Operation")},
                        **_errors(400, 401, 403, 404, 409, 413, 503),
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
                        **_errors(400, 401, 404, 503),
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

"""A provider as agents and operators see it (``GET /v1/providers``, ``list_providers``).

Guarantee: no secret and no credential leaves here. Agents see what they may
start and within which limits; operators also see how webhooks are verified
(the scheme, the tolerance, the variable that holds the secrets and whether it
is set), never a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.providers.spec import ProviderSpec


def _webhook(spec: ProviderSpec, environ: Mapping[str, str]) -> dict[str, Any] | None:
    hook = spec.webhook
    if hook is None:
        return None
    return {
        "scheme": hook.scheme.value,
        "tolerance_seconds": hook.tolerance_seconds,
        "max_body_bytes": hook.max_body_bytes,
        "event_id": str(hook.event_id),
        "job_id": str(hook.job_id),
        "secrets_env": hook.secrets_env,
        # Whether the variable holds anything at all; its value never leaves the process.
        "secrets_set": bool(environ.get(hook.secrets_env, "").strip()),
    }


def provider_view(
    spec: ProviderSpec,
    environ: Mapping[str, str],
    *,
    operator: bool,
    trust: dict[str, Any] | None = None,
) -> dict[str, Any]:
    view: dict[str, Any] = {
        "name": spec.name,
        "preset": spec.preset,
        "description": spec.description,
        "request_schema": dict(spec.request_schema.schema) if spec.request_schema else None,
        # The service writes these into every request; a request holding one is refused.
        "set_by_service": [rule.pointer.text for rule in spec.create.set],
        "can_cancel": spec.cancel is not None,
        "max_deadline_seconds": spec.polling.deadline_seconds,
        "max_status_requests": spec.polling.max_status_requests,
    }
    if operator:
        view["webhook"] = _webhook(spec, environ)
        view["webhook_trust"] = trust
    return view

"""Filling a provider file's path templates with values a path can carry safely."""

from __future__ import annotations

from urllib.parse import quote

from reconciler.core.errors import UnsafePathValue
from reconciler.providers.spec import (
    ERRORS_REF,
    IDEMPOTENCY_KEY,
    JOB_ID,
    RESULT_REF,
    template_fields,
)


def _segment(value: str, what: str) -> str:
    if value in ("", ".", ".."):
        raise UnsafePathValue(f"the {what} is empty or a '.'/'..' path segment")
    return quote(value, safe="")


def encode_path_value(value: str, what: str, *, keep_slashes: bool = False) -> str:
    """Percent-encode ``value`` for a path; ``keep_slashes`` keeps ``/`` between segments."""
    if not keep_slashes:
        return _segment(value, what)
    return "/".join(_segment(part, what) for part in value.split("/"))


def render_path(
    template: str,
    *,
    job_id: str | None = None,
    idempotency_key: str | None = None,
    result_ref: str | None = None,
    errors_ref: str | None = None,
    keep_slashes: bool = False,
) -> str:
    """Fill a validated path template; raises ``UnsafePathValue`` for a missing or unsafe value."""
    given = {
        JOB_ID: job_id,
        IDEMPOTENCY_KEY: idempotency_key,
        RESULT_REF: result_ref,
        ERRORS_REF: errors_ref,
    }
    values: dict[str, str] = {}
    for name in template_fields(template):
        value = given.get(name)
        if value is None:
            raise UnsafePathValue(f"the path needs {{{name}}} and none was given")
        values[name] = encode_path_value(value, name, keep_slashes=keep_slashes and name == JOB_ID)
    return template.format(**values)

"""The placeholders of a provider file and the one way a template becomes text.

A path, a ``set`` value (and every string nested in it), a header value and a lookup
``match`` value are templates: ``{job_id}``, ``{idempotency_key}``, ``{operation_id}``,
``{trace_id}`` and ``{webhook_url}`` (and, in result paths, ``{result_ref}`` and
``{errors_ref}``) stand for the call's values; ``{{`` and ``}}`` write a brace.
``{idempotency_key_alnum}`` is the same key in letters and digits only (``idem`` and
its 32 hex digits), for APIs whose names and tokens allow no ``_`` (Bedrock's).

Guarantee: a template is parsed once (``compiled`` keeps it) and filled by joining its
parts, so filling a call costs a few string joins; a placeholder with no value for the
call refuses the call (``UnsafePathValue``), never sends the braces. Which placeholders a
table may use is checked at load (``providers.fields.check_template``). Pure.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from reconciler.core.errors import UnsafePathValue

JOB_ID = "job_id"
IDEMPOTENCY_KEY = "idempotency_key"
IDEMPOTENCY_KEY_ALNUM = "idempotency_key_alnum"
OPERATION_ID = "operation_id"
TRACE_ID = "trace_id"
WEBHOOK_URL = "webhook_url"
RESULT_REF = "result_ref"
ERRORS_REF = "errors_ref"
# The placeholders that carry the operation's idempotency key, in either form.
KEY_FIELDS = frozenset({IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_ALNUM})
# What the create call can fill (it has no job id yet).
REQUEST_FIELDS = KEY_FIELDS | {OPERATION_ID, TRACE_ID, WEBHOOK_URL}
# What every call about a job can fill.
CALL_FIELDS = REQUEST_FIELDS | {JOB_ID}

Values = Mapping[str, "str | None"]


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text and placeholder names, alternating."""

    text: str
    literals: tuple[str, ...]  # one more than ``names``
    names: tuple[str, ...]

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(self.names)

    def fill(self, values: Values, encode: Callable[[str, str], str] | None = None) -> str:
        """The text with each placeholder's value (``encode(value, name)`` first, if given)."""
        if not self.names:
            return self.literals[0]
        out = [self.literals[0]]
        for name, literal in zip(self.names, self.literals[1:], strict=True):
            value = values.get(name)
            if value is None:
                raise UnsafePathValue(f"{{{name}}} has no value for this call")
            out.append(encode(value, name) if encode is not None else value)
            out.append(literal)
        return "".join(out)


@lru_cache(maxsize=4096)
def compiled(text: str) -> Template:
    """``text`` parsed (once per distinct text). A template that does not parse raises
    ``ValueError``; the load-time checks have refused such a file before any call."""
    literals, names = [""], []
    for literal, name, _, _ in string.Formatter().parse(text):
        literals[-1] += literal
        if name is not None:
            names.append(name)
            literals.append("")
    return Template(text, tuple(literals), tuple(names))


_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def alnum_key(key: str) -> str:
    """``{idempotency_key_alnum}``: the key without the characters that are not letters or
    digits (``idem_`` + hex becomes ``idem`` + hex: still one key per operation)."""
    return _NOT_ALNUM.sub("", key)


def template_fields(text: str) -> frozenset[str]:
    """The placeholders ``text`` uses."""
    return compiled(text).fields


def value_fields(value: Any) -> frozenset[str]:
    """The placeholders used by the strings of a JSON value (nested ones too)."""
    if isinstance(value, str):
        return template_fields(value)
    if isinstance(value, list | tuple):
        return frozenset().union(*(value_fields(v) for v in value))
    if isinstance(value, dict):
        return frozenset().union(*(value_fields(v) for v in value.values()))
    return frozenset()


def render(value: Any, values: Values) -> Any:
    """A JSON value with every string in it (nested too) filled as a template."""
    if isinstance(value, str):
        return compiled(value).fill(values)
    if isinstance(value, list | tuple):
        return [render(v, values) for v in value]
    if isinstance(value, dict):
        return {k: render(v, values) for k, v in value.items()}
    return value

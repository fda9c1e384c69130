"""JSON Pointer (RFC 6901) over parsed JSON values.

Resolution never raises: whatever shape a provider sends, a pointer that does
not lead anywhere yields ``MISSING``. Only the pointer text itself can be
invalid, and that is caught when a provider file is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from reconciler.core.errors import PointerSyntaxError


class _Missing(Enum):
    """Distinct from JSON ``null``: the document has no value at the pointer."""

    MISSING = "missing"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing.MISSING


def _unescape(token: str, text: str) -> str:
    # Only "~0" and "~1" are escapes; any other "~" makes the pointer invalid (RFC 6901 s3).
    index = token.find("~")
    while index != -1:
        if index + 1 >= len(token) or token[index + 1] not in "01":
            raise PointerSyntaxError(f"{text!r}: '~' must be followed by 0 or 1")
        index = token.find("~", index + 2)
    # "~1" first, then "~0", so that "~01" decodes to "~1" and not to "/".
    return token.replace("~1", "/").replace("~0", "~")


def split_pointer(text: str) -> tuple[str, ...]:
    """Reference tokens of ``text``; ``""`` is the whole document."""
    if text == "":
        return ()
    if not text.startswith("/"):
        raise PointerSyntaxError(f"{text!r}: a JSON pointer is empty or starts with '/'")
    return tuple(_unescape(token, text) for token in text[1:].split("/"))


def _array_index(token: str, length: int) -> int | None:
    # RFC 6901: decimal digits without leading zeros; "-" names the element past the end.
    if not token or not token.isascii() or not token.isdigit():
        return None
    if len(token) > 1 and token[0] == "0":
        return None
    index = int(token)
    return index if index < length else None


def resolve_tokens(document: Any, tokens: tuple[str, ...]) -> Any:
    current = document
    for token in tokens:
        if isinstance(current, dict):
            if token not in current:
                return MISSING
            current = current[token]
        elif isinstance(current, list):
            index = _array_index(token, len(current))
            if index is None:
                return MISSING
            current = current[index]
        else:
            return MISSING
    return current


@dataclass(frozen=True)
class Pointer:
    """A parsed pointer; ``str()`` gives the text it was written as."""

    text: str
    tokens: tuple[str, ...] = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Pointer:
        return cls(text, split_pointer(text))

    def resolve(self, document: Any) -> Any:
        """The value at this pointer, or ``MISSING``."""
        return resolve_tokens(document, self.tokens)

    def get(self, document: Any, default: Any = None) -> Any:
        """The value at this pointer, or ``default`` when absent."""
        value = self.resolve(document)
        return default if value is MISSING else value

    def __str__(self) -> str:
        return self.text


def resolve(document: Any, pointer: str | Pointer) -> Any:
    """Resolve ``pointer`` (text or parsed) in ``document``; ``MISSING`` when absent."""
    parsed = pointer if isinstance(pointer, Pointer) else Pointer.parse(pointer)
    return parsed.resolve(document)

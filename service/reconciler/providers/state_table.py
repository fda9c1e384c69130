"""What a provider's status body means for us: its state word and a few declared rules.

Pure and total: any JSON value in any place classifies to a ``RemoteCategory``
without raising. Words match exactly, case included: a provider's state words
are its contract, and folding ``"Paused"`` into ``"paused"`` (or trimming a
space) would accept a word nobody listed, which is what ``unknown`` exists to
stop.

State words come from the value at ``[status].state``: a JSON string is the
word itself, ``true``/``false`` become ``"true"``/``"false"`` and an integer its
decimal text, so a Google long-running operation can list ``pending = ["false"]``
and ``success = ["true"]``. Anything else (null, absent, object, array,
fraction) gives no word, hence ``unknown`` unless a rule decides.

Rules (``[status].rules``, a list of inline tables) are checked in order before
the word table and the first match decides::

    rules = [
      { pointer = "/done", present = false, category = "pending" },
      { if_state = "true", pointer = "/error/code", equals = 1, category = "cancelled" },
      { if_state = "true", pointer = "/error", present = true, category = "failure" },
    ]

Each rule has a ``pointer``, exactly one test (``present = true|false``,
``equals = <scalar>`` or ``in = [<scalars>]``), a ``category`` and, optionally,
``if_state`` to apply only when the state word is that word. ``present = true``
means the pointer leads to a value other than null. Equality is JSON equality:
``1`` equals ``1.0`` but never ``true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.errors import ConfigError, PointerSyntaxError
from reconciler.core.vocabulary import RemoteCategory
from reconciler.providers.pointer import MISSING, Pointer

# The categories a provider file may list words under; everything else is unknown.
LISTABLE: tuple[RemoteCategory, ...] = tuple(c for c in RemoteCategory if c != "unknown")
_MAX_INT_BITS = 256  # beyond this an integer is no plausible state code (and str() may refuse)

Scalar = str | int | float | bool
# The keys of one ``[status] rules`` entry.
RULE_KEYS = ("pointer", "category", "if_state", "present", "equals", "in")


def state_word(value: Any) -> str | None:
    """The state word a JSON value stands for, or None when it stands for none."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() <= _MAX_INT_BITS:
        return str(value)
    return None


def json_equal(value: Any, expected: Scalar) -> bool:
    """JSON equality against a scalar: numbers by value, but a boolean is never a number."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value is expected
    if isinstance(expected, int | float):
        return isinstance(value, int | float) and value == expected
    return isinstance(value, str) and value == expected


@dataclass(frozen=True)
class StateTable:
    """Exact state words per category, as listed in a provider's ``[states]`` table."""

    entries: tuple[tuple[str, RemoteCategory], ...] = ()
    _lookup: dict[str, RemoteCategory] = field(
        default_factory=dict, init=False, compare=False, repr=False, hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lookup", dict(self.entries))

    def category_of(self, word: str | None) -> RemoteCategory:
        if word is None:
            return RemoteCategory.UNKNOWN
        return self._lookup.get(word, RemoteCategory.UNKNOWN)

    def words(self, category: RemoteCategory) -> tuple[str, ...]:
        return tuple(w for w, c in self.entries if c is category)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> StateTable:
        """Build from a ``[states]`` table; ``where`` is the message prefix naming file and key."""
        known = {c.value for c in LISTABLE}
        seen: dict[str, RemoteCategory] = {}
        for key, words in data.items():
            if key not in known:
                problem = (
                    "leave unknown words out: anything unlisted is unknown"
                    if key == RemoteCategory.UNKNOWN
                    else f"unknown category (known: {', '.join(sorted(known))})"
                )
                raise ConfigError(f"{where}.{key}: {problem}")
            category = RemoteCategory(key)
            if not isinstance(words, list):
                raise ConfigError(f"{where}.{key}: expected a list of state words")
            for word in words:
                if not isinstance(word, str) or not word:
                    raise ConfigError(f"{where}.{key}: state words must be non-empty strings")
                if word in seen:
                    raise ConfigError(
                        f"{where}.{key}: {word!r} is already listed under {seen[word].value}"
                    )
                seen[word] = category
        if not any(c is RemoteCategory.SUCCESS for c in seen.values()):
            raise ConfigError(f"{where}.success: list at least one success state")
        return cls(tuple(seen.items()))


@dataclass(frozen=True)
class StateRule:
    """One declared test on the status body; see the module docstring."""

    pointer: Pointer
    category: RemoteCategory
    if_state: str | None = None
    present: bool | None = None
    equals_any: tuple[Scalar, ...] = ()

    def matches(self, body: Any, word: str | None) -> bool:
        if self.if_state is not None and word != self.if_state:
            return False
        value = self.pointer.resolve(body)
        if self.present is not None:
            return (value is not MISSING and value is not None) is self.present
        return any(json_equal(value, expected) for expected in self.equals_any)

    @classmethod
    def from_table(cls, data: Any, where: str) -> StateRule:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an inline table such as {{ pointer = ... }}")
        allowed = set(RULE_KEYS)
        for key in data:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise ConfigError(f"{where}.{key}: unknown key (known: {known})")
        tests = [k for k in ("present", "equals", "in") if k in data]
        if len(tests) != 1:
            raise ConfigError(f"{where}: give exactly one of present, equals, in")
        rule = cls(
            pointer=_rule_pointer(data.get("pointer"), f"{where}.pointer"),
            category=_rule_category(data.get("category"), f"{where}.category"),
            if_state=_rule_if_state(data.get("if_state"), f"{where}.if_state"),
            present=_rule_present(data.get("present"), f"{where}.present"),
            equals_any=_rule_values(data, where),
        )
        return rule


def _rule_pointer(value: Any, where: str) -> Pointer:
    if value is None:
        raise ConfigError(f"{where}: required")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a JSON pointer string")
    try:
        return Pointer.parse(value)
    except PointerSyntaxError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None


def _rule_category(value: Any, where: str) -> RemoteCategory:
    names = ", ".join(c.value for c in RemoteCategory)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: required, one of {names}")
    try:
        return RemoteCategory(value)
    except ValueError:
        raise ConfigError(f"{where}: expected one of {names}") from None


def _rule_if_state(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise ConfigError(f"{where}: expected a non-empty state word")


def _rule_present(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected true or false")


def _scalar(value: Any, where: str) -> Scalar:
    if isinstance(value, str | int | float | bool):
        return value
    raise ConfigError(f"{where}: expected a string, number or boolean")


def _rule_values(data: Mapping[str, Any], where: str) -> tuple[Scalar, ...]:
    if "equals" in data:
        return (_scalar(data["equals"], f"{where}.equals"),)
    if "in" in data:
        values = data["in"]
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.in: expected a non-empty list")
        return tuple(_scalar(v, f"{where}.in[{i}]") for i, v in enumerate(values))
    return ()


@dataclass(frozen=True)
class Classification:
    """The verdict on one status body; ``rule`` is the index of the deciding rule, if any."""

    word: str | None
    category: RemoteCategory
    rule: int | None = None


def classify(
    body: Any, state: Pointer, table: StateTable, rules: tuple[StateRule, ...] = ()
) -> Classification:
    """Classify a parsed status body. Never raises."""
    word = state_word(state.resolve(body))
    for index, rule in enumerate(rules):
        if rule.matches(body, word):
            return Classification(word, rule.category, index)
    return Classification(word, table.category_of(word))

"""The base of every table in a provider file: strict, frozen, and only the keys it knows.

Guarantee: a pasted secret is refused before anything else about its table (the
message names the ``*_env`` key to use instead and never the value), and an unknown
key is refused naming the keys the table does know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from reconciler.providers.fields import SECRET, problem

# Keys that would hold a secret value; the message points at the *_env key to use instead.
SECRET_KEYS = {
    "token": "token_env",
    "value": "value_env",
    "secret": "secrets_env",
    "secrets": "secrets_env",
    "password": "an *_env key",
    "api_key": "an *_env key",
    "apikey": "an *_env key",
    "client_secret": "an *_env key",
}


class FileTable(BaseModel):
    """One table of a provider file: strict, frozen, and every key it may hold is a field.

    Before its fields are read, a table refuses a pasted secret (first, so the
    message is about the secret even when other keys are wrong too) and any key it
    does not know, naming the keys it does.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, validate_by_name=False)

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        """The keys a file may write in this table (aliases where a field has one)."""
        return tuple(
            f.alias or name for name, f in cls.model_fields.items() if name not in NOT_IN_FILE
        )

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise problem("expected a table")
        for key in data:
            if key in SECRET_KEYS:
                raise PydanticCustomError(
                    SECRET,
                    "{problem}",
                    {
                        "key": key,
                        "problem": "secrets may not be written in provider files; put the "
                        "value in an environment variable and name it with "
                        f"{SECRET_KEYS[key]}",
                    },
                )
        known = cls.file_keys()
        from_code = info.context is None  # a file is always read with the loader's context
        for key in data:
            if key not in known and not (from_code and key in cls.model_fields):
                raise problem(f"unknown key (known here: {', '.join(sorted(known))})", key)
        return cls.complete(dict(data), info.context or {})

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults that depend on other keys of the table, filled in before validation."""
        return data


# Filled in by the loader, never written in a file.
NOT_IN_FILE = frozenset({"name", "source", "webhook_url"})

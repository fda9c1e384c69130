"""The base of every table in a provider file: strict, frozen, and only the keys it knows.

Guarantee: a pasted secret is refused before anything else about its table (the
message names the ``*_env`` key to use instead and never the value), and an unknown
key is refused naming the keys the table does know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic_core import PydanticCustomError

from reconciler.core.file_values import SECRET, StrictTable

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


class FileTable(StrictTable):
    """One table of a provider file: strict, frozen, and every key it may hold is a field.

    Before its fields are read, a table refuses a pasted secret (first, so the
    message is about the secret even when other keys are wrong too) and any key it
    does not know, naming the keys it does (``core.file_values.StrictTable``).
    """

    # Filled in by the loader, never written in a file.
    NOT_IN_FILE: ClassVar[frozenset[str]] = frozenset({"name", "source", "webhook_url"})

    @classmethod
    def refuse(cls, data: Mapping[str, Any]) -> None:
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

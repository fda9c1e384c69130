"""Credentials that are a header's value: from the environment (read once, at load), or
from a file read again whenever it changes (a mounted secret that rotates)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import httpx

from reconciler.config import Secret
from reconciler.core.errors import CredentialUnavailable
from reconciler.providers.credentials.credential import Credential, env_secret
from reconciler.providers.sections import AuthSpec, AuthType

MAX_TOKEN_FILE_BYTES = 65_536


class EnvHeader(Credential):
    """A header whose value came from an environment variable at load."""

    def __init__(self, header: str, value: Secret, source: str) -> None:
        self._header = header
        self._value = value
        self.source = source

    def static_header(self) -> tuple[str, str] | None:
        return self._header, self._value.reveal()

    async def apply(self, request: httpx.Request) -> None:
        request.headers[self._header] = self._value.reveal()


class FileHeader(Credential):
    """A header whose value is a file's content, read again when the file changes.

    The file's identity (inode, size, modification time) is looked at on every call, a
    system call; its content is read only when that changed. A file that cannot be
    read keeps the last value read; with none, the call is not sent.
    """

    def __init__(self, header: str, prefix: str, path: str, source: str) -> None:
        self._header = header
        self._prefix = prefix
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._value: Secret | None = None
        self.source = source

    async def apply(self, request: httpx.Request) -> None:
        self._read(force=False)
        assert self._value is not None  # _read raises when there is none
        request.headers[self._header] = self._prefix + self._value.reveal()

    async def renew(self) -> bool:
        before = self._value
        self._read(force=True)
        return self._value != before

    def _read(self, *, force: bool) -> None:
        try:
            stat = os.stat(self._path)
            seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if not force and seen == self._seen and self._value is not None:
                return
            with open(self._path, "rb") as fh:
                data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
        except OSError as exc:
            if self._value is not None:
                return  # a rotation in progress: the last value stands
            raise CredentialUnavailable(
                f"cannot read the token file {self._path}: {exc.strerror}", refused=True
            ) from None
        text = data.decode("utf-8", errors="replace").strip()
        if not text or len(data) > MAX_TOKEN_FILE_BYTES or not text.isprintable():
            if self._value is not None:
                return
            raise CredentialUnavailable(
                f"the token file {self._path} is empty or not one line of text", refused=True
            )
        self._value, self._seen = Secret(text), seen


def static_credential(
    auth: AuthSpec, where: Callable[[str], str], environ: Mapping[str, str]
) -> Credential:
    """``bearer`` or ``header``, from the environment or from a file."""
    header = "Authorization" if auth.type is AuthType.BEARER else auth.header_name
    prefix = "Bearer " if auth.type is AuthType.BEARER else ""
    assert header is not None
    what = "bearer token" if auth.type is AuthType.BEARER else f"{header} header"
    if auth.token_file is not None:
        return FileHeader(
            header, prefix, auth.token_file, f"{what} from the file {auth.token_file}"
        )
    found = auth.env_key
    assert found is not None
    value = env_secret(where(f"auth.{found[0]}"), found[1], environ)
    source = f"{what} from environment variable {found[1]}"
    return EnvHeader(header, Secret(prefix + value.reveal()), source)

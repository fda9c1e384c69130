"""AWS Signature Version 4 over every request, through ``botocore`` (``reconciler[aws]``).

Credentials come from botocore's standard chain, as the AWS SDKs find them: the
environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), the
shared credentials and config files (``AWS_PROFILE``), a container role, an instance role.
Credentials that expire (roles) are refreshed by botocore before they do; a refresh can
reach the metadata service, so it runs in a worker thread. Each request is signed last,
over its method, URL, headers and body as they are sent, for the file's
``auth.service`` in ``auth.region``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio.to_thread
import httpx

from reconciler.core.errors import CredentialUnavailable
from reconciler.providers.credentials.credential import Credential

# What each ``Credentials.method`` of botocore's chain is, in words.
_SOURCES = {
    "env": "environment variables",
    "shared-credentials-file": "the shared credentials file",
    "custom-process": "a credential process",
    "config-file": "the shared config file",
    "assume-role": "an assumed role",
    "assume-role-with-web-identity": "a web identity role",
    "sso": "AWS IAM Identity Center (SSO)",
    "container-role": "the container role",
    "iam-role": "the instance role (metadata service)",
}
# What botocore adds to a request it signs; all of it is copied onto the one we send.
_SIGNED = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token", "X-Amz-Content-SHA256")


class AwsSigV4(Credential):
    def __init__(self, service: str, region: str, environ: Mapping[str, str]) -> None:
        self._service = service
        self._region = region
        self._environ = dict(environ)
        self._found: Any = None
        self.source = "the AWS credential chain (not obtained yet)"

    def renews_on(self, status: int | None, body: bytes | None) -> bool:
        # AWS says an expired session token with a 400 or a 403 as often as with a 401.
        expired = status in (400, 403) and b"ExpiredToken" in (body or b"")
        return status == 401 or expired

    async def apply(self, request: httpx.Request) -> None:
        frozen = await self._frozen()
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        signed = AWSRequest(
            method=request.method,
            url=str(request.url),
            data=request.content,
            headers=dict(request.headers.items()),
        )
        SigV4Auth(frozen, self._service, self._region).add_auth(signed)
        for name in _SIGNED:
            value = signed.headers.get(name)
            if value is not None:
                request.headers[name] = value

    async def renew(self) -> bool:
        self._found = None  # the chain is asked again: a role's new session, a new file
        await self._frozen()
        return True

    async def _frozen(self) -> Any:
        found = self._found
        if found is None:
            found = self._found = await anyio.to_thread.run_sync(self._find)
        refresh = getattr(found, "refresh_needed", None)
        if refresh is not None and refresh():
            return await anyio.to_thread.run_sync(self._refresh, found)
        return self._refresh(found)

    def _find(self) -> Any:
        import botocore.exceptions
        import botocore.session
        from botocore.credentials import EnvProvider

        try:
            # The injected environment first (what the service was given), then the chain
            # as the AWS SDKs walk it: files, container and instance roles.
            found = EnvProvider(environ=self._environ).load()
            if found is None:
                found = botocore.session.Session().get_credentials()
        except botocore.exceptions.BotoCoreError as exc:
            raise CredentialUnavailable(
                f"the AWS credential chain failed ({type(exc).__name__})", refused=True
            ) from None
        if found is None:
            raise CredentialUnavailable(
                "no AWS credentials found (environment, shared files, container or instance role)",
                refused=True,
            )
        self.source = "AWS credentials from " + _SOURCES.get(found.method, str(found.method))
        return found

    @staticmethod
    def _refresh(found: Any) -> Any:
        import botocore.exceptions

        try:
            return found.get_frozen_credentials()
        except botocore.exceptions.BotoCoreError as exc:
            raise CredentialUnavailable(
                f"the AWS credentials could not be refreshed ({type(exc).__name__})",
                refused=False,
            ) from None

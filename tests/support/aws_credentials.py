"""AWS credentials for a test, where botocore's chain finds them: the environment only.

``aws_sigv4`` asks botocore's standard chain (environment, shared files, container and
instance roles). A test gives it a key pair in the environment and closes every other
source: no shared files (they point at nothing), no profile, no metadata service (a
lookup there would wait for its timeout). The variables go into the process's
environment, where the chain reads them, and are taken out again afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

CLOSED_SOURCES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN")


def aws_environment(access_key_id: str, secret_access_key: str) -> dict[str, str]:
    """The variables that make the chain find exactly this key pair."""
    return {
        "AWS_ACCESS_KEY_ID": access_key_id,
        "AWS_SECRET_ACCESS_KEY": secret_access_key,
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@contextmanager
def aws_credentials(access_key_id: str, secret_access_key: str) -> Iterator[dict[str, str]]:
    """The key pair in the process's environment for the block; the variables set."""
    values = aws_environment(access_key_id, secret_access_key)
    with mock.patch.dict(os.environ, values):
        for name in CLOSED_SOURCES:
            os.environ.pop(name, None)
        yield values

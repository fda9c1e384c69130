"""Standard Webhooks signatures, as a provider computes them.

Written here rather than taken from the service (``reconciler.core.signatures``) so that
the service's verifier is checked against an implementation of its own; the tests also
verify these signatures with the ``standardwebhooks`` package. That package is a test
dependency only, so an installed wheel runs the sim without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The key of a ``whsec_`` secret (unpadded base64 accepted, as Standard Webhooks does)."""
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX) + "==")
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        # The message must not echo the secret.
        raise ValueError("webhook secret is not a valid whsec_ base64 secret")
    return key


def sign(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,`` and the base64 HMAC-SHA256."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")

"""Webhook signatures: the Standard Webhooks signer used for agent callbacks.

Verification of incoming provider webhooks (one small class per scheme)
lives below the signer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

WHSEC_PREFIX = "whsec_"


def decode_whsec(secret: str) -> bytes:
    """A Standard Webhooks secret is base64 after an optional ``whsec_`` prefix."""
    raw = secret[len(WHSEC_PREFIX) :] if secret.startswith(WHSEC_PREFIX) else secret
    return base64.b64decode(raw, validate=True)


def standard_v1_signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The base64 HMAC-SHA256 of ``id.timestamp.body`` (without the ``v1,`` prefix)."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_standard_webhook(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a Standard Webhooks delivery."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + standard_v1_signature(key, msg_id, timestamp, body),
    }

"""Each agent's own callback signing secret, derived from the service's key and a salt.

Guarantee: a callback that verifies with agent B's secret was signed by this
service for B; agent A's secret cannot produce it. The secret is never stored:
it is HMAC-SHA256(service key, label + salt), where the salt is random per
token and rotation draws a new one (the database holds only salts, which are
worthless without the service key). Pure: bytes in, bytes out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

WHSEC_PREFIX = "whsec_"
_LABEL = b"reconciler agent callback secret v1\x00"
SALT_BYTES = 16
# The previous salt of a token whose callbacks were signed with the shared secret.
SHARED = ""


def new_salt() -> str:
    return secrets.token_hex(SALT_BYTES)


def agent_key(service_key: bytes, salt: str) -> bytes:
    """The agent's HMAC key; the legacy ``SHARED`` salt means the service key itself."""
    if salt == SHARED:
        return service_key
    return hmac.new(service_key, _LABEL + salt.encode("ascii"), hashlib.sha256).digest()


def as_whsec(key: bytes) -> str:
    """The key as a Standard Webhooks secret, the form receivers' libraries take."""
    return WHSEC_PREFIX + base64.b64encode(key).decode("ascii")

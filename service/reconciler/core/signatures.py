"""Webhook signatures: the Standard Webhooks signer used for agent callbacks.

Verification of incoming provider webhooks (one small class per scheme)
lives below the signer. ``reconciler.client`` verifies agents' callbacks with
the same ``StandardWebhooksVerifier``, so this module needs only the standard
library until an Ed25519 (``whpk_``) key is configured: ``cryptography`` is
imported then.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, Protocol

from reconciler.core.clock import Clock
from reconciler.core.errors import ConfigError, RejectReason, SignatureRejected

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

WHSEC_PREFIX = "whsec_"


def decode_whsec(secret: str) -> bytes:
    """A Standard Webhooks secret is base64 after an optional ``whsec_`` prefix."""
    raw = secret[len(WHSEC_PREFIX) :] if secret.startswith(WHSEC_PREFIX) else secret
    return base64.b64decode(raw, validate=True)


def standard_v1_signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The base64 HMAC-SHA256 of ``id.timestamp.body`` (without the ``v1,`` prefix)."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_standard_webhook(
    key: bytes, msg_id: str, timestamp: int, body: bytes, *more_keys: bytes
) -> dict[str, str]:
    """The three headers of a Standard Webhooks delivery, one signature per key.

    Several signatures in one header (space-separated) are how a receiver rotating its
    secret verifies with either the old or the new one.
    """
    signatures = " ".join(
        "v1," + standard_v1_signature(k, msg_id, timestamp, body) for k in (key, *more_keys)
    )
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }


# --- Verification of incoming provider webhooks -------------------------------------------
#
# Header lookup: verifiers call ``headers.get(name)`` with lower-case names only. Starlette's
# ``Headers`` is case-insensitive, so the receiver passes ``request.headers`` as it is; a plain
# ``dict`` must have lower-case keys.
#
# Parsing is strict on purpose: a header that is not exactly in its documented shape is a
# rejection, not a best guess, and every rejection is a ``SignatureRejected`` whose message
# names the header and the problem but never a secret or the received value (which is
# attacker-controlled and may not be safe to log).

DEFAULT_TOLERANCE_SECONDS = 300
MAX_SIGNATURES = 16
"""More entries than this in one header is a rejection; it bounds per-request work."""
MAX_EVENT_ID_CHARS = 256
_MAX_TIMESTAMP_DIGITS = 12
WHPK_PREFIX = "whpk_"
WHSK_PREFIX = "whsk_"
_HMAC_BYTES = 32
_HMAC_B64_CHARS = 44
_ED25519_SIG_BYTES = 64
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
_ASCII_DIGITS = frozenset("0123456789")


class WebhookScheme(StrEnum):
    STANDARD_WEBHOOKS = "standard-webhooks"
    STRIPE = "stripe"
    GITHUB = "github"
    HMAC_SHA256 = "hmac-sha256"


@dataclass(frozen=True, slots=True)
class Verified:
    """What a successful verification vouches for, beyond the body itself."""

    event_id: str | None
    timestamp: int | None


class Verifier(Protocol):
    def verify(self, headers: Mapping[str, str], body: bytes) -> Verified:
        """Return what was verified, or raise ``SignatureRejected``."""
        ...


def _malformed(header: str, problem: str) -> SignatureRejected:
    return SignatureRejected(RejectReason.MALFORMED_HEADER, f"{header} header {problem}")


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise SignatureRejected(RejectReason.MISSING_HEADER, f"{name} header is missing or empty")
    return value


def _event_id(value: str, header: str) -> str:
    # Printable ASCII only: the id is signed as bytes and later stored for dedup.
    if len(value) > MAX_EVENT_ID_CHARS or not (value.isascii() and value.isprintable()):
        raise _malformed(header, "is not a short printable ASCII identifier")
    return value


def _timestamp(value: str) -> int | None:
    # Canonical decimal only (no sign, spaces, "_", fraction, non-ASCII digits or leading
    # zero), so the signed text and the parsed number cannot disagree.
    if (
        not value
        or len(value) > _MAX_TIMESTAMP_DIGITS
        or not _ASCII_DIGITS.issuperset(value)
        or (value[0] == "0" and len(value) > 1)
    ):
        return None
    return int(value)


def _b64(value: str, size: int) -> bytes | None:
    """Padded standard base64 of exactly ``size`` bytes, else None."""
    if len(value) != (size + 2) // 3 * 4:
        return None
    try:
        decoded = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return decoded if len(decoded) == size else None


def _hex_digest(value: str) -> bytes | None:
    if _HEX_DIGEST.fullmatch(value) is None:
        return None
    return bytes.fromhex(value)


class _Window:
    """Timestamp tolerance in both directions, against the injected clock."""

    __slots__ = ("_clock", "_tolerance")

    def __init__(self, clock: Clock, tolerance_seconds: int) -> None:
        if isinstance(tolerance_seconds, bool) or not isinstance(tolerance_seconds, int):
            raise ConfigError("webhook tolerance_seconds must be an integer")
        if tolerance_seconds <= 0:
            raise ConfigError("webhook tolerance_seconds must be positive")
        self._clock = clock
        self._tolerance = tolerance_seconds

    def check(self, timestamp: int) -> None:
        if abs(self._clock.now().timestamp() - timestamp) > self._tolerance:
            raise SignatureRejected(
                RejectReason.TIMESTAMP_OUT_OF_TOLERANCE,
                "timestamp is outside the accepted window",
            )


class _HmacKeys:
    """HMAC-SHA256 keys, each keyed once; per call only the message is hashed."""

    __slots__ = ("_bases",)

    def __init__(self, keys: Sequence[bytes]) -> None:
        self._bases = tuple(hmac.new(key, digestmod=hashlib.sha256) for key in dict.fromkeys(keys))

    def __len__(self) -> int:
        return len(self._bases)

    def matches(self, candidates: Sequence[bytes], prefix: bytes, body: bytes) -> bool:
        for base in self._bases:
            mac = base.copy()
            mac.update(prefix)
            mac.update(body)
            expected = mac.digest()
            for candidate in candidates:
                if hmac.compare_digest(expected, candidate):
                    return True
        return False


def _utf8_keys(secrets: Sequence[str]) -> _HmacKeys:
    return _HmacKeys([secret.encode("utf-8") for secret in secrets])


class StandardWebhooksVerifier:
    """Standard Webhooks: ``v1,`` HMAC-SHA256 (``whsec_``) and ``v1a,`` Ed25519 (``whpk_``).

    Both sign ``{webhook-id}.{webhook-timestamp}.`` followed by the raw body bytes. The
    signature header holds space-separated ``version,base64`` entries; one match from any
    configured key verifies. Entries of unknown versions are skipped, but a malformed
    ``v1``/``v1a`` entry rejects the whole header.
    """

    scheme: ClassVar[WebhookScheme] = WebhookScheme.STANDARD_WEBHOOKS
    __slots__ = ("_ed25519", "_hmac", "_window")

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        clock: Clock,
        tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    ) -> None:
        hmac_keys: list[bytes] = []
        public_keys: list[Ed25519PublicKey] = []
        for position, secret in enumerate(_secret_list(secrets), start=1):
            if secret.startswith(WHPK_PREFIX):
                public_keys.append(_whpk(secret, position))
            else:
                hmac_keys.append(_whsec(secret, position))
        self._hmac = _HmacKeys(hmac_keys)
        self._ed25519 = tuple(public_keys)
        self._window = _Window(clock, tolerance_seconds)

    def __repr__(self) -> str:
        counts = f"hmac_keys={len(self._hmac)}, ed25519_keys={len(self._ed25519)}"
        return f"StandardWebhooksVerifier({counts})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> Verified:
        msg_id = _event_id(_required(headers, "webhook-id"), "webhook-id")
        raw_timestamp = _required(headers, "webhook-timestamp")
        timestamp = _timestamp(raw_timestamp)
        if timestamp is None:
            raise _malformed("webhook-timestamp", "is not a Unix timestamp in whole seconds")
        macs, signatures = _standard_entries(_required(headers, "webhook-signature"))
        if not ((macs and self._hmac) or (signatures and self._ed25519)):
            raise SignatureRejected(
                RejectReason.NO_USABLE_SIGNATURE,
                "webhook-signature has no entry for a configured key type",
            )
        self._window.check(timestamp)
        prefix = f"{msg_id}.{raw_timestamp}.".encode("ascii")
        if self._hmac.matches(macs, prefix, body) or self._ed25519_matches(
            signatures, prefix, body
        ):
            return Verified(event_id=msg_id, timestamp=timestamp)
        raise SignatureRejected(RejectReason.SIGNATURE_MISMATCH, "no signature matched")

    def _ed25519_matches(self, signatures: Sequence[bytes], prefix: bytes, body: bytes) -> bool:
        if not signatures or not self._ed25519:
            return False
        from cryptography.exceptions import InvalidSignature

        message = prefix + body
        for key in self._ed25519:
            for signature in signatures:
                try:
                    key.verify(signature, message)
                except InvalidSignature:
                    continue
                return True
        return False


def _standard_entries(value: str) -> tuple[list[bytes], list[bytes]]:
    entries = value.split(" ", MAX_SIGNATURES)
    if len(entries) > MAX_SIGNATURES:
        raise _malformed("webhook-signature", "has too many entries")
    macs: list[bytes] = []
    signatures: list[bytes] = []
    for entry in entries:
        version, comma, payload = entry.partition(",")
        if not (version and comma and payload):
            raise _malformed("webhook-signature", "has an entry that is not version,signature")
        if version == "v1":
            mac = _b64(payload, _HMAC_BYTES)
            if mac is None:
                raise _malformed("webhook-signature", "has a v1 entry that is not 32 bytes base64")
            macs.append(mac)
        elif version == "v1a":
            signature = _b64(payload, _ED25519_SIG_BYTES)
            if signature is None:
                raise _malformed("webhook-signature", "has a v1a entry that is not 64 bytes base64")
            signatures.append(signature)
    return macs, signatures


class StripeVerifier:
    """Stripe style: ``Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...]``.

    ``v1`` is the hex HMAC-SHA256 of ``{t}.`` followed by the raw body, keyed with the secret
    string's UTF-8 bytes as given (``whsec_`` included). Other keys such as ``v0`` are skipped.
    """

    scheme: ClassVar[WebhookScheme] = WebhookScheme.STRIPE
    __slots__ = ("_hmac", "_window")

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        clock: Clock,
        tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    ) -> None:
        self._hmac = _utf8_keys(_secret_list(secrets))
        self._window = _Window(clock, tolerance_seconds)

    def __repr__(self) -> str:
        return f"StripeVerifier(keys={len(self._hmac)})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> Verified:
        raw_timestamp, macs = _stripe_items(_required(headers, "stripe-signature"))
        timestamp = _timestamp(raw_timestamp)
        if timestamp is None:
            raise _malformed("stripe-signature", "t is not a Unix timestamp in whole seconds")
        if not macs:
            raise SignatureRejected(
                RejectReason.NO_USABLE_SIGNATURE, "stripe-signature has no v1 entry"
            )
        self._window.check(timestamp)
        if self._hmac.matches(macs, f"{raw_timestamp}.".encode("ascii"), body):
            return Verified(event_id=None, timestamp=timestamp)
        raise SignatureRejected(RejectReason.SIGNATURE_MISMATCH, "no signature matched")


def _stripe_items(value: str) -> tuple[str, list[bytes]]:
    items = value.split(",", MAX_SIGNATURES)
    if len(items) > MAX_SIGNATURES:
        raise _malformed("stripe-signature", "has too many entries")
    raw_timestamp: str | None = None
    macs: list[bytes] = []
    for item in items:
        key, equals, item_value = item.partition("=")
        if not (key and equals and item_value):
            raise _malformed("stripe-signature", "has an entry that is not key=value")
        if key == "t":
            if raw_timestamp is not None:
                raise _malformed("stripe-signature", "has more than one t")
            raw_timestamp = item_value
        elif key == "v1":
            mac = _hex_digest(item_value)
            if mac is None:
                raise _malformed("stripe-signature", "has a v1 entry that is not 64 hex digits")
            macs.append(mac)
    if raw_timestamp is None:
        raise _malformed("stripe-signature", "has no t")
    return raw_timestamp, macs


class GitHubVerifier:
    """GitHub style: ``X-Hub-Signature-256: sha256=<hex>`` over the raw body.

    There is no timestamp; replay protection is dedup on ``X-GitHub-Delivery``, which is
    therefore required and returned as the event id.
    """

    scheme: ClassVar[WebhookScheme] = WebhookScheme.GITHUB
    __slots__ = ("_hmac",)

    def __init__(self, secrets: Sequence[str]) -> None:
        self._hmac = _utf8_keys(_secret_list(secrets))

    def __repr__(self) -> str:
        return f"GitHubVerifier(keys={len(self._hmac)})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> Verified:
        value = _required(headers, "x-hub-signature-256")
        delivery = _event_id(_required(headers, "x-github-delivery"), "x-github-delivery")
        mac = _hex_digest(value[7:]) if value.startswith("sha256=") else None
        if mac is None:
            raise _malformed("x-hub-signature-256", "is not sha256= and 64 hex digits")
        if self._hmac.matches((mac,), b"", body):
            return Verified(event_id=delivery, timestamp=None)
        raise SignatureRejected(RejectReason.SIGNATURE_MISMATCH, "no signature matched")


class HmacSha256Verifier:
    """Generic: one header with the HMAC-SHA256 of the raw body, keyed with the UTF-8 secret.

    The value is one or more comma-separated signatures, each with an optional ``sha256=``
    prefix and either 64 hex digits (any case) or 44 characters of padded standard base64.
    The two encodings cannot be confused: 64 base64 characters would be 48 bytes, not 32.
    There is no timestamp and no id; replay protection must come from the body's event id.
    """

    scheme: ClassVar[WebhookScheme] = WebhookScheme.HMAC_SHA256
    __slots__ = ("_header", "_hmac")

    def __init__(self, secrets: Sequence[str], *, signature_header: str = "x-signature") -> None:
        header = signature_header.lower()
        if _HEADER_NAME.fullmatch(header) is None:
            raise ConfigError("webhook signature_header is not a valid HTTP header name")
        self._header = header
        self._hmac = _utf8_keys(_secret_list(secrets))

    def __repr__(self) -> str:
        return f"HmacSha256Verifier(header={self._header!r}, keys={len(self._hmac)})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> Verified:
        macs = _generic_items(_required(headers, self._header), self._header)
        if self._hmac.matches(macs, b"", body):
            return Verified(event_id=None, timestamp=None)
        raise SignatureRejected(RejectReason.SIGNATURE_MISMATCH, "no signature matched")


def _generic_items(value: str, header: str) -> list[bytes]:
    items = value.split(",", MAX_SIGNATURES)
    if len(items) > MAX_SIGNATURES:
        raise _malformed(header, "has too many entries")
    macs: list[bytes] = []
    for item in items:
        encoded = item.strip(" \t").removeprefix("sha256=")
        if len(encoded) == _HMAC_B64_CHARS:
            mac = _b64(encoded, _HMAC_BYTES)
        else:
            mac = _hex_digest(encoded)
        if mac is None:
            raise _malformed(header, "has an entry that is not a hex or base64 SHA-256 HMAC")
        macs.append(mac)
    return macs


def _secret_list(secrets: Sequence[str]) -> Sequence[str]:
    # A bare string is a Sequence[str] too; iterating it would make one key per character.
    if isinstance(secrets, str) or not secrets:
        raise ConfigError("webhook secrets must be a non-empty list of strings")
    for position, secret in enumerate(secrets, start=1):
        if not isinstance(secret, str) or not secret:
            raise ConfigError(f"webhook secret #{position} is empty or not a string")
    return secrets


def _whsec(secret: str, position: int) -> bytes:
    if secret.startswith(WHSK_PREFIX):
        raise ConfigError(
            f"webhook secret #{position} is a whsk_ signing key; configure its whpk_ public key"
        )
    if not secret.startswith(WHSEC_PREFIX):
        raise ConfigError(
            f"webhook secret #{position} must start with whsec_ or whpk_ for standard-webhooks"
        )
    try:
        key = decode_whsec(secret)
    except (binascii.Error, ValueError):
        raise ConfigError(f"webhook secret #{position} is not valid base64 after whsec_") from None
    if not key:
        raise ConfigError(f"webhook secret #{position} is empty after whsec_")
    return key


def _whpk(secret: str, position: int) -> Ed25519PublicKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        raw = base64.b64decode(secret[len(WHPK_PREFIX) :], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ConfigError(
            f"webhook secret #{position} is not a base64 32-byte Ed25519 key after whpk_"
        ) from None


def build_verifier(
    scheme: str,
    secrets: Sequence[str],
    *,
    clock: Clock,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    signature_header: str | None = None,
) -> Verifier:
    """The verifier for a provider's ``[webhook]`` table; bad configuration is a ConfigError.

    ``tolerance_seconds`` applies to the schemes with a timestamp; ``signature_header`` only
    to ``hmac-sha256`` (elsewhere it is refused rather than silently ignored).
    """
    try:
        kind = WebhookScheme(scheme)
    except ValueError:
        known = ", ".join(s.value for s in WebhookScheme)
        raise ConfigError(f"unknown webhook scheme; expected one of: {known}") from None
    if signature_header is not None and kind is not WebhookScheme.HMAC_SHA256:
        raise ConfigError("webhook signature_header applies only to the hmac-sha256 scheme")
    if kind is WebhookScheme.STANDARD_WEBHOOKS:
        return StandardWebhooksVerifier(secrets, clock=clock, tolerance_seconds=tolerance_seconds)
    if kind is WebhookScheme.STRIPE:
        return StripeVerifier(secrets, clock=clock, tolerance_seconds=tolerance_seconds)
    if kind is WebhookScheme.GITHUB:
        return GitHubVerifier(secrets)
    return HmacSha256Verifier(secrets, signature_header=signature_header or "x-signature")

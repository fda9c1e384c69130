"""Webhook signature verifiers, checked against signatures made independently of our code.

Standard Webhooks signatures come from the ``standardwebhooks`` package; Stripe, GitHub and
generic ones from ``hmac``/``hashlib`` directly; Ed25519 ones from ``cryptography`` directly.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook
from starlette.datastructures import Headers

from reconciler.core.clock import ManualClock
from reconciler.core.errors import ConfigError, RejectReason, SignatureRejected
from reconciler.core.signatures import (
    GitHubVerifier,
    HmacSha256Verifier,
    StandardWebhooksVerifier,
    StripeVerifier,
    Verified,
    Verifier,
    build_verifier,
    decode_whsec,
    sign_standard_webhook,
)

# The published Standard Webhooks test vector.
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TS = 1614265330
SW_BODY = b'{"test": 2432232314}'
SW_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
SW_OTHER_SECRET = "whsec_" + base64.b64encode(b"another secret of 24 b!!").decode()

# GitHub's documented example.
GH_SECRET = "It's a Secret to Everybody"
GH_BODY = b"Hello, World!"
GH_SIG = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
GH_DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"

STRIPE_SECRET = "whsec_stripe_style_secret_used_as_is"
GENERIC_SECRET = "generic shared secret"

NON_UTF8 = b"\xff\xfe\x80 not utf-8 \xc3\x28"


def at(ts: int) -> ManualClock:
    return ManualClock(datetime.fromtimestamp(ts, UTC))


def sw_lib_sign(secret: str, msg_id: str, ts: int, body: str) -> str:
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, UTC), body)


def sw_hmac_sign(secret: str, msg_id: str, ts: int | str, body: bytes) -> str:
    """For bodies the package cannot sign (it takes text): straight from hmac."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def stripe_header(secret: str, ts: int, body: bytes) -> str:
    return f"t={ts},v1={hex_hmac(secret, f'{ts}.'.encode() + body)}"


def sw_headers(sig: str = SW_SIG, msg_id: str = SW_ID, ts: int | str = SW_TS) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": sig}


def sw_verifier(*secrets: str, now: int = SW_TS) -> StandardWebhooksVerifier:
    return StandardWebhooksVerifier(list(secrets or (SW_SECRET,)), clock=at(now))


def reject(verifier: Verifier, headers: Mapping[str, str], body: bytes) -> SignatureRejected:
    with pytest.raises(SignatureRejected) as info:
        verifier.verify(headers, body)
    assert type(info.value) is SignatureRejected
    return info.value


# --- Standard Webhooks: independent vectors -----------------------------------------------


def test_published_standard_webhooks_vector_verifies() -> None:
    verified = sw_verifier().verify(sw_headers(), SW_BODY)
    assert verified == Verified(event_id=SW_ID, timestamp=SW_TS)


@pytest.mark.parametrize(
    "body",
    ['{"type":"job.done","data":{"job_id":"job_7ad2"}}', "", "ünïcödé ✓ 日本語", "x" * 5000],
)
def test_package_signed_deliveries_verify(body: str) -> None:
    sig = sw_lib_sign(SW_OTHER_SECRET, "msg_abc", SW_TS + 17, body)
    verifier = sw_verifier(SW_OTHER_SECRET)
    verified = verifier.verify(sw_headers(sig, "msg_abc", SW_TS + 17), body.encode())
    assert verified == Verified(event_id="msg_abc", timestamp=SW_TS + 17)


@settings(max_examples=150)
@given(
    msg_id=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64),
    body=st.text(max_size=300),
    skew=st.integers(-300, 300),
)
def test_package_signatures_verify_for_any_id_and_body(msg_id: str, body: str, skew: int) -> None:
    sig = sw_lib_sign(SW_SECRET, msg_id, SW_TS + skew, body)
    verified = sw_verifier().verify(sw_headers(sig, msg_id, SW_TS + skew), body.encode())
    assert verified.event_id == msg_id


def test_our_signer_verifies_with_the_standardwebhooks_package() -> None:
    # The package checks the timestamp against the wall clock; that is its API, not ours.
    ts = int(time.time())
    body = b'{"type":"operation.completed"}'
    headers = sign_standard_webhook(decode_whsec(SW_SECRET), "msg_ours", ts, body)
    assert Webhook(SW_SECRET).verify(body, headers) == {"type": "operation.completed"}
    assert sw_verifier(now=ts).verify(headers, body).event_id == "msg_ours"


def test_our_signer_matches_the_published_vector() -> None:
    headers = sign_standard_webhook(decode_whsec(SW_SECRET), SW_ID, SW_TS, SW_BODY)
    assert headers["webhook-signature"] == SW_SIG


def test_non_utf8_body_is_verified_as_raw_bytes() -> None:
    sig = sw_hmac_sign(SW_SECRET, SW_ID, SW_TS, NON_UTF8)
    assert sw_verifier().verify(sw_headers(sig), NON_UTF8).timestamp == SW_TS
    assert reject(sw_verifier(), sw_headers(sig), NON_UTF8 + b"!").reason is (
        RejectReason.SIGNATURE_MISMATCH
    )


def test_starlette_headers_are_looked_up_case_insensitively() -> None:
    headers = Headers(headers={k.title(): v for k, v in sw_headers().items()})
    assert sw_verifier().verify(headers, SW_BODY).event_id == SW_ID


def test_plain_dict_keys_must_be_lower_case() -> None:
    headers = {k.title(): v for k, v in sw_headers().items()}
    assert reject(sw_verifier(), headers, SW_BODY).reason is RejectReason.MISSING_HEADER


# --- Standard Webhooks: Ed25519 (v1a) ------------------------------------------------------


@pytest.fixture
def ed_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def whpk(key: Ed25519PrivateKey) -> str:
    return "whpk_" + base64.b64encode(key.public_key().public_bytes_raw()).decode()


def v1a(key: Ed25519PrivateKey, msg_id: str, ts: int, body: bytes) -> str:
    return "v1a," + base64.b64encode(key.sign(f"{msg_id}.{ts}.".encode() + body)).decode()


def test_ed25519_v1a_signature_verifies(ed_key: Ed25519PrivateKey) -> None:
    verifier = sw_verifier(whpk(ed_key))
    verified = verifier.verify(sw_headers(v1a(ed_key, SW_ID, SW_TS, NON_UTF8)), NON_UTF8)
    assert verified == Verified(event_id=SW_ID, timestamp=SW_TS)


def test_ed25519_rejections(ed_key: Ed25519PrivateKey) -> None:
    other = Ed25519PrivateKey.generate()
    sig = v1a(ed_key, SW_ID, SW_TS, SW_BODY)
    verifier = sw_verifier(whpk(ed_key))
    mismatch = RejectReason.SIGNATURE_MISMATCH
    assert reject(verifier, sw_headers(sig), SW_BODY + b" ").reason is mismatch
    assert reject(verifier, sw_headers(sig, msg_id="msg_x"), SW_BODY).reason is mismatch
    assert reject(sw_verifier(whpk(other)), sw_headers(sig), SW_BODY).reason is mismatch
    # v1a only is unusable when only HMAC secrets are configured, and v1 when only whpk_.
    assert reject(sw_verifier(), sw_headers(sig), SW_BODY).reason is (
        RejectReason.NO_USABLE_SIGNATURE
    )
    assert reject(verifier, sw_headers(SW_SIG), SW_BODY).reason is (
        RejectReason.NO_USABLE_SIGNATURE
    )
    truncated = sig[:-4]
    assert reject(verifier, sw_headers(truncated), SW_BODY).reason is (
        RejectReason.MALFORMED_HEADER
    )


def test_mixed_keys_accept_either_kind(ed_key: Ed25519PrivateKey) -> None:
    verifier = sw_verifier(SW_SECRET, whpk(ed_key))
    ed_sig = v1a(ed_key, SW_ID, SW_TS, SW_BODY)
    assert verifier.verify(sw_headers(ed_sig), SW_BODY).event_id == SW_ID
    assert verifier.verify(sw_headers(SW_SIG), SW_BODY).event_id == SW_ID
    wrong_mac = sw_hmac_sign(SW_OTHER_SECRET, SW_ID, SW_TS, SW_BODY)
    assert verifier.verify(sw_headers(f"{wrong_mac} {ed_sig}"), SW_BODY).event_id == SW_ID


# --- Standard Webhooks: adversarial matrix -------------------------------------------------

VALID_B64 = SW_SIG[3:]
THIRTY_ONE_BYTES = base64.b64encode(bytes(31)).decode()
MALFORMED_SIGNATURES = {
    "bare version": "v1",
    "empty payload": "v1,",
    "two commas": "v1,a,b",
    "comma inside valid": f"v1,{VALID_B64[:10]},{VALID_B64[11:]}",
    "not base64": "v1,!!!!" + VALID_B64[4:],
    "truncated": SW_SIG[:-4],
    "31 bytes": "v1," + THIRTY_ONE_BYTES,
    "extra padding": SW_SIG + "=",
    "url-safe alphabet": "v1," + VALID_B64.replace("+", "-").replace("/", "_"),
    "no version": "," + VALID_B64,
    "trailing space": SW_SIG + " ",
    "double space": f"{SW_SIG}  {SW_SIG}",
    "newline": SW_SIG + "\n",
    "latin-1 byte": "v1," + VALID_B64[:-2] + "\xff=",
    "surrogate": "v1," + VALID_B64[:-2] + "\udcff=",
    "too many entries": " ".join([SW_SIG] * 17),
}


@pytest.mark.parametrize("sig", MALFORMED_SIGNATURES.values(), ids=MALFORMED_SIGNATURES.keys())
def test_malformed_signature_header_is_rejected(sig: str) -> None:
    error = reject(sw_verifier(), sw_headers(sig), SW_BODY)
    assert error.reason is RejectReason.MALFORMED_HEADER
    assert SW_SECRET not in error.message and VALID_B64 not in error.message


BAD_TIMESTAMPS = {
    "word": "hello",
    "fraction": "1614265330.9",
    "negative": "-5",
    "thirty digits": "1" * 30,
    "leading zero": "01614265330",
    "plus sign": "+1614265330",
    "underscores": "1_614_265_330",
    "leading space": " 1614265330",
    "trailing space": "1614265330 ",
    "fullwidth digits": "\uff11\uff16\uff11\uff14\uff12\uff16\uff15\uff13\uff13\uff10",
    "arabic-indic digits": "\u0661\u0666\u0661\u0664\u0662\u0666\u0665\u0663\u0663\u0660",
    "superscript": "\u00b9\u2076\u00b9\u2074\u00b2\u2076\u2075\u00b3\u00b3\u2070",
    "exponent": "1.61426533e9",
    "hex": "0x6037C0F2",
    "latin-1 byte": "1614265330\xff",
}


@pytest.mark.parametrize("ts", BAD_TIMESTAMPS.values(), ids=BAD_TIMESTAMPS.keys())
def test_malformed_timestamp_is_rejected(ts: str) -> None:
    error = reject(sw_verifier(), sw_headers(ts=ts), SW_BODY)
    assert error.reason is RejectReason.MALFORMED_HEADER


BAD_IDS = {
    "latin-1": "msg_\xff",
    "surrogate": "msg_\udcff",
    "non-ascii": "msg_é",
    "control": "msg\x00",
    "too long": "m" * 257,
}


@pytest.mark.parametrize("msg_id", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_malformed_id_is_rejected(msg_id: str) -> None:
    error = reject(sw_verifier(), sw_headers(msg_id=msg_id), SW_BODY)
    assert error.reason is RejectReason.MALFORMED_HEADER


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
@pytest.mark.parametrize("empty", [True, False])
def test_missing_or_empty_header_is_rejected(name: str, empty: bool) -> None:
    headers = sw_headers()
    if empty:
        headers[name] = ""
    else:
        del headers[name]
    error = reject(sw_verifier(), headers, SW_BODY)
    assert error.reason is RejectReason.MISSING_HEADER
    assert name in error.message


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param(sw_headers(), SW_BODY[:-1] + b"5", id="one body byte changed"),
        pytest.param(sw_headers(), SW_BODY + b"\n", id="byte appended"),
        pytest.param(sw_headers(msg_id=SW_ID + "x"), SW_BODY, id="id changed"),
        pytest.param(sw_headers(ts=SW_TS + 1), SW_BODY, id="timestamp changed"),
        pytest.param(sw_headers(), NON_UTF8, id="non-utf-8 body"),
    ],
)
def test_tampering_is_a_mismatch(headers: dict[str, str], body: bytes) -> None:
    assert reject(sw_verifier(), headers, body).reason is RejectReason.SIGNATURE_MISMATCH


def test_wrong_secret_is_a_mismatch() -> None:
    error = reject(sw_verifier(SW_OTHER_SECRET), sw_headers(), SW_BODY)
    assert error.reason is RejectReason.SIGNATURE_MISMATCH
    assert SW_OTHER_SECRET not in error.message


def test_only_unknown_versions_is_unusable() -> None:
    for sig in ("v2," + VALID_B64, "v0,x v9,y", "v1b," + VALID_B64):
        error = reject(sw_verifier(), sw_headers(sig), SW_BODY)
        assert error.reason is RejectReason.NO_USABLE_SIGNATURE


def test_one_valid_among_several_is_accepted() -> None:
    wrong = sw_hmac_sign(SW_OTHER_SECRET, SW_ID, SW_TS, SW_BODY)
    for sig in (f"{wrong} v2,zzz {SW_SIG}", f"{SW_SIG} {wrong}", f"v9,abc {SW_SIG}"):
        assert sw_verifier().verify(sw_headers(sig), SW_BODY).event_id == SW_ID


def test_rotation_accepts_old_and_new_secret() -> None:
    verifier = sw_verifier(SW_OTHER_SECRET, SW_SECRET)
    assert verifier.verify(sw_headers(), SW_BODY).event_id == SW_ID
    new_sig = sw_lib_sign(SW_OTHER_SECRET, SW_ID, SW_TS, SW_BODY.decode())
    assert verifier.verify(sw_headers(new_sig), SW_BODY).event_id == SW_ID
    third = "whsec_" + base64.b64encode(b"third").decode()
    third_sig = sw_lib_sign(third, SW_ID, SW_TS, SW_BODY.decode())
    assert reject(verifier, sw_headers(third_sig), SW_BODY).reason is (
        RejectReason.SIGNATURE_MISMATCH
    )


@pytest.mark.parametrize("skew", [-300, -299, 0, 299, 300])
def test_timestamp_within_tolerance_is_accepted(skew: int) -> None:
    assert sw_verifier(now=SW_TS + skew).verify(sw_headers(), SW_BODY).timestamp == SW_TS


@pytest.mark.parametrize("skew", [-301, 301, -(10**6), 10**6])
def test_timestamp_outside_tolerance_is_rejected(skew: int) -> None:
    error = reject(sw_verifier(now=SW_TS + skew), sw_headers(), SW_BODY)
    assert error.reason is RejectReason.TIMESTAMP_OUT_OF_TOLERANCE


def test_sub_second_clock_is_compared_exactly() -> None:
    clock = at(SW_TS + 300)
    verifier = StandardWebhooksVerifier([SW_SECRET], clock=clock)
    assert verifier.verify(sw_headers(), SW_BODY).timestamp == SW_TS
    clock.advance(0.5)
    assert reject(verifier, sw_headers(), SW_BODY).reason is (
        RejectReason.TIMESTAMP_OUT_OF_TOLERANCE
    )


def test_custom_tolerance() -> None:
    verifier = StandardWebhooksVerifier([SW_SECRET], clock=at(SW_TS + 31), tolerance_seconds=30)
    assert reject(verifier, sw_headers(), SW_BODY).reason is (
        RejectReason.TIMESTAMP_OUT_OF_TOLERANCE
    )


# --- Stripe ------------------------------------------------------------------------------

ST_TS = 1700000000
ST_BODY = b'{"id":"evt_1","type":"payment_intent.succeeded"}'


def stripe(*secrets: str, now: int = ST_TS) -> StripeVerifier:
    return StripeVerifier(list(secrets or (STRIPE_SECRET,)), clock=at(now))


def st_headers(value: str) -> dict[str, str]:
    return {"stripe-signature": value}


def test_stripe_signature_verifies() -> None:
    verified = stripe().verify(st_headers(stripe_header(STRIPE_SECRET, ST_TS, ST_BODY)), ST_BODY)
    assert verified == Verified(event_id=None, timestamp=ST_TS)


def test_stripe_several_v1_and_v0_entries() -> None:
    good = hex_hmac(STRIPE_SECRET, f"{ST_TS}.".encode() + ST_BODY)
    wrong = hex_hmac("other", f"{ST_TS}.".encode() + ST_BODY)
    header = f"t={ST_TS},v1={wrong},v0={wrong},v1={good}"
    assert stripe().verify(st_headers(header), ST_BODY).timestamp == ST_TS
    assert stripe().verify(st_headers(f"v1={good},t={ST_TS}"), ST_BODY).timestamp == ST_TS
    assert stripe().verify(st_headers(f"t={ST_TS},v1={good.upper()}"), ST_BODY).timestamp == ST_TS


def test_stripe_rotation_and_wrong_secret() -> None:
    header = st_headers(stripe_header("old secret", ST_TS, ST_BODY))
    assert stripe("new secret", "old secret").verify(header, ST_BODY).timestamp == ST_TS
    assert reject(stripe("new secret"), header, ST_BODY).reason is RejectReason.SIGNATURE_MISMATCH


def test_stripe_non_utf8_body() -> None:
    header = st_headers(stripe_header(STRIPE_SECRET, ST_TS, NON_UTF8))
    assert stripe().verify(header, NON_UTF8).timestamp == ST_TS
    assert reject(stripe(), header, NON_UTF8[1:]).reason is RejectReason.SIGNATURE_MISMATCH


GOOD_ST_HEX = hex_hmac(STRIPE_SECRET, f"{ST_TS}.".encode() + ST_BODY)
STRIPE_CASES: dict[str, tuple[str, RejectReason]] = {
    "body-signed-for-other-ts": (
        f"t={ST_TS + 1},v1={GOOD_ST_HEX}",
        RejectReason.SIGNATURE_MISMATCH,
    ),
    "no t": (f"v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "empty t": (f"t=,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "two t": (f"t={ST_TS},t={ST_TS},v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "t hello": (f"t=hello,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "t fraction": (f"t={ST_TS}.9,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "t negative": (f"t=-5,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "t thirty digits": (f"t={'9' * 30},v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "t latin-1": (f"t={ST_TS}\xff,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "v1 truncated": (f"t={ST_TS},v1={GOOD_ST_HEX[:-1]}", RejectReason.MALFORMED_HEADER),
    "v1 not hex": (f"t={ST_TS},v1={'z' * 64}", RejectReason.MALFORMED_HEADER),
    "v1 with space": (f"t={ST_TS},v1={GOOD_ST_HEX[:-2]} f", RejectReason.MALFORMED_HEADER),
    "v1 empty": (f"t={ST_TS},v1=", RejectReason.MALFORMED_HEADER),
    "v1 surrogate": (f"t={ST_TS},v1={GOOD_ST_HEX[:-1]}\udcff", RejectReason.MALFORMED_HEADER),
    "item without =": (f"t={ST_TS},v1", RejectReason.MALFORMED_HEADER),
    "empty item": (f"t={ST_TS},,v1={GOOD_ST_HEX}", RejectReason.MALFORMED_HEADER),
    "trailing comma": (f"t={ST_TS},v1={GOOD_ST_HEX},", RejectReason.MALFORMED_HEADER),
    "too many": (f"t={ST_TS}" + f",v1={GOOD_ST_HEX}" * 16, RejectReason.MALFORMED_HEADER),
    "only v0": (f"t={ST_TS},v0={GOOD_ST_HEX}", RejectReason.NO_USABLE_SIGNATURE),
    "space after comma": (f"t={ST_TS}, v1={GOOD_ST_HEX}", RejectReason.NO_USABLE_SIGNATURE),
}


@pytest.mark.parametrize(("value", "reason"), STRIPE_CASES.values(), ids=list(STRIPE_CASES.keys()))
def test_stripe_rejections(value: str, reason: RejectReason) -> None:
    error = reject(stripe(), st_headers(value), ST_BODY)
    assert error.reason is reason
    assert STRIPE_SECRET not in error.message and GOOD_ST_HEX not in error.message


def test_stripe_missing_header_and_changed_body() -> None:
    assert reject(stripe(), {}, ST_BODY).reason is RejectReason.MISSING_HEADER
    header = st_headers(stripe_header(STRIPE_SECRET, ST_TS, ST_BODY))
    assert reject(stripe(), header, ST_BODY.replace(b"1", b"2")).reason is (
        RejectReason.SIGNATURE_MISMATCH
    )


@pytest.mark.parametrize(("skew", "ok"), [(-301, False), (-299, True), (299, True), (301, False)])
def test_stripe_tolerance(skew: int, ok: bool) -> None:
    header = st_headers(stripe_header(STRIPE_SECRET, ST_TS, ST_BODY))
    verifier = stripe(now=ST_TS + skew)
    if ok:
        assert verifier.verify(header, ST_BODY).timestamp == ST_TS
    else:
        assert reject(verifier, header, ST_BODY).reason is RejectReason.TIMESTAMP_OUT_OF_TOLERANCE


# --- GitHub ------------------------------------------------------------------------------


def gh_headers(sig: str = GH_SIG, delivery: str = GH_DELIVERY) -> dict[str, str]:
    return {"x-hub-signature-256": sig, "x-github-delivery": delivery}


def test_github_documented_example_verifies() -> None:
    verified = GitHubVerifier([GH_SECRET]).verify(gh_headers(), GH_BODY)
    assert verified == Verified(event_id=GH_DELIVERY, timestamp=None)


def test_github_rotation_and_wrong_secret() -> None:
    assert GitHubVerifier(["new", GH_SECRET]).verify(gh_headers(), GH_BODY).event_id
    error = reject(GitHubVerifier(["new"]), gh_headers(), GH_BODY)
    assert error.reason is RejectReason.SIGNATURE_MISMATCH


def test_github_non_utf8_body() -> None:
    sig = "sha256=" + hex_hmac(GH_SECRET, NON_UTF8)
    assert GitHubVerifier([GH_SECRET]).verify(gh_headers(sig), NON_UTF8).event_id == GH_DELIVERY


GITHUB_CASES: dict[str, tuple[dict[str, str], bytes, RejectReason]] = {
    "body changed": (gh_headers(), b"Hello, World?", RejectReason.SIGNATURE_MISMATCH),
    "no signature": ({"x-github-delivery": GH_DELIVERY}, GH_BODY, RejectReason.MISSING_HEADER),
    "no delivery": ({"x-hub-signature-256": GH_SIG}, GH_BODY, RejectReason.MISSING_HEADER),
    "sha1 prefix": (gh_headers("sha1=" + GH_SIG[7:]), GH_BODY, RejectReason.MALFORMED_HEADER),
    "upper prefix": (gh_headers("SHA256=" + GH_SIG[7:]), GH_BODY, RejectReason.MALFORMED_HEADER),
    "no prefix": (gh_headers(GH_SIG[7:]), GH_BODY, RejectReason.MALFORMED_HEADER),
    "prefix only": (gh_headers("sha256="), GH_BODY, RejectReason.MALFORMED_HEADER),
    "truncated": (gh_headers(GH_SIG[:-2]), GH_BODY, RejectReason.MALFORMED_HEADER),
    "two values": (gh_headers(GH_SIG + "," + GH_SIG), GH_BODY, RejectReason.MALFORMED_HEADER),
    "latin-1": (gh_headers(GH_SIG[:-1] + "\xff"), GH_BODY, RejectReason.MALFORMED_HEADER),
    "bad delivery": (gh_headers(delivery="id\udcff"), GH_BODY, RejectReason.MALFORMED_HEADER),
}


@pytest.mark.parametrize(
    ("headers", "body", "reason"), GITHUB_CASES.values(), ids=list(GITHUB_CASES.keys())
)
def test_github_rejections(headers: dict[str, str], body: bytes, reason: RejectReason) -> None:
    error = reject(GitHubVerifier([GH_SECRET]), headers, body)
    assert error.reason is reason
    assert GH_SECRET not in error.message


# --- Generic hmac-sha256 -----------------------------------------------------------------

GEN_BODY = b'{"event":"done","job":"j1"}'
GEN_MAC = hmac.new(GENERIC_SECRET.encode(), GEN_BODY, hashlib.sha256).digest()
GEN_HEX = GEN_MAC.hex()
GEN_B64 = base64.b64encode(GEN_MAC).decode()


@pytest.mark.parametrize(
    "value",
    [GEN_HEX, GEN_HEX.upper(), GEN_B64, "sha256=" + GEN_HEX, "sha256=" + GEN_B64],
    ids=["hex", "upper hex", "base64", "prefixed hex", "prefixed base64"],
)
def test_generic_encodings_verify(value: str) -> None:
    verified = HmacSha256Verifier([GENERIC_SECRET]).verify({"x-signature": value}, GEN_BODY)
    assert verified == Verified(event_id=None, timestamp=None)


def test_generic_custom_header_several_values_and_rotation() -> None:
    verifier = HmacSha256Verifier(["old", GENERIC_SECRET], signature_header="X-Acme-Signature")
    wrong = hex_hmac("other", GEN_BODY)
    headers = Headers(headers={"X-Acme-Signature": f"{wrong}, sha256={GEN_B64}"})
    assert verifier.verify(headers, GEN_BODY) == Verified(event_id=None, timestamp=None)
    old = {"x-acme-signature": hex_hmac("old", NON_UTF8)}
    assert verifier.verify(old, NON_UTF8).event_id is None


GENERIC_CASES: dict[str, tuple[str, RejectReason]] = {
    "wrong secret": (hex_hmac("other", GEN_BODY), RejectReason.SIGNATURE_MISMATCH),
    "empty": ("", RejectReason.MISSING_HEADER),
    "prefix only": ("sha256=", RejectReason.MALFORMED_HEADER),
    "truncated hex": (GEN_HEX[:-1], RejectReason.MALFORMED_HEADER),
    "truncated base64": (GEN_B64[:-4], RejectReason.MALFORMED_HEADER),
    "unpadded base64": (GEN_B64.rstrip("="), RejectReason.MALFORMED_HEADER),
    "url-safe base64": ("/" * 43 + "=", RejectReason.SIGNATURE_MISMATCH),
    "bad base64": ("!" * 43 + "=", RejectReason.MALFORMED_HEADER),
    "sha1 prefix": ("sha1=" + GEN_HEX, RejectReason.MALFORMED_HEADER),
    "empty item": (GEN_HEX + ",,", RejectReason.MALFORMED_HEADER),
    "latin-1": (GEN_HEX[:-1] + "\xff", RejectReason.MALFORMED_HEADER),
    "surrogate base64": (GEN_B64[:-2] + "\udcff=", RejectReason.MALFORMED_HEADER),
    "too many": (",".join([GEN_HEX] * 17), RejectReason.MALFORMED_HEADER),
}


@pytest.mark.parametrize(
    ("value", "reason"), GENERIC_CASES.values(), ids=list(GENERIC_CASES.keys())
)
def test_generic_rejections(value: str, reason: RejectReason) -> None:
    error = reject(HmacSha256Verifier([GENERIC_SECRET]), {"x-signature": value}, GEN_BODY)
    assert error.reason is reason
    assert GENERIC_SECRET not in error.message


def test_generic_missing_header_and_changed_body() -> None:
    verifier = HmacSha256Verifier([GENERIC_SECRET])
    assert reject(verifier, {}, GEN_BODY).reason is RejectReason.MISSING_HEADER
    assert reject(verifier, {"x-signature": GEN_HEX}, GEN_BODY + b" ").reason is (
        RejectReason.SIGNATURE_MISMATCH
    )


# --- Factory and configuration ------------------------------------------------------------


def test_build_verifier_dispatches_on_scheme() -> None:
    clock = at(SW_TS)
    cases: list[tuple[str, list[str], type]] = [
        ("standard-webhooks", [SW_SECRET], StandardWebhooksVerifier),
        ("stripe", [STRIPE_SECRET], StripeVerifier),
        ("github", [GH_SECRET], GitHubVerifier),
        ("hmac-sha256", [GENERIC_SECRET], HmacSha256Verifier),
    ]
    for scheme, secrets, cls in cases:
        verifier = build_verifier(scheme, secrets, clock=clock, tolerance_seconds=300)
        assert type(verifier) is cls
        assert getattr(verifier, "scheme", None) == scheme
    assert build_verifier("standard-webhooks", [SW_SECRET], clock=clock).verify(
        sw_headers(), SW_BODY
    ) == Verified(event_id=SW_ID, timestamp=SW_TS)
    generic = build_verifier("hmac-sha256", [GENERIC_SECRET], clock=clock, signature_header="X-S")
    assert generic.verify({"x-s": GEN_HEX}, GEN_BODY).event_id is None


def test_build_verifier_tolerance_is_used() -> None:
    verifier = build_verifier("stripe", [STRIPE_SECRET], clock=at(ST_TS + 61), tolerance_seconds=60)
    header = st_headers(stripe_header(STRIPE_SECRET, ST_TS, ST_BODY))
    assert reject(verifier, header, ST_BODY).reason is RejectReason.TIMESTAMP_OUT_OF_TOLERANCE


SECRET_VALUE = "whsec_czNjcjN0dmFsdWU!!"
CONFIG_CASES: dict[str, tuple[Callable[[], object], str]] = {
    "unknown scheme": (lambda: build_verifier("sha1", ["x"], clock=at(0)), "unknown"),
    "no secrets": (lambda: build_verifier("github", [], clock=at(0)), "non-empty"),
    "bare string": (lambda: build_verifier("github", "s3cr3tval", clock=at(0)), "list"),
    "empty secret": (lambda: build_verifier("stripe", ["a", ""], clock=at(0)), "#2"),
    "bad whsec base64": (
        lambda: build_verifier("standard-webhooks", [SECRET_VALUE], clock=at(0)),
        "base64",
    ),
    "empty whsec": (lambda: build_verifier("standard-webhooks", ["whsec_"], clock=at(0)), "#1"),
    "unprefixed": (
        lambda: build_verifier("standard-webhooks", ["czNjcjN0dmFs"], clock=at(0)),
        "whsec_",
    ),
    "private key": (
        lambda: build_verifier("standard-webhooks", ["whsk_czNjcjN0dmFs"], clock=at(0)),
        "whpk_",
    ),
    "short whpk": (
        lambda: build_verifier("standard-webhooks", ["whpk_czNjcjN0dmFs"], clock=at(0)),
        "Ed25519",
    ),
    "bad whpk base64": (
        lambda: build_verifier("standard-webhooks", ["whpk_!!!!"], clock=at(0)),
        "Ed25519",
    ),
    "zero tolerance": (
        lambda: build_verifier("stripe", ["s"], clock=at(0), tolerance_seconds=0),
        "positive",
    ),
    "bool tolerance": (
        lambda: build_verifier("stripe", ["s"], clock=at(0), tolerance_seconds=True),
        "integer",
    ),
    "header on github": (
        lambda: build_verifier("github", ["s"], clock=at(0), signature_header="x-sig"),
        "hmac-sha256",
    ),
    "bad header name": (
        lambda: build_verifier("hmac-sha256", ["s"], clock=at(0), signature_header="x sig"),
        "header name",
    ),
}


@pytest.mark.parametrize(("make", "fragment"), CONFIG_CASES.values(), ids=list(CONFIG_CASES.keys()))
def test_bad_configuration_is_a_config_error(make: Callable[[], object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert fragment in info.value.message
    for secret in (SECRET_VALUE, "czNjcjN0dmFs", "s3cr3tval"):
        assert secret not in info.value.message


def test_repr_shows_no_secret(ed_key: Ed25519PrivateKey) -> None:
    verifiers: list[object] = [
        sw_verifier(SW_SECRET, whpk(ed_key)),
        stripe(),
        GitHubVerifier([GH_SECRET]),
        HmacSha256Verifier([GENERIC_SECRET]),
    ]
    for verifier in verifiers:
        text = repr(verifier)
        for secret in (SW_SECRET, SW_SECRET[6:], whpk(ed_key), STRIPE_SECRET, GH_SECRET):
            assert secret not in text
        assert GENERIC_SECRET not in text


# --- Anything at all is either verified or a SignatureRejected ----------------------------

_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=120)
_fragments = st.sampled_from(
    [
        "v1", "v1a", "v2", ",", " ", "=", "t=", "v1=", "sha256=", str(SW_TS), "-", ".", "0",
        VALID_B64, VALID_B64[:20], THIRTY_ONE_BYTES, GOOD_ST_HEX, GEN_HEX[:30], "\xff", "\udcff",
        "\uff11", "=", "==", "!", "\x00", "\n",
    ]
)  # fmt: skip
_near_valid = st.lists(_fragments, max_size=12).map("".join)
_header_value = st.one_of(_any_text, _near_valid)
_NAMES = [
    "webhook-id", "webhook-timestamp", "webhook-signature", "stripe-signature",
    "x-hub-signature-256", "x-github-delivery", "x-signature",
]  # fmt: skip


def _all_verifiers() -> list[Verifier]:
    clock = at(SW_TS)
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    return [
        StandardWebhooksVerifier([SW_SECRET, whpk(key)], clock=clock),
        StripeVerifier([STRIPE_SECRET], clock=clock),
        GitHubVerifier([GH_SECRET]),
        HmacSha256Verifier([GENERIC_SECRET]),
    ]


ALL_VERIFIERS = _all_verifiers()


@settings(max_examples=400)
@given(
    headers=st.dictionaries(st.sampled_from(_NAMES), _header_value, max_size=len(_NAMES)),
    body=st.binary(max_size=200),
)
def test_arbitrary_input_only_ever_raises_signature_invalid(
    headers: dict[str, str], body: bytes
) -> None:
    for verifier in ALL_VERIFIERS:
        try:
            verifier.verify(headers, body)
        except SignatureRejected as error:
            assert isinstance(error.reason, RejectReason)
        else:  # pragma: no cover - would mean a forgery
            pytest.fail(f"{type(verifier).__name__} accepted unsigned input")


@settings(max_examples=200)
@given(sig=_near_valid, ts=st.one_of(st.just(str(SW_TS)), _near_valid), body=st.binary())
def test_near_valid_standard_headers_only_raise_signature_invalid(
    sig: str, ts: str, body: bytes
) -> None:
    with pytest.raises(SignatureRejected):
        ALL_VERIFIERS[0].verify(sw_headers(sig, SW_ID, ts), body)

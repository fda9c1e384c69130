"""Whether a header a provider file writes down could carry a credential: pure text decisions.

Credentials come from ``[auth]`` and the environment, never from a file, where they would
sit in version control, backups and ``providers show``. A static header is refused when
its *name* suggests a secret, or when its *value* looks like one whatever the name: an
HTTP authentication scheme with a credential after it (``Token abc123``), a vendor's
key prefix in any case (``sk-``, ``ghp_``, ``WHSEC_``...) before three or more token
characters, a URL with a user and password, a
``key=value`` that names a secret, or a long random-looking run of characters. The last
test has false positives (an organisation id is random-looking too), so the headers that
real APIs document for such ids are exempt from it, and from it only.

The decisions err towards refusing: a refused header is one line at load that names the
file and key; an accepted credential is a leak nobody sees.
"""

from __future__ import annotations

import math
import re
from collections import Counter

# Parts of a header name that mean it carries a secret (matched anywhere in the name).
SECRET_NAME_PARTS = (
    "key",
    "token",
    "secret",
    "auth",
    "pass",  # password, passwd, passphrase, X-Api-Pass
    "pwd",
    "jwt",
    "hmac",
    "cred",  # credential, X-Cred, X-Creds
    "session",
    "cookie",
    "signature",
    "bearer",
    "access",  # X-Access-Code, X-Access-Id
    "private",
    "csrf",
    "xsrf",
)
# Short ones, matched as whole words of the name only ("sig" would match "x-signal").
SECRET_NAME_WORDS = frozenset({"sig", "sid", "otp", "totp", "pin", "pw", "mfa", "salt"})
# Headers that carry credentials or session state by their very name.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})

# HTTP authentication schemes (the IANA registry and the common vendor ones): a value
# that starts with one of these and goes on is an Authorization value, whatever the name.
AUTH_SCHEMES = frozenset(
    {
        "basic",
        "bearer",
        "digest",
        "dpop",
        "hoba",
        "mutual",
        "negotiate",
        "ntlm",
        "oauth",
        "privatetoken",
        "scram-sha-1",
        "scram-sha-256",
        "vapid",
        "aws4-hmac-sha256",
        "gssapi",
        "token",
        "apikey",
        "api-key",
        "key",
        "sso-key",
        "jwt",
        "hmac",
        "signature",
        "sharedkey",
        "sharedaccesssignature",
        "otp",
        "secret",
    }
)
# How vendors' secrets begin (keys, tokens, webhook secrets, JWTs, PEM blocks).
SECRET_PREFIXES = (
    "sk-",
    "sk_",
    "pk_live_",
    "pk_test_",
    "rk_",  # ours (``tokens create``) and Stripe's restricted keys
    "whsec_",
    "whpk_",  # Standard Webhooks' asymmetric keys
    "whsk_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxa-",
    "xoxb-",
    "xoxp-",
    "xoxr-",
    "xoxs-",
    "AKIA",
    "ASIA",
    "AIza",
    "ya29.",
    "eyJ",  # a JWT: base64 of '{"'
    "r8_",
    "hf_",
    "npm_",
    "pypi-",
    "shpat_",
    "SG.",
    "-----BEGIN",
)
# Matched as written: in lower case these begin ordinary words and regions ("asia-east1").
# The others are matched whatever their case ("WHSEC_", "Sk-live-").
EXACT_CASE_PREFIXES = frozenset({"AKIA", "ASIA", "AIza", "eyJ", "SG."})
# The shortest tail after a prefix that is refused: "whsec_abc" is; "sk-SK" (a language
# tag, ``Accept-Language``) is not.
MIN_PREFIX_TAIL = 3
# Headers whose documented values are opaque ids or versions: exempt from the
# random-looking test (never from the others). Lower case.
KNOWN_SAFE_HEADERS = frozenset(
    {
        "accept",
        "accept-language",
        "content-type",
        "user-agent",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "openai-organization",
        "openai-project",
        "x-github-api-version",
        "x-goog-user-project",
        "x-amz-target",  # an AWS JSON API's operation: Service_Version.Operation
    }
)

_WORDS = re.compile(r"[a-z0-9]+")
# A run of token characters between separators: where a random credential would sit.
_RUNS = re.compile(r"[A-Za-z0-9]+")
_SECRET_ASSIGNMENT = re.compile(
    r"(key|token|secret|pass|pwd|auth|signature|session|credential)[a-z_-]*\s*[=:]\s*\S",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s@]*:[^/\s@]*@", re.IGNORECASE)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
# A random-looking run: at least this long, of two character classes or more, and about as
# varied as a random string (a 16-character random alphanumeric run averages ~3.8 bits a
# character; "aaaaaaaaaaaaaaaa1" has 0.3).
RANDOM_RUN_LENGTH = 16
RANDOM_RUN_BITS = 3.0


def secret_like_name(name: str) -> bool:
    """Whether a header's name says it carries a secret (case does not matter)."""
    lower = name.lower()
    if lower in CREDENTIAL_HEADERS or any(part in lower for part in SECRET_NAME_PARTS):
        return True
    return any(word in SECRET_NAME_WORDS for word in _WORDS.findall(lower))


def _bits_per_char(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _random_looking(run: str) -> bool:
    if len(run) < RANDOM_RUN_LENGTH:
        return False
    classes = sum(
        (
            any(c.islower() for c in run),
            any(c.isupper() for c in run),
            any(c.isdigit() for c in run),
        )
    )
    return classes >= 2 and _bits_per_char(run) >= RANDOM_RUN_BITS


def credential_like_value(value: str, header: str = "") -> str | None:
    """Why ``value`` (sent in header ``header``) looks like a credential, or None.

    The reason never quotes the value: it may be the credential itself.
    """
    text = value.strip()
    scheme, _, rest = text.partition(" ")
    if scheme.lower() in AUTH_SCHEMES and rest.strip():
        return f"starts with the authentication scheme {scheme!r}"
    folded = text.lower()
    for prefix in SECRET_PREFIXES:
        tail = text[len(prefix) :]
        starts = (
            text.startswith(prefix)
            if prefix in EXACT_CASE_PREFIXES
            else folded.startswith(prefix.lower())
        )
        if starts and len(tail) >= MIN_PREFIX_TAIL and _TOKEN_CHARS.fullmatch(tail):
            return f"starts as a {prefix!r} secret does"
    if _URL_USERINFO.search(text):
        return "holds a URL with a user and password"
    if _SECRET_ASSIGNMENT.search(text):
        return "assigns a value to a secret-like name"
    if header.lower() not in KNOWN_SAFE_HEADERS and any(
        _random_looking(run) for run in _RUNS.findall(text)
    ):
        return "holds a long random-looking string, as keys and tokens are"
    return None

"""Static headers the red team still got past the credential check, each refused at load.

Before: names with ``cred`` (``X-Cred``) passed, vendor prefixes matched only in their
documented case (``WHSEC_abc``, ``Sk-live-abc`` passed) and only before four or more
characters (``whsec_abc``, ``ghp_abc`` passed), and Standard Webhooks' asymmetric keys
(``whpk_``, ``whsk_``) were not known. A language tag (``sk-SK``) and a region
(``asia-east1``) still load.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.errors import ConfigError
from reconciler.providers.loader import parse_provider
from reconciler.providers.spec import INLINE_SOURCE

MINIMAL: dict[str, Any] = {
    "base_url": "http://127.0.0.1:8265",
    "create": {"path": "/api/jobs/", "job_id": "/submission_id", "idempotency": "none"},
    "status": {"path": "/api/jobs/{job_id}", "state": "/status"},
    "states": {"pending": ["PENDING", "RUNNING"], "success": ["SUCCEEDED"]},
}


def _loads(headers: dict[str, str]) -> None:
    parse_provider("p", {**MINIMAL, "headers": headers}, INLINE_SOURCE)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Cred", "2024"),
        ("X-Upstream-Mode", "WHSEC_abc"),
        ("X-Upstream-Mode", "Sk-live-abc"),
        ("X-Upstream-Mode", "whsec_abc"),
        ("X-Upstream-Mode", "ghp_abc"),
        ("X-Upstream-Mode", "whpk_MCowBQYDK2VwAyEA"),
        ("X-Upstream-Mode", "whsk_abcdef"),
    ],
)
def test_the_headers_that_passed_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _loads({name: value})
    assert caught.value.message.startswith(f"{INLINE_SOURCE}: providers.p.headers.{name}: ")
    assert value not in caught.value.message


def test_a_language_tag_and_a_region_still_load() -> None:
    _loads({"Accept-Language": "sk-SK", "X-Region": "asia-east1", "X-Mode": "SK-BA"})

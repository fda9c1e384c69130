"""Attack: extending an escalation beyond what it offered (API and CLI alike).

The escalation offers "extend N s, K checks"; an operator may take that or less,
never more, and no number (1e9, 1e12, 10**23, negative, NaN) is a 500.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.cli import main
from reconciler.core.errors import InvalidRequest
from reconciler.core.operator_decision import DecisionRequest, extension_amounts
from reconciler.core.vocabulary import DecisionAction
from tests.integration.test_decisions_api import decide, escalate
from tests.support.stack import Stack

OFFER = {"action": "extend", "extra_seconds": 900.0, "extra_status_requests": 4}


@pytest.mark.parametrize(
    ("seconds", "checks", "field"),
    [
        (1e9, None, "extra_seconds"),
        (901.0, None, "extra_seconds"),
        (None, 5, "extra_status_requests"),
        (None, 10**23, "extra_status_requests"),
        (float("nan"), None, "extra_seconds"),
        (-1.0, None, "extra_seconds"),
    ],
)
def test_the_planner_refuses_more_than_was_offered(
    seconds: float | None, checks: int | None, field: str
) -> None:
    request = DecisionRequest(DecisionAction.EXTEND, seconds, checks)
    with pytest.raises(InvalidRequest, match=f"'{field}'"):
        extension_amounts(OFFER, request)


def test_the_planner_grants_the_offer_or_less() -> None:
    assert extension_amounts(OFFER, DecisionRequest(DecisionAction.EXTEND)) == (900.0, 4)
    assert extension_amounts(OFFER, DecisionRequest(DecisionAction.EXTEND, 60.0, 2)) == (60.0, 2)


OUT_OF_RANGE: list[tuple[dict[str, Any], str]] = [
    ({"extra_seconds": 1e9, "extra_status_requests": 1000000}, "extra_seconds"),
    ({"extra_seconds": 1e12}, "extra_seconds"),
    ({"extra_status_requests": 10**23}, "extra_status_requests"),
    ({"extra_seconds": -5}, "extra_seconds"),
    ({"extra_status_requests": 5}, "extra_status_requests"),
]


def test_api_extensions_beyond_the_offer_are_400_naming_the_field(stack: Stack) -> None:
    op = escalate(stack, "request_budget_exhausted")
    before = stack.get(op["id"], operator=True)
    for amounts, field in OUT_OF_RANGE:
        response = decide(stack, op["id"], {"action": "extend", **amounts})
        assert response.status_code == 400, (amounts, response.text)
        assert f"'{field}'" in response.json()["error"]["message"]
    # Raw NaN is not JSON at all: refused while parsing.
    raw = stack.client.post(
        f"/v1/operations/{op['id']}/decisions",
        content=b'{"action": "extend", "extra_seconds": NaN}',
        headers={**stack.headers(operator=True), "Content-Type": "application/json"},
    )
    assert raw.status_code == 400
    after = stack.get(op["id"], operator=True)
    assert after["deadline_at"] == before["deadline_at"] and after["budget"] == before["budget"]
    assert after["escalation"]["decided"] is False


@pytest.mark.parametrize(
    "extra",
    [
        ["--extra-seconds", "1e12"],
        ["--extra-seconds", "nan"],
        ["--extra-seconds", "-5"],
        ["--extra-requests", "100000000000000000000000"],
    ],
)
def test_cli_extensions_beyond_the_offer_fail_cleanly(
    stack: Stack, tmp_path: Any, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    op = escalate(stack, "request_budget_exhausted")
    config = tmp_path / "cli.toml"
    config.write_text(
        f"database_url = {json.dumps(stack.runtime.settings.database_url)}\n"
        f"providers_dir = {json.dumps(str(tmp_path / 'no-provider-files'))}\n"
    )
    code = main(["decide", op["id"], "extend", *extra, "--config", str(config), "--by", "me"])
    assert code == 1
    err = capsys.readouterr().err
    assert "reconciler: '" in err and "Traceback" not in err
    assert stack.get(op["id"], operator=True)["escalation"]["decided"] is False

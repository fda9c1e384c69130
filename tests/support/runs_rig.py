"""``fixtures/runs_api.py`` as the step rig's provider: its file as the rig's ``sim`` table,
and handlers that put the API's own token on the calls that reach it."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fixtures.runs_api import TOKEN, RunsApi

RUNS_TOML = Path(__file__).parents[2] / "fixtures" / "providers" / "runs.toml"
BASE_URL = "http://runs.test"

Handler = Callable[[httpx.Request], httpx.Response]


def runs_table(**changes: dict[str, Any]) -> dict[str, Any]:
    """``runs.toml`` as the rig's provider ``sim`` (its credential from the rig's variable);
    each change is merged into its section."""
    with RUNS_TOML.open("rb") as fh:
        table: dict[str, Any] = tomllib.load(fh)["providers"]["runs"]
    table["base_url"] = BASE_URL
    table["auth"] = {"type": "bearer", "token_env": "SIM_TOKEN"}
    for name, values in changes.items():
        if name == "auth":
            table[name] = values
        else:
            table[name] = {**table.get(name, {}), **values}
    return table


def with_token(api: RunsApi, before: Handler | None = None) -> Handler:
    """The rig sends the sim's token; the API wants its own: swap it on the way in.
    ``before`` may answer a call first (return None to pass it on)."""

    def handle(request: httpx.Request) -> httpx.Response:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if before is not None:
            answered = before(request)
            if answered is not None:
                return answered
        return api.handle(request)

    return handle

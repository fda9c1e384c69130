"""The live service against its own OpenAPI document (schemathesis): no 5xx, no answer
that breaks the schema, every status code documented.

schemathesis is imported by the fixture, not by the module: every worker collects this
module, and the import (about 0.9 s of CPU) is then paid only by the one that runs it.
Its pytest plugin is off for the same reason (``-p no:schemathesis``): the fuzzing goes
through hypothesis's ``given``, not the plugin.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from reconciler.api.openapi import document
from tests.support.stack import Stack, running_stack

WAIT_MAX_SECONDS = 0.5


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("openapi")
    url = f"sqlite:///{tmp / 'reconciler.db'}"
    from reconciler.storage import migrate
    from reconciler.storage.database import Database

    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
    with running_stack(tmp, url, server={"wait_max_seconds": WAIT_MAX_SECONDS}) as stack:
        # One real operation so that path-parameter cases can also hit existing ids.
        stack.create({"scenario": "success", "duration": 0.2}, idempotency_key="seed")
        yield stack


# Each operation is its own test, so a failure names the operation.
OPERATIONS = [
    (method.upper(), path)
    for path, methods in document(["sim"], WAIT_MAX_SECONDS)["paths"].items()
    for method in methods
    if method in {"get", "put", "post", "delete", "patch"}
]


@pytest.fixture(scope="module")
def schema(live: Stack) -> Any:
    """The served document, parsed once (parsing it is most of a small test)."""
    import schemathesis

    return schemathesis.openapi.from_url(f"{live.url}/openapi.json")


@pytest.fixture(scope="module")
def checks() -> list[Any]:
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]


def test_every_served_operation_is_fuzzed(schema: Any) -> None:
    served = {(op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations())}
    assert served == set(OPERATIONS)
    assert len(served) >= 9


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_api_conforms_to_its_schema(
    live: Stack, schema: Any, checks: list[Any], method: str, path: str
) -> None:
    operation = schema[path][method]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def conforms(case: Any) -> None:
        case.call_and_validate(
            base_url=live.url, headers=live.headers(operator=True), checks=checks
        )

    conforms()


def test_document_lists_the_configured_providers(live: Stack) -> None:
    doc = live.client.get("/openapi.json").json()
    create = doc["components"]["schemas"]["CreateOperation"]
    assert create["properties"]["provider"]["enum"] == ["sim"]
    assert set(doc["paths"]) >= {"/v1/operations", "/v1/operations/{op_id}/wait"}

"""The AWS presets read against botocore's service models: the definitions the AWS SDKs
are generated from.

For each preset: its signing name; each call's operation (the ``X-Amz-Target`` of a
JSON-protocol API with the model's target prefix and content type, or a REST-JSON
operation's method and request URI, and every query parameter one the operation
takes); every member a call writes (``set``, the request schema's properties) one the
operation's input has; every pointer read from an answer (state, job id, error, rules,
result, lookup items and cursor) a path through the operation's output; and the state
words exactly the model's status enum. A name the model does not know is a field AWS
ignores or refuses, or an answer pointer that never resolves.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.loaders import Loader

from reconciler.providers.loader import parse_provider
from reconciler.providers.spec import CallTable, ProviderSpec

# preset: (botocore service, the status enum shape, the deployment's set values)
PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "aws_transcribe": ("transcribe", "TranscriptionJobStatus", {}),
    "aws_step_functions": ("stepfunctions", "ExecutionStatus", {"/stateMachineArn": "arn"}),
    "aws_batch": ("batch", "JobStatus", {"/jobQueue": "queue"}),
    "aws_bedrock_batch": ("bedrock", "ModelInvocationJobStatus", {"/roleArn": "arn"}),
}
LABEL = re.compile(r"\{([^}]+)\}")


class Model:
    def __init__(self, service: str) -> None:
        self.raw: dict[str, Any] = Loader().load_service_model(service, "service-2")
        self.meta = self.raw["metadata"]
        self.shapes: dict[str, Any] = self.raw["shapes"]

    def operation_of(self, table: CallTable, path: str) -> dict[str, Any]:
        """The operation a call is: by its target header, or by its method and URI."""
        headers = {name.lower(): value for name, value in table.headers}
        if self.meta["protocol"] != "rest-json":
            prefix, _, name = headers["x-amz-target"].partition(".")
            assert prefix == self.meta["targetPrefix"]
            return dict(self.raw["operations"][name])
        route = re.sub(r"\{[^}]+\}", "X", urlsplit(path).path)
        for op in self.raw["operations"].values():
            uri = op["http"]["requestUri"].split("?", 1)[0]
            pattern = "[^/]+".join(re.escape(part) for part in LABEL.split(uri)[::2])
            if op["http"]["method"] == table.method and re.fullmatch(pattern, route):
                return dict(op)
        raise AssertionError(f"no {table.method} {route} in the model")

    def walk(self, shape: str, tokens: tuple[str, ...]) -> str:
        """The shape a pointer's tokens lead to from ``shape``; fails on a name it lacks."""
        for token in tokens:
            node = self.shapes[shape]
            if node["type"] == "list":
                assert token.isdigit(), (shape, token)
                shape = node["member"]["shape"]
            elif node["type"] == "map":
                shape = node["value"]["shape"]
            else:
                members = node.get("members", {})
                assert token in members, f"{shape} has no member {token!r}"
                shape = members[token]["shape"]
        return shape

    def input_members(self, op: dict[str, Any]) -> dict[str, Any]:
        members: dict[str, Any] = self.shapes[op["input"]["shape"]]["members"]
        return members


def load(preset: str, deployment: dict[str, Any]) -> ProviderSpec:
    table: dict[str, Any] = {"preset": preset}
    if deployment:
        table["create"] = {"set": deployment}
        if preset != "aws_bedrock_batch":
            table["lookup"] = {"set": deployment}
    return parse_provider("p", table, "test")


def calls(spec: ProviderSpec) -> list[tuple[str, CallTable, str]]:
    """Each call and its path; a result read from the status is that status call."""
    return [
        (key, table, getattr(table, "path", None) or "")
        for key, table in spec.calls()
        if not (key == "result" and spec.result is not None and spec.result.from_status)
    ]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_is_what_the_service_model_says(preset: str) -> None:
    service, enum, deployment = PRESETS[preset]
    model, spec = Model(service), load(preset, deployment)
    assert spec.auth.service == model.meta.get("signingName", model.meta["endpointPrefix"])
    assert {w for w, _ in spec.states.entries} == set(model.shapes[enum]["enum"])
    if model.meta["protocol"] != "rest-json":
        content_type = f"application/x-amz-json-{model.meta['jsonVersion']}"
        assert dict(spec.headers)["Content-Type"] == content_type
    for key, table, path in calls(spec):
        op = model.operation_of(table, path)
        members = model.input_members(op)
        for rule in table.set:
            model.walk(op["input"]["shape"], rule.pointer.tokens[:1])
        for name in parse_qs(urlsplit(path).query):
            assert any(m.get("locationName") == name for m in members.values()), (key, name)
        output = op.get("output", {}).get("shape")
        read = _pointers_read(spec, key)
        for pointer in read:
            assert output is not None, (key, pointer)
            model.walk(output, pointer)
    create = model.operation_of(spec.create, spec.create.path)
    schema = spec.request_schema
    assert schema is not None
    for name in schema.schema.get("properties", {}):
        assert name in model.input_members(create), f"{preset}: request_schema.{name}"


def _pointers_read(spec: ProviderSpec, key: str) -> list[tuple[str, ...]]:
    """The answer pointers of one call, as token tuples (the lookup's relative to an item)."""
    if key == "create":
        return [spec.create.job_id.tokens]
    if key == "lookup" and spec.lookup is not None:
        lookup = spec.lookup
        base = (*lookup.items.tokens, "0") if lookup.items is not None else ()
        found = [base + lookup.job_id.tokens] + [base + p.tokens for p, _ in lookup.match]
        if lookup.next is not None:
            found.append(lookup.next.tokens)
        return found
    if key == "status":
        status = spec.status
        pointers = [status.state, status.job_id, status.error, status.progress, *status.required]
        pointers += [rule.pointer for rule in status.rules]
        if spec.result is not None and spec.result.from_status is not None:
            pointers.append(spec.result.from_status)
        summary = [
            p.pointer
            for _, p in (spec.result.summary if spec.result else ())
            if p.source == "status"
        ]
        return [p.tokens for p in [*pointers, *summary] if p is not None]
    return []

"""JSON Schemas generated from the wire models: OpenAPI components and MCP tool schemas.

Nothing here is written by hand: a component is ``model_json_schema`` of its model
(``$ref`` pointing into ``#/components/schemas``), a tool's schema the same with its
definitions kept inside (an MCP tool schema stands alone). What only the running
service knows (its providers, its wait cap) is filled in by ``with_values``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

COMPONENTS = "#/components/schemas/{model}"


class _WireSchema(GenerateJsonSchema):
    """JSON Schema 2020-12 without the titles pydantic derives from field names."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def components(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """The OpenAPI ``components.schemas`` of ``models`` and of every model they refer to."""
    keyed: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in models]
    _, schema = models_json_schema(keyed, ref_template=COMPONENTS, schema_generator=_WireSchema)
    return dict(schema.get("$defs", {}))


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """One model's schema standing alone (``$defs`` inside), as an MCP tool schema is.

    A copy of the one generated for the model in this process: generating the tools'
    twelve took about 70 ms, three quarters of building an app, and copying them 8 ms.
    """
    return copy.deepcopy(_generated(model))


@cache
def _generated(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(schema_generator=_WireSchema)


def with_values(
    schema: Mapping[str, Any], values: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """``schema`` with keywords added to named properties: ``{"provider": {"enum": [...]}}``.

    A nullable property (``anyOf`` with null) gets them on its non-null branch.
    """
    out = copy.deepcopy(dict(schema))
    for name, keywords in values.items():
        prop = out["properties"][name]
        branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
        for branch in branches:
            branch.update(keywords)
    return out

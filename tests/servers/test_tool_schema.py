"""The tool arguments' JSON Schema checker (env_servers/tool_schema.py), against `jsonschema` where it is installed."""

from __future__ import annotations

import pytest

from env_servers.envs.calculator import TOOLS
from env_servers.tool_schema import schema_error

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number"},
        "mode": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "flag": {"type": ["boolean", "null"]},
    },
    "required": ["name"],
    "additionalProperties": False,
}
CASES = [
    ({"name": "x"}, None),
    ({"name": "x", "count": 3, "ratio": 0.5, "mode": "b", "tags": ["p"], "flag": None}, None),
    ({"name": "x", "count": 3.0, "flag": True}, None),  # 3.0 is an integer in JSON Schema
    ({}, "arguments.name is required"),
    ({"name": 3}, "arguments.name must be string, got integer"),
    ({"name": ""}, "at least 1"),
    ({"name": "abcdef"}, "at most 5"),
    ({"name": "x", "count": True}, "arguments.count must be integer, got boolean"),
    ({"name": "x", "count": 2.5}, "must be integer"),
    ({"name": "x", "count": -1}, ">= 0"),
    ({"name": "x", "count": 11}, "<= 10"),
    ({"name": "x", "ratio": "1"}, "must be number"),
    ({"name": "x", "mode": "c"}, "one of ['a', 'b']"),
    ({"name": "x", "tags": ["p", 1]}, "arguments.tags[1] must be string"),
    ({"name": "x", "flag": 0}, "boolean or null"),
    ({"name": "x", "other": 1}, "arguments.other is not a known argument"),
]


@pytest.mark.parametrize(("value", "error"), CASES)
def test_schema_error_names_the_place(value: dict, error: str | None) -> None:
    got = schema_error(SCHEMA, value)
    assert (got is None) if error is None else (got is not None and error in got), got


@pytest.mark.parametrize(("value", "error"), CASES)
def test_it_agrees_with_jsonschema(value: dict, error: str | None) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    assert jsonschema.Draft202012Validator(SCHEMA).is_valid(value) == (schema_error(SCHEMA, value) is None)


def test_the_calculator_schemas() -> None:
    calculate, answer = (tool.parameters for tool in TOOLS)
    assert schema_error(calculate, {"expression": "1 + 1"}) is None
    assert schema_error(answer, {"value": 3}) is None and schema_error(answer, {"value": 2.5}) is None
    assert "required" in schema_error(answer, {}) and "must be number" in schema_error(answer, {"value": "3"})
    assert "finite" in schema_error(answer, {"value": float("nan")})

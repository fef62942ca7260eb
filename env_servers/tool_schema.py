"""A small JSON Schema checker for tool arguments; unsupported keywords are ignored.

Not `jsonschema`: env hosts install only the core dependencies, and every host must judge arguments alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


def schema_error(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> str | None:
    """The first way ``value`` breaks ``schema``, naming the place (``arguments.x``); None if it fits."""
    kinds = schema.get("type")
    if kinds is not None:
        names = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_TYPES.get(name, lambda v: True)(value) for name in names):
            return f"{where} must be {' or '.join(names)}, got {_json_type(value)}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"{where} must be one of {list(schema['enum'])}, got {value!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {value}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} must be a finite number"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where} must have at least {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where} must have at most {schema['maxLength']} characters"
    if isinstance(value, dict):
        return _object_error(schema, value, where)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            error = schema_error(schema["items"], item, f"{where}[{i}]")
            if error:
                return error
    return None


def _object_error(schema: Mapping[str, Any], value: dict[str, Any], where: str) -> str | None:
    properties = schema.get("properties") or {}
    for name in schema.get("required") or ():
        if name not in value:
            return f"{where}.{name} is required"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            error = schema_error(properties[name], item, f"{where}.{name}")
        elif extra is False:
            error = f"{where}.{name} is not a known argument (known: {', '.join(sorted(properties)) or 'none'})"
        elif isinstance(extra, Mapping):
            error = schema_error(extra, item, f"{where}.{name}")
        else:
            error = None
        if error:
            return error
    return None


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True is not 1."""
    return type(a) is type(b) and a == b or (_TYPES["number"](a) and _TYPES["number"](b) and a == b)


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value) and not (name == "integer" and isinstance(value, float)):
            return name
    return type(value).__name__

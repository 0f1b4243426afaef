"""A valid instance of a JSON schema, built deterministically from the schema alone.

The scripted backend (dry runs) answers structured requests with it, and the test server
answers ``json_schema`` / ``json_object`` + ``schema`` requests with it: both need a reply any
validator of that schema accepts, without a model. Supports local ``$ref``, ``const``/``enum``,
``anyOf``/``oneOf``/``allOf``, typed objects and arrays with their bounds, and common string
formats.
"""

from __future__ import annotations

import math
from typing import Any, cast

__all__ = ["instance_from_schema"]


_STRING_FORMATS: dict[str, str] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
}


def _resolve_ref(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref[1:].split("/"):
        if part:
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return cast(dict[str, Any], node)


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    """The smallest allowed value (0 when unbounded), inside any exclusive bounds."""
    lo: float | None = schema.get("minimum")
    hi: float | None = schema.get("maximum")
    xlo: float | None = schema.get("exclusiveMinimum")
    xhi: float | None = schema.get("exclusiveMaximum")
    top = hi if hi is not None else xhi
    value: float
    if lo is not None:
        value = lo
    elif xlo is not None:
        # Strictly above the bound: the next integer, or halfway to the upper bound.
        value = math.floor(xlo) + 1 if integer or top is None else (xlo + top) / 2
    else:
        value = 0
    if hi is not None and value > hi:
        value = hi
    if xhi is not None and value >= xhi:
        value = math.ceil(xhi) - 1 if integer else xhi - 1
    return math.ceil(value) if integer else float(value)


def instance_from_schema(schema: dict[str, Any], root: dict[str, Any] | None = None, _depth: int = 0) -> Any:
    """Return a small JSON value that validates against ``schema``.

    Objects get every property, strings are ``"ok"`` (or a value fitting their ``format``),
    numbers their ``minimum`` or 0, booleans ``true``, arrays one item; ``const`` and
    ``enum`` are honoured, local ``$ref`` (``#/$defs/...`` as pydantic emits them) is
    resolved, and ``anyOf``/``oneOf`` take their first non-null branch.
    """
    root = schema if root is None else root
    if _depth > 64:  # a recursive schema with no way out: stop rather than loop forever
        return None
    deeper = _depth + 1
    if "$ref" in schema:
        target = _resolve_ref(schema["$ref"], root)
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return instance_from_schema(merged, root, deeper)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches: list[dict[str, Any]] | None = schema.get(key)
        if branches:
            for branch in branches:
                if branch.get("type") != "null":
                    return instance_from_schema(branch, root, deeper)
            return None
    if schema.get("allOf"):
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        properties: dict[str, Any] = dict(merged.get("properties", {}))
        for part in schema["allOf"]:
            part = _resolve_ref(part["$ref"], root) if "$ref" in part else part
            properties.update(part.get("properties", {}))
            merged = {**part, **merged}
        if properties:
            merged["properties"] = properties
        return instance_from_schema(merged, root, deeper)

    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
        else:
            return "ok"
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        return {name: instance_from_schema(sub, root, deeper) for name, sub in props.items()}
    if kind == "array":
        if "prefixItems" in schema:
            return [instance_from_schema(sub, root, deeper) for sub in schema["prefixItems"]]
        count = max(1, int(schema.get("minItems", 1)))
        if "maxItems" in schema:
            count = min(count, int(schema["maxItems"]))
        items: dict[str, Any] = schema.get("items") or {}
        return [instance_from_schema(items, root, deeper) for _ in range(count)]
    if kind == "string":
        text = _STRING_FORMATS.get(schema.get("format", ""), "ok")
        min_len = int(schema.get("minLength", 0))
        if len(text) < min_len:
            text += "k" * (min_len - len(text))
        if "maxLength" in schema:
            text = text[: int(schema["maxLength"])]
        return text
    if kind == "integer":
        return _number(schema, integer=True)
    if kind == "number":
        return _number(schema, integer=False)
    if kind == "boolean":
        return True
    return None



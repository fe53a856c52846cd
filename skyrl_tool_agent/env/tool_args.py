"""Check tool-call arguments against a tool's JSON schema (MCP ``inputSchema``), for the model.

Deliberately small: the checks a policy needs feedback on (known tool, required arguments,
unexpected arguments, basic JSON types, ``enum``, ``anyOf``/``oneOf`` of those), with messages
that say what to write instead. Anything this checker does not understand is not checked; the
tool server validates again anyway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SNIPPET_CHARS", "json_type_name", "snippet", "validate_arguments"]

#: Quoted snippets of the model's text inside error messages are cut to this many characters.
SNIPPET_CHARS = 60

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """A short, printable, UTF-8-safe excerpt of model text for an error message."""
    cut = text[:limit]
    cut = cut.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> '?'
    cut = cut.replace("\x00", "\\0").replace("\n", "\\n")
    return cut + ("..." if len(text) > limit else "")


def _type_ok(value: Any, schema: Mapping[str, Any]) -> bool | None:
    """Does ``value`` satisfy the basic ``type``/``enum``/``anyOf`` of ``schema``?

    Returns None when the schema says nothing this checker understands (then it is not checked).
    """
    if not isinstance(schema, Mapping):
        return None
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            verdicts = [_type_ok(value, opt) for opt in options]
            if any(v is None for v in verdicts):
                return None
            return any(verdicts)
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return False
    declared = schema.get("type")
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list):
        return None
    for name in names:
        if name == "null" and value is None:
            return True
        types = _JSON_TYPES.get(name) if isinstance(name, str) else None
        if types is None:
            continue
        if isinstance(value, bool) and name != "boolean":
            continue  # JSON true is not a number
        if isinstance(value, types):
            return True
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def _describe_type(schema: Mapping[str, Any]) -> str:
    if not isinstance(schema, Mapping):
        return "a valid value"
    if isinstance(schema.get("enum"), list):
        return "one of " + ", ".join(json.dumps(v)[:30] for v in schema["enum"][:10])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " or ".join(_describe_type(opt) for opt in schema[key][:5])
    declared = schema.get("type")
    if isinstance(declared, list):
        return " or ".join(str(d) for d in declared[:5])
    return str(declared)


def validate_arguments(
    name: str, arguments: dict[str, Any], tools: Mapping[str, Mapping[str, Any]], where: str
) -> list[str]:
    """Check a call of tool ``name`` against ``tools[name]`` (its argument schema).

    Returns model-facing errors prefixed with ``where`` (empty: acceptable). ``additionalProperties``
    absent counts as false (models often misspell argument names).
    """
    if name not in tools:
        valid = ", ".join(sorted(tools)) or "(none)"
        return [f"{where}: unknown tool '{snippet(name)}'; valid tools: {valid}"]
    schema = tools[name] or {}
    if not isinstance(schema, Mapping):
        return []
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        properties = {}
    errors: list[str] = []
    required = schema.get("required") or []
    missing = [r for r in required if isinstance(r, str) and r not in arguments]
    if missing:
        errors.append(
            f"{where}: tool '{name}' is missing required argument(s): {', '.join(missing)}"
        )
    extra_allowed = schema.get("additionalProperties")
    if extra_allowed is not True and not isinstance(extra_allowed, Mapping):
        unexpected = [k for k in arguments if k not in properties]
        if unexpected:
            allowed = ", ".join(properties) or "(none)"
            shown = ", ".join(snippet(k, 30) for k in unexpected[:5])
            errors.append(
                f"{where}: tool '{name}' got unexpected argument(s): {shown}; allowed: {allowed}"
            )
    for key, value in arguments.items():
        prop = properties.get(key)
        if prop is not None and _type_ok(value, prop) is False:
            errors.append(
                f"{where}: argument '{snippet(key, 30)}' of tool '{name}' must be {_describe_type(prop)}, "
                f"got {json_type_name(value)}"
            )
    return errors


#: Decoded JSON values' type names, bool before int (a bool is an int in Python); anything else is "object".
_TYPE_NAMES = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"))


def json_type_name(value: Any) -> str:
    """The JSON type name of a decoded JSON value (for messages)."""
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), "object")

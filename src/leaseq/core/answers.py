"""A person's answer to a handler's question (``ctx.ask``): its schema, and the check of an answer against it.

The schema is a JSON Schema (a dict), or a pydantic model class whose
``model_json_schema()`` gives one. It is checked when the question is asked
(:func:`check_schema`), recorded with the question, and every answer is
checked against it before it is accepted (:func:`validate`): a bad answer is
refused with an :class:`InvalidInput` naming the field (``answer.priority``,
``answer.items[2]``), and nothing is written.

leaseq checks the part of JSON Schema that describes data, without a
dependency: ``type``, ``enum``, ``const``; ``properties``, ``required``,
``additionalProperties``, ``minProperties``, ``maxProperties``; ``items``,
``prefixItems``, ``minItems``, ``maxItems``, ``uniqueItems``; ``minLength``,
``maxLength``, ``pattern``; ``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``, ``multipleOf``; ``anyOf``, ``oneOf``, ``allOf``,
``not``; and ``$ref`` to the schema's own ``$defs`` (or ``definitions``),
which is what pydantic writes. Annotations (``title``, ``description``,
``default``, ``examples``, ``format``...) are kept and not checked. A schema
with any other keyword is refused when the question is asked, rather than
half-checked when it is answered.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from . import checks
from .errors import InvalidInput

#: Keywords that describe and do not constrain: kept, never checked.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "discriminator", "contentMediaType",
                         "contentEncoding"})
#: The keywords an answer is checked against.
ASSERTIONS = frozenset({"type", "enum", "const", "properties", "required", "additionalProperties", "minProperties",
                        "maxProperties", "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "minLength",
                        "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                        "multipleOf", "anyOf", "oneOf", "allOf", "not", "$ref", "$defs", "definitions"})
TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
#: A question's schema when none is given: a line of text.
TEXT: dict[str, Any] = {"type": "string"}
_REF = re.compile(r"^#/(\$defs|definitions)/([^/]+)$")
_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def schema_of(schema: Any) -> tuple[dict[str, Any], Any]:
    """``(JSON schema, model)``: for a pydantic model class its JSON schema and the class (to
    build an instance from the answer), for a dict the dict and None; None means :data:`TEXT`."""
    if schema is None:
        return dict(TEXT), None
    to_schema = getattr(schema, "model_json_schema", None) if isinstance(schema, type) else None
    if callable(to_schema):  # a pydantic model class (pydantic itself is optional)
        made = to_schema()
        if not isinstance(made, dict):
            raise InvalidInput("schema", f"{schema.__name__}.model_json_schema() gave no JSON schema")
        return made, schema
    if isinstance(schema, dict):
        return schema, None
    raise InvalidInput("schema", f"must be a JSON schema (a dict) or a pydantic model class (got {schema!r})")


def stored(schema: dict[str, Any]) -> str:
    """The schema as the ledger keeps it: JSON text, so its fields keep their order (PostgreSQL's
    jsonb sorts an object's keys, and a form should follow the order the question gave)."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def recorded(asked: dict[str, Any]) -> dict[str, Any]:
    """The schema of a question as the ledger recorded it (see :func:`stored`)."""
    value = asked.get("schema")
    if isinstance(value, str):
        loaded = json.loads(value)
        return loaded if isinstance(loaded, dict) else dict(TEXT)
    return value if isinstance(value, dict) else dict(TEXT)


def check_schema(schema: Any) -> dict[str, Any]:
    """A question's schema: a JSON object of the keywords leaseq checks (see the module)."""
    if not isinstance(schema, dict):
        raise InvalidInput("schema", f"must be a JSON schema, a JSON object (got {type(schema).__name__})")
    checks.check_json("schema", schema)
    _check_node(schema, schema, "schema")
    return schema


def _check_node(node: Any, root: dict[str, Any], at: str) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise InvalidInput(at, f"must be a schema (a JSON object, or true or false), got {_show(node)}")
    for key, value in node.items():
        if key in ANNOTATIONS:
            continue
        if key not in ASSERTIONS:
            raise InvalidInput(f"{at}.{key}", "is not a keyword leaseq checks answers against: use "
                                              + ", ".join(sorted(ASSERTIONS - {"$defs", "definitions"})))
        where = f"{at}.{key}"
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not names or any(n not in TYPES for n in names):
                raise InvalidInput(where, f"must be one of {', '.join(TYPES)}, or a list of them (got {_show(value)})")
        elif key in ("enum", "required"):
            if not isinstance(value, list) or not value:
                raise InvalidInput(where, "must be a non-empty list")
            if key == "required" and not all(isinstance(v, str) for v in value):
                raise InvalidInput(where, "must list field names (strings)")
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise InvalidInput(where, "must be an object of schemas")
            for name, sub in value.items():
                _check_node(sub, root, f"{where}.{name}")
        elif key in ("additionalProperties", "items", "not"):
            _check_node(value, root, where)
        elif key in ("prefixItems", "anyOf", "oneOf", "allOf"):
            if not isinstance(value, list) or not value:
                raise InvalidInput(where, "must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                _check_node(sub, root, f"{where}[{i}]")
        elif key in _COUNT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(where, f"must be a whole number, 0 or more (got {_show(value)})")
        elif key in _NUMBER_KEYS:
            if not _is_number(value) or (key == "multipleOf" and value <= 0):
                raise InvalidInput(where, f"must be a number{' above 0' if key == 'multipleOf' else ''} "
                                          f"(got {_show(value)})")
        elif key == "uniqueItems":
            if not isinstance(value, bool):
                raise InvalidInput(where, "must be true or false")
        elif key == "pattern":
            if not isinstance(value, str):
                raise InvalidInput(where, "must be a regular expression (a string)")
            try:
                re.compile(value)
            except re.error as exc:
                raise InvalidInput(where, f"is not a regular expression Python reads ({exc})") from None
        elif key == "$ref":
            _resolve(root, value, where)


def _resolve(root: dict[str, Any], ref: Any, at: str) -> Any:
    found = _REF.match(ref) if isinstance(ref, str) else None
    if found is None:
        raise InvalidInput(at, f"must point into the schema's own $defs, as #/$defs/Name (got {_show(ref)})")
    defs = root.get(found.group(1))
    if not isinstance(defs, dict) or found.group(2) not in defs:
        raise InvalidInput(at, f"points to {ref}, which the schema does not define")
    return defs[found.group(2)]


def validate(schema: dict[str, Any], value: Any, field: str = "answer") -> None:
    """Raise :class:`InvalidInput`, naming the first field that does not fit ``schema``
    (``answer``, ``answer.priority``, ``answer.items[2]``), unless ``value`` fits it."""
    _validate(schema, value, field, schema, 0)


def _validate(node: Any, value: Any, at: str, root: dict[str, Any], depth: int) -> None:
    if depth > 64:
        raise InvalidInput(at, "the schema refers to itself too deeply to check this answer")
    if node is True or node is None:
        return
    if node is False:
        raise InvalidInput(at, "no value is accepted here")
    if "$ref" in node:
        _validate(_resolve(root, node["$ref"], at), value, at, root, depth + 1)
    kinds = node.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is(name, value) for name in names):
            raise InvalidInput(at, f"must be {' or '.join(_A[n] for n in names)} (got {_show(value)})")
    if "enum" in node and not any(_same(value, v) for v in node["enum"]):
        raise InvalidInput(at, f"must be one of {', '.join(_show(v) for v in node['enum'])} (got {_show(value)})")
    if "const" in node and not _same(value, node["const"]):
        raise InvalidInput(at, f"must be {_show(node['const'])} (got {_show(value)})")
    if isinstance(value, str):
        _check_string(node, value, at)
    elif _is_number(value):
        _check_number(node, value, at)
    elif isinstance(value, dict):
        _check_object(node, value, at, root, depth)
    elif isinstance(value, list):
        _check_array(node, value, at, root, depth)
    for sub in node.get("allOf", ()):
        _validate(sub, value, at, root, depth + 1)
    if "anyOf" in node:
        _one_of(node["anyOf"], value, at, root, depth, exactly_one=False)
    if "oneOf" in node:
        _one_of(node["oneOf"], value, at, root, depth, exactly_one=True)
    if "not" in node:
        try:
            _validate(node["not"], value, at, root, depth + 1)
        except InvalidInput:
            pass
        else:
            raise InvalidInput(at, f"must not be {_show(value)}")


def _check_string(node: dict[str, Any], value: str, at: str) -> None:
    if "minLength" in node and len(value) < node["minLength"]:
        raise InvalidInput(at, f"must be at least {node['minLength']} characters (got {len(value)})")
    if "maxLength" in node and len(value) > node["maxLength"]:
        raise InvalidInput(at, f"must be at most {node['maxLength']} characters (got {len(value)})")
    if "pattern" in node and re.search(node["pattern"], value) is None:
        raise InvalidInput(at, f"must match the pattern {node['pattern']} (got {_show(value)})")


def _check_number(node: dict[str, Any], value: float, at: str) -> None:
    for key, words in (("minimum", "at least"), ("maximum", "at most"), ("exclusiveMinimum", "more than"),
                       ("exclusiveMaximum", "less than")):
        if key not in node:
            continue
        bound = node[key]
        fails = {"minimum": value < bound, "maximum": value > bound, "exclusiveMinimum": value <= bound,
                 "exclusiveMaximum": value >= bound}[key]
        if fails:
            raise InvalidInput(at, f"must be {words} {bound} (got {_show(value)})")
    step = node.get("multipleOf")
    if step is not None:
        ratio = value / step
        if not math.isclose(ratio, round(ratio), rel_tol=0, abs_tol=1e-9):
            raise InvalidInput(at, f"must be a multiple of {step} (got {_show(value)})")


def _check_object(node: dict[str, Any], value: dict[str, Any], at: str, root: dict[str, Any], depth: int) -> None:
    properties: dict[str, Any] = node.get("properties", {})
    for name in node.get("required", ()):
        if name not in value:
            raise InvalidInput(f"{at}.{name}", "is required")
    for name, item in value.items():
        if name in properties:
            _validate(properties[name], item, f"{at}.{name}", root, depth + 1)
            continue
        extra = node.get("additionalProperties", True)
        if extra is False:
            known = ", ".join(properties) or "none"
            raise InvalidInput(f"{at}.{name}", f"is not a field of this answer (its fields: {known})")
        _validate(extra, item, f"{at}.{name}", root, depth + 1)
    if "minProperties" in node and len(value) < node["minProperties"]:
        raise InvalidInput(at, f"must have at least {node['minProperties']} fields")
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        raise InvalidInput(at, f"must have at most {node['maxProperties']} fields")


def _check_array(node: dict[str, Any], value: list[Any], at: str, root: dict[str, Any], depth: int) -> None:
    if "minItems" in node and len(value) < node["minItems"]:
        raise InvalidInput(at, f"must have at least {node['minItems']} items (got {len(value)})")
    if "maxItems" in node and len(value) > node["maxItems"]:
        raise InvalidInput(at, f"must have at most {node['maxItems']} items (got {len(value)})")
    prefix = node.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else node.get("items", True)
        _validate(sub, item, f"{at}[{i}]", root, depth + 1)
    if node.get("uniqueItems"):
        seen: list[Any] = []
        for i, item in enumerate(value):
            if any(_same(item, s) for s in seen):
                raise InvalidInput(f"{at}[{i}]", f"repeats an earlier item ({_show(item)}): items must be unique")
            seen.append(item)


def _one_of(options: list[Any], value: Any, at: str, root: dict[str, Any], depth: int, *, exactly_one: bool) -> None:
    errors: list[InvalidInput] = []
    for sub in options:
        try:
            _validate(sub, value, at, root, depth + 1)
        except InvalidInput as exc:
            errors.append(exc)
    fitting = len(options) - len(errors)
    if fitting == 0:
        deeper = [e for e in errors if e.field != at]
        if len(deeper) == 1:  # one option fits its shape and fails inside (Optional[Model], say): its error says most
            raise deeper[0]
        if len(errors) == 1:
            raise errors[0]
        raise InvalidInput(at, "must be one of: " + "; or ".join(dict.fromkeys(e.problem for e in errors)))
    if exactly_one and fitting > 1:
        raise InvalidInput(at, f"fits {fitting} of the schema's oneOf options, and must fit exactly one")


_A = {"string": "a string", "number": "a number", "integer": "an integer", "boolean": "true or false",
      "object": "an object", "array": "a list", "null": "null"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is(name: str, value: Any) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "number":
        return _is_number(value)
    if name == "integer":
        return _is_number(value) and float(value).is_integer()
    if name == "boolean":
        return isinstance(value, bool)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    return value is None


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


# -- what a person is shown -----------------------------------------------------------

def resolve(schema: dict[str, Any], node: Any) -> Any:
    """``node`` with its ``$ref`` followed (within ``schema``), for presenting it."""
    for _ in range(32):
        if not isinstance(node, dict) or "$ref" not in node:
            return node
        node = _resolve(schema, node["$ref"], "schema")
    return node


def optional_inner(schema: dict[str, Any], node: Any) -> tuple[Any, bool]:
    """``(schema, nullable)``: pydantic's ``X | None`` (``anyOf: [X, {"type": "null"}]``) as X."""
    node = resolve(schema, node)
    options = node.get("anyOf") if isinstance(node, dict) else None
    if isinstance(options, list) and len(options) == 2:
        nulls = [o for o in options if isinstance(o, dict) and o.get("type") == "null"]
        if len(nulls) == 1:
            [inner] = [o for o in options if o is not nulls[0]]
            return resolve(schema, inner), True
    return node, False


def summary(schema: dict[str, Any]) -> str:
    """The schema in a line: ``approve: boolean, note?: string, level: "low"|"high"``."""
    return _summary(schema, schema, 0)


def _summary(schema: dict[str, Any], node: Any, depth: int) -> str:
    node, nullable = optional_inner(schema, node)
    if node is True or node == {}:
        return "any JSON"
    if not isinstance(node, dict):
        return "nothing"
    if "enum" in node:
        text = "|".join(_show(v) for v in node["enum"])
    elif "const" in node:
        text = _show(node["const"])
    elif node.get("type") == "object" or "properties" in node:
        if depth >= 2:
            text = "object"
        else:
            required = set(node.get("required", ()))
            parts = [f"{name}{'' if name in required else '?'}: {_summary(schema, sub, depth + 1)}"
                     for name, sub in node.get("properties", {}).items()]
            text = ("{" + ", ".join(parts) + "}") if depth else ", ".join(parts) or "object"
    elif node.get("type") == "array":
        text = f"list of {_summary(schema, node.get('items', True), depth + 1)}"
    elif isinstance(node.get("type"), list):
        text = "|".join(node["type"])
    elif isinstance(node.get("type"), str):
        text = node["type"]
    elif "anyOf" in node or "oneOf" in node:
        options: list[Any] = node.get("anyOf") or node.get("oneOf") or []
        text = "|".join(_summary(schema, s, depth + 1) for s in options)
    else:
        text = "any JSON"
    return f"{text}|null" if nullable else text

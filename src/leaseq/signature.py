"""Check a task's payload against its handler's signature before anything is written.

A handler ``fn(ctx, doc_id: int, tags: list[str] | None = None)`` receives its
payload as keyword arguments, so a payload with a missing, unknown or ill-typed
argument would fail on every attempt on a worker, long after the caller moved on.
:func:`bind_payload` refuses it at the enqueue call instead, with an
:class:`~leaseq.InvalidInput` that names the argument.

Values are checked against the annotations a JSON payload can satisfy: ``int``,
``float`` (an int is accepted), ``str``, ``bool``, ``None``, ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]``, unions, ``Optional``, ``Literal`` and
``Any``; ``TypedDict`` classes are checked key by key. Other annotations (your
own classes, unresolvable forward references) are not checked here: the handler
receives JSON and converts it itself.

The check works on a JSON description of the signature (:func:`describe`), the
one rule for both places a payload is checked: at ``TaskDefinition.enqueue``,
from the handler itself, and at the CLI's and the service's enqueue, from the
description a worker declared when it registered (:func:`check_payload`).
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from .core.errors import InvalidInput

_NOT_CHECKED = object()


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # forward references that do not resolve: check names only
        return {}


def check_handler(fn: Callable[..., Any]) -> None:
    """Refuse (``InvalidInput``, field ``fn``) a handler that cannot take a payload:
    no ``ctx`` parameter, or payload parameters that cannot be named."""
    if not callable(fn):
        raise InvalidInput("fn", "a handler must be callable")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD):
        raise InvalidInput("fn", "a handler takes ctx as its first argument")
    for p in params[1:]:
        if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
            raise InvalidInput("fn", f"parameter {p.name!r}: a payload is sent by name, so a handler "
                                     "cannot take positional-only or *args parameters")


#: The deepest description :func:`check_spec` accepts (a nesting of list[dict[...]]...).
MAX_DEPTH = 20
_ANY: dict[str, Any] = {"any": True}
_SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}
_JSON_LITERAL = (str, int, bool, type(None))


@lru_cache(maxsize=4096)
def describe(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON description of ``fn(ctx, ...)``'s payload arguments: ``{"ctx": name,
    "params": [{"name", "required", "positional", "type", "shows"}], "extra": bool}``
    (``extra``: it takes ``**kwargs``). What a worker declares for the kind, and what
    :func:`bind_payload` checks against."""
    sig = inspect.signature(fn)
    ctx_name, *rest = sig.parameters
    hints = _hints(fn)
    params = []
    for name in rest:
        p = sig.parameters[name]
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        hint = hints.get(name, Any)
        params.append({"name": name, "required": p.default is p.empty,
                       "positional": p.kind is p.POSITIONAL_OR_KEYWORD, "type": _spec(hint),
                       "shows": _describe(hint)})
    extra = any(sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD for name in rest)
    return {"ctx": ctx_name, "params": params, "extra": extra}


def payload_arguments(payload: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How a worker passes ``payload`` to its handler: an object as keyword arguments,
    ``null`` as none, anything else as the one positional argument."""
    if isinstance(payload, dict):
        return (), payload
    return ((payload,), {}) if payload is not None else ((), {})


@lru_cache(maxsize=4096)
def _call_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # nothing to read (a builtin): the call itself will tell
        return None


def call_problem(fn: Callable[..., Any], ctx: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """Why ``fn(ctx, *args, **kwargs)`` cannot be called (Python's own ``TypeError``
    text: a missing or unknown argument), or None. A worker asks before calling its
    handler: a payload that does not fit fails the task at once, never retried."""
    sig = _call_signature(fn)
    if sig is None:
        return None
    try:
        sig.bind(ctx, *args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def bind_payload(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The payload ``fn(ctx, *args, **kwargs)`` would receive, as a dict of keyword
    arguments, or :class:`InvalidInput` naming the first argument that is missing,
    unknown, given twice or of the wrong type."""
    return _bind(describe(fn), args, kwargs)


def check_payload(signature: Mapping[str, Any], payload: Any) -> None:
    """Refuse (:class:`InvalidInput` naming the argument, or ``payload``) a payload
    that does not fit a declared signature (:func:`describe`), as the worker would
    call the handler with it (:func:`payload_arguments`)."""
    args, kwargs = payload_arguments(payload)
    _bind(signature, args, kwargs)


def _bind(sig: Mapping[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    named = list(sig["params"])
    positional = [p for p in named if p["positional"]]
    if len(args) > len(positional):
        raise InvalidInput("payload", f"{len(args)} positional arguments given, the handler takes "
                                      f"{len(positional)} besides ctx")
    payload: dict[str, Any] = {p["name"]: value for p, value in zip(positional, args)}
    known = {p["name"] for p in named}
    for name, value in kwargs.items():
        if name in payload:
            raise InvalidInput(name, "given twice (positionally and by name)")
        if name not in known and not sig["extra"] or name == sig["ctx"]:
            raise InvalidInput(name, f"unknown argument: the handler takes {_names(named)}")
        payload[name] = value
    for p in named:
        if p["name"] not in payload and p["required"]:
            raise InvalidInput(p["name"], "missing: the handler has no default for it")
    types_ = {p["name"]: p for p in named}
    for name, value in payload.items():
        p = types_.get(name)
        if p is not None and not _fits(value, p["type"]):
            raise InvalidInput(name, f"expected {p['shows']}, got {type(value).__name__} {value!r:.60}")
    return payload


def _names(params: list[dict[str, Any]]) -> str:
    return ", ".join(p["name"] for p in params) or "no arguments"


def _describe(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return text or repr(hint).replace("typing.", "")


def _spec(hint: Any) -> dict[str, Any]:  # noqa: PLR0911 - one branch per kind of annotation
    """The JSON form of an annotation: what :func:`_fits` checks (``{"any": true}``: not checked)."""
    if hint is Any or hint is _NOT_CHECKED:
        return _ANY
    if hint is None or hint is type(None):
        return {"is": "null"}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return {"union": [_spec(a) for a in args]}
    if origin is typing.Literal:
        if all(type(a) in _JSON_LITERAL for a in args):
            return {"literal": list(args)}
        return _ANY  # an enum member is not JSON: the handler converts it
    if origin is typing.Annotated:
        return _spec(args[0])
    if hint in _SCALARS:
        return {"is": _SCALARS[hint]}
    if hint in (list, tuple):
        return {"is": "list"}
    if hint is dict:
        return {"is": "dict"}
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"tuple": [_spec(a) for a in args]}
        return {"items": _spec(args[0]) if args else _ANY}
    if origin in (dict, collections.abc.Mapping):
        key, item = (args + (Any, Any))[:2] if args else (Any, Any)
        return {"keys": _spec(key), "values": _spec(item)}
    if typing.is_typeddict(hint):
        try:
            fields = typing.get_type_hints(hint)
        except Exception:
            return _ANY
        required = getattr(hint, "__required_keys__", frozenset(fields))
        return {"fields": {k: _spec(v) for k, v in fields.items()}, "required": sorted(required)}
    return _ANY  # not a JSON shape we check: the handler converts it


def _fits(value: Any, spec: Mapping[str, Any]) -> bool:  # noqa: PLR0911 - one branch per shape
    if "any" in spec:
        return True
    if "is" in spec:
        kind = spec["is"]
        if kind == "null":
            return value is None
        if kind == "bool":
            return isinstance(value, bool)
        if kind == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if kind == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "str":
            return isinstance(value, str)
        if kind == "list":
            return isinstance(value, (list, tuple))
        return isinstance(value, dict)
    if "union" in spec:
        return any(_fits(value, a) for a in spec["union"])
    if "literal" in spec:
        return any(value == a and type(value) is type(a) for a in spec["literal"])
    if "tuple" in spec:
        items = spec["tuple"]
        return isinstance(value, (list, tuple)) and len(value) == len(items) and all(
            _fits(v, a) for v, a in zip(value, items))
    if "items" in spec:
        return isinstance(value, (list, tuple)) and all(_fits(v, spec["items"]) for v in value)
    if "values" in spec:
        return isinstance(value, dict) and all(_fits(k, spec["keys"]) and _fits(v, spec["values"])
                                               for k, v in value.items())
    fields = spec["fields"]
    if not isinstance(value, dict) or not set(spec["required"]) <= value.keys() or not value.keys() <= fields.keys():
        return False
    return all(_fits(v, fields[k]) for k, v in value.items())


def check_spec(signature: Any, field: str = "signature") -> dict[str, Any]:
    """A declared signature as :func:`describe` makes it, checked (it comes over the wire
    from a worker); :class:`InvalidInput` naming ``field`` if it is not one."""
    def bad(why: str) -> InvalidInput:
        return InvalidInput(field, f"is not a payload signature: {why}")

    if not isinstance(signature, dict) or set(signature) != {"ctx", "params", "extra"}:
        raise bad("an object with ctx, params and extra")
    if not isinstance(signature["ctx"], str) or not isinstance(signature["extra"], bool) \
            or not isinstance(signature["params"], list):
        raise bad("ctx a string, params a list, extra true or false")
    for p in signature["params"]:
        if not isinstance(p, dict) or set(p) != {"name", "required", "positional", "type", "shows"} \
                or not isinstance(p["name"], str) or not isinstance(p["shows"], str) \
                or not isinstance(p["required"], bool) or not isinstance(p["positional"], bool):
            raise bad("each parameter an object with name, required, positional, type and shows")
        _check_type(p["type"], bad, 0)
    return signature


def _check_type(spec: Any, bad: Callable[[str], InvalidInput], depth: int) -> None:  # noqa: PLR0912
    if depth > MAX_DEPTH:
        raise bad(f"types nested more than {MAX_DEPTH} deep")
    if not isinstance(spec, dict) or len(spec) not in (1, 2):
        raise bad("each type an object")
    keys = set(spec)
    if keys == {"any"}:
        return
    if keys == {"is"} and spec["is"] in ("null", "bool", "int", "float", "str", "list", "dict"):
        return
    if keys == {"literal"} and isinstance(spec["literal"], list) \
            and all(type(v) in _JSON_LITERAL for v in spec["literal"]):
        return
    if keys in ({"union"}, {"tuple"}) and isinstance(spec[next(iter(keys))], list):
        for item in spec[next(iter(keys))]:
            _check_type(item, bad, depth + 1)
        return
    if keys == {"items"}:
        _check_type(spec["items"], bad, depth + 1)
        return
    if keys == {"keys", "values"}:
        _check_type(spec["keys"], bad, depth + 1)
        _check_type(spec["values"], bad, depth + 1)
        return
    if keys == {"fields", "required"} and isinstance(spec["fields"], dict) and isinstance(spec["required"], list) \
            and all(isinstance(k, str) and k in spec["fields"] for k in spec["required"]):
        for item in spec["fields"].values():
            _check_type(item, bad, depth + 1)
        return
    raise bad(f"unknown type {json.dumps(spec)[:60]}")


def check_enqueue(declaration: Mapping[str, Any] | None, payload: Any, effect: str | None) -> str:
    """The effect to enqueue a task with, where a worker declared its kind
    (``declaration``, :meth:`leaseq.Queue.kind_declaration`): the one given, else the
    declared one (``read_only`` when no worker declared the kind). Refuses
    (:class:`InvalidInput` naming the argument) a payload that does not fit the declared
    signature, before anything is written. The CLI's and the service's enqueue."""
    if declaration is None:
        return effect or "read_only"
    if declaration.get("signature") is not None:
        check_payload(declaration["signature"], payload)
    return effect or str(declaration["effect"])

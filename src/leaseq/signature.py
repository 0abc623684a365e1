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
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable, Mapping
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


def bind_payload(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The payload ``fn(ctx, *args, **kwargs)`` would receive, as a dict of keyword
    arguments, or :class:`InvalidInput` naming the first argument that is missing,
    unknown, given twice or of the wrong type."""
    sig = inspect.signature(fn)
    ctx_name, *rest = sig.parameters
    params = [sig.parameters[name] for name in rest]
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = [p for p in named if p.kind is p.POSITIONAL_OR_KEYWORD]
    if len(args) > len(positional):
        raise InvalidInput("payload", f"{len(args)} positional arguments given, the handler takes "
                                      f"{len(positional)} besides ctx")
    payload: dict[str, Any] = {p.name: value for p, value in zip(positional, args)}
    known = {p.name for p in named}
    for name, value in kwargs.items():
        if name in payload:
            raise InvalidInput(name, "given twice (positionally and by name)")
        if name not in known and not accepts_any or name == ctx_name:
            raise InvalidInput(name, f"unknown argument: the handler takes {_names(named)}")
        payload[name] = value
    for p in named:
        if p.name not in payload and p.default is p.empty:
            raise InvalidInput(p.name, "missing: the handler has no default for it")
    hints = _hints(fn)
    for name, value in payload.items():
        hint = hints.get(name)
        if hint is not None:
            problem = _mismatch(value, hint)
            if problem:
                raise InvalidInput(name, problem)
    return payload


def _names(params: list[inspect.Parameter]) -> str:
    return ", ".join(p.name for p in params) or "no arguments"


def _describe(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return text or repr(hint).replace("typing.", "")


def _mismatch(value: Any, hint: Any) -> str | None:
    """Why ``value`` does not fit ``hint`` (None if it does or the hint is not checked)."""
    if _fits(value, hint):
        return None
    return f"expected {_describe(hint)}, got {type(value).__name__} {value!r:.60}"


def _fits(value: Any, hint: Any) -> bool:  # noqa: PLR0911 - one branch per kind of annotation
    if hint is Any or hint is _NOT_CHECKED:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is typing.Annotated:
        return _fits(value, args[0])
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint in (str, list, dict, tuple):
        return isinstance(value, (list, tuple) if hint in (list, tuple) else hint)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        item = args[0] if args else Any
        return all(_fits(v, item) for v in value)
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return False
        key, item = (args + (Any, Any))[:2] if args else (Any, Any)
        return all(_fits(k, key) and _fits(v, item) for k, v in value.items())
    if typing.is_typeddict(hint):
        return _fits_typeddict(value, hint)
    return True  # not a JSON shape we check: the handler converts it


def _fits_typeddict(value: Any, hint: Any) -> bool:
    if not isinstance(value, dict):
        return False
    fields = typing.get_type_hints(hint)
    required = getattr(hint, "__required_keys__", frozenset(fields))
    if not required <= value.keys() or not value.keys() <= fields.keys():
        return False
    return all(_fits(v, fields[k]) for k, v in value.items())

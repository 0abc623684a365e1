"""Which resource a request names: :func:`route_param`, a ``resource=`` for :class:`FencingMiddleware`.

The path is matched by the application's own router, so the key is built
from the parameter the handler will receive, in one spelling per record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, InvalidInput

if TYPE_CHECKING:  # pragma: no cover
    from .middleware import Scope


def _normalise(value: Any) -> str:
    """A path parameter as one spelling per record: integers canonical (``01``, ``+1`` -> ``1``)."""
    text = str(value)
    try:
        return str(int(text))
    except ValueError:
        return text


def _match_route(routes: Iterable[Any], scope: Scope) -> dict[str, Any] | None:
    from starlette.routing import Match, Mount

    for route in routes:
        match, child = route.matches(scope)
        if match is not Match.FULL:
            continue
        params = dict(child.get("path_params", {}))
        if isinstance(route, Mount) and getattr(route, "routes", None):
            inner = _match_route(route.routes, {**scope, **child})
            return None if inner is None else {**params, **inner}
        return params
    return None


def route_param(name: str, *, prefix: str = "", convert: Callable[[Any], str] = _normalise
                ) -> Callable[[Scope], str | None]:
    """A ``resource=`` for :class:`FencingMiddleware`: ``prefix`` + the path parameter ``name``.

    The path is matched by the application's own router (Starlette or
    FastAPI routes, mounts included), so the parameter is the one the
    handler will receive. ``convert`` makes each record one key: the
    default turns anything that parses as an integer into its canonical
    form (``/orders/01``, ``/orders/+1`` and ``/orders/1`` are all
    ``order:1``) and keeps other values as they are. A request whose route
    has no such parameter (or no route) is not fenced.
    """
    if not isinstance(name, str) or not name:
        raise InvalidInput("name", "must be the name of a path parameter")

    def resource(scope: Scope) -> str | None:
        app = scope.get("app") or scope.get("leaseq.app")
        router = getattr(app, "router", None)
        routes = getattr(router, "routes", None) if router is not None else getattr(app, "routes", None)
        if routes is None:
            raise ConfigError("route_param: the application has no Starlette router to match the path with")
        params = _match_route(routes, scope)
        if params is None or name not in params:
            return None
        return f"{prefix}{convert(params[name])}"

    resource.__qualname__ = f"route_param({name!r}, prefix={prefix!r})"
    return resource

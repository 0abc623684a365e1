"""What a request does, read from the application's own routes: its resource and its action.

:func:`route_param` is a ``resource=`` for :class:`FencingMiddleware`: the
record a request names, from a path parameter. :class:`RouteActions` is the
middleware's table of actions: what each guarded route does, keyed by method
and path template as the routes were declared::

    RouteActions({"POST /orders/{order_id}/pay": "orders.pay",
                  "POST /orders/{order_id}/refund": "orders.refund"})

The path is matched by the application's own router (Starlette or FastAPI
routes, mounts and included routers), so the parameter is the one the
handler will receive and the template is the one its route was declared
with; :func:`match_route` does the matching for both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError, InvalidInput

if TYPE_CHECKING:  # pragma: no cover
    from .middleware import Scope

#: ``"METHOD /path/template"``: how a route is named in ``actions=`` and ``exempt=``.
_ROUTE_KEY = re.compile(r"([A-Za-z]+) +(/\S*)")
#: The scope key under which a request's :class:`RouteMatch` is kept once matched.
ROUTE_KEY = "leaseq.route"
#: The longest action name the queue accepts (``actions=[...]`` at enqueue).
MAX_ACTION = 200


def _normalise(value: Any) -> str:
    """A path parameter as one spelling per record: integers canonical (``01``, ``+1`` -> ``1``)."""
    text = str(value)
    try:
        return str(int(text))
    except ValueError:
        return text


@dataclass(frozen=True)
class RouteMatch:
    """The route of the application that a request reaches."""

    #: The request's method, upper case.
    method: str
    #: The route's path template as declared, mount prefixes included (``/v1/orders/{order_id}/pay``).
    template: str
    #: The path parameters the handler will receive.
    params: dict[str, Any]
    #: The route's name (FastAPI: the endpoint function's, unless ``name=`` was given), or None.
    name: str | None = None

    @property
    def key(self) -> str:
        """``"METHOD /path/template"``: the route as ``actions=`` and ``exempt=`` name it."""
        return f"{self.method} {self.template}"


def _routes_of(scope: Scope) -> list[Any]:
    app = scope.get("app") or scope.get("leaseq.app")
    router = getattr(app, "router", None)
    routes = getattr(router, "routes", None) if router is not None else getattr(app, "routes", None)
    if routes is None:
        raise ConfigError("the application has no Starlette router to match the request's path with; "
                          "pass resource= and action= callables that read the scope themselves")
    return list(routes)


def _match(routes: Iterable[Any], scope: Scope, prefix: str) -> tuple[str, dict[str, Any], str | None] | None:
    from starlette.routing import Host, Match, Mount

    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if callable(contexts):
            # FastAPI's include_router (from 0.16x): the included router's routes, each with the
            # include's prefix in its path; it takes the request only if one of them does.
            inner = _match([_effective(context) for context in contexts()], scope, prefix)
            if inner is not None:
                return inner
            continue
        match, child = route.matches(scope)
        if match is not Match.FULL:
            continue
        params = dict(child.get("path_params", {}))
        if isinstance(route, (Mount, Host)):
            here = prefix + (route.path if isinstance(route, Mount) else "")
            inner_routes = getattr(route, "routes", None)
            if not inner_routes:  # a mounted ASGI app with no routes of its own
                return here + "/{path:path}", params, getattr(route, "name", None)
            inner = _match(inner_routes, {**scope, **child}, here)
            return None if inner is None else (inner[0], {**params, **inner[1]}, inner[2])
        return prefix + str(getattr(route, "path", "")), params, getattr(route, "name", None)
    return None


def _effective(context: Any) -> Any:
    """An included FastAPI route as a route to match: the context itself for an APIRoute (it
    carries the include's prefix in its path), else the Starlette route built for it."""
    if getattr(context, "path", ""):
        return context
    return getattr(context, "starlette_route", None) or context


def match_route(scope: Scope) -> RouteMatch | None:
    """The route the application's router would give ``scope``, or None when no route takes it.

    A route answering the path for other methods only (a ``405``) takes
    nothing. Raises :class:`leaseq.ConfigError` when the application has no
    Starlette router.
    """
    method, path = str(scope["method"]).upper(), scope.get("path")
    cached = scope.get(ROUTE_KEY)
    if isinstance(cached, tuple) and cached[:2] == (method, path):  # matched once per request
        return cached[2]  # type: ignore[no-any-return]
    found = _match(_routes_of(scope), scope, "")
    result = None if found is None else RouteMatch(method, found[0], found[1], found[2])
    scope[ROUTE_KEY] = (method, path, result)
    return result


def route_key(key: str, field: str) -> str:
    """``key`` as a route is named (``"POST /orders/{order_id}/pay"``), checked; the method upper-cased."""
    if not isinstance(key, str) or not _ROUTE_KEY.fullmatch(key.strip()):
        raise InvalidInput(field, f"a route is named 'METHOD /path/template' as declared "
                           f"(e.g. 'POST /orders/{{order_id}}/pay'), not {key!r}")
    method, path = _ROUTE_KEY.fullmatch(key.strip()).groups()  # type: ignore[union-attr]
    return f"{method.upper()} {path}"


class RouteActions(Mapping[str, str]):
    """The action each route performs: ``"METHOD /path/template"`` -> action name.

    The template is the route's as declared (``@api.post("/orders/{order_id}/pay")``
    is ``"POST /orders/{order_id}/pay"``), with the prefix of any mount or
    included router. Called with an ASGI scope, it answers the action of the
    route the request reaches, or None when that route performs no declared
    action (or no route takes the request): :class:`FencingMiddleware`
    refuses such a guarded request.
    """

    def __init__(self, table: Mapping[str, str]):
        if not isinstance(table, Mapping) or not table:
            raise InvalidInput("actions", "must map at least one route ('POST /orders/{order_id}/pay') "
                               "to the action it performs ('orders.pay')")
        checked: dict[str, str] = {}
        for key, action in table.items():
            route = route_key(key, "actions")
            if not isinstance(action, str) or not action.strip() or len(action) > MAX_ACTION:
                raise InvalidInput("actions", f"{key!r}: the action must be a non-empty name of at most "
                                   f"{MAX_ACTION} characters, not {action!r}")
            if route in checked:
                raise InvalidInput("actions", f"{route!r} is listed twice")
            checked[route] = action
        self._table = checked

    def __getitem__(self, key: str) -> str:
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"RouteActions({self._table!r})"

    def __call__(self, scope: Scope) -> str | None:
        found = match_route(scope)
        return None if found is None else self._table.get(found.key)


def route_param(name: str, *, prefix: str = "", convert: Callable[[Any], str] = _normalise
                ) -> Callable[[Scope], str | None]:
    """A ``resource=`` for :class:`FencingMiddleware`: ``prefix`` + the path parameter ``name``.

    The path is matched by the application's own router (Starlette or
    FastAPI routes, mounts included), so the parameter is the one the
    handler will receive. ``convert`` makes each record one key: the
    default turns anything that parses as an integer into its canonical
    form (``/orders/01``, ``/orders/+1`` and ``/orders/1`` are all
    ``order:1``) and keeps other values as they are. A request whose route
    has no such parameter (or no route) names no resource: the middleware
    refuses it if its method is guarded, unless its route is in ``exempt=``.
    """
    if not isinstance(name, str) or not name:
        raise InvalidInput("name", "must be the name of a path parameter")

    def resource(scope: Scope) -> str | None:
        found = match_route(scope)
        if found is None or name not in found.params:
            return None
        return f"{prefix}{convert(found.params[name])}"

    resource.__qualname__ = f"route_param({name!r}, prefix={prefix!r})"
    return resource

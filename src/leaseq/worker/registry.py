"""The handlers a worker runs, by task kind.

The runtime depends on a :class:`Registry`, never on :class:`leaseq.App`:
the app fills one as ``@app.task`` declares handlers, and hands it to the
runtime. A worker claims only the kinds its registry holds, so workers
running different handlers can share a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..core.errors import InvalidInput
from ..signature import describe


class Handler(Protocol):
    """One declared handler: what the runtime reads of a :class:`leaseq.TaskDefinition`."""

    # read-only: a TaskDefinition is frozen
    @property
    def kind(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...


class Registry:
    """Handlers by task kind, under a name that error messages use."""

    def __init__(self, name: str):
        self.name = name
        #: kind -> handler, in declaration order
        self.handlers: dict[str, Handler] = {}
        #: name -> :class:`leaseq.schedules.Schedule`: what the worker fires (see :mod:`leaseq.schedules`)
        self.schedules: dict[str, Any] = {}
        #: the version of the handlers' code (``App(version=...)``; None: none declared) and the
        #: versions whose started tasks a worker of it serves (None: any)
        self.version: str | None = None
        self.compatible_versions: list[str] | None = None

    def add(self, handler: Handler) -> None:
        """Declare ``handler`` for its kind; a kind is declared once."""
        if handler.kind in self.handlers:
            raise InvalidInput("kind", f"{handler.kind!r} is already declared in {self.name}")
        self.handlers[handler.kind] = handler

    def get(self, kind: str) -> Handler | None:
        """The handler declared for ``kind``, if any."""
        return self.handlers.get(kind)

    def kinds(self) -> list[str]:
        """The declared kinds, sorted (what a worker claims)."""
        return sorted(self.handlers)

    def declarations(self) -> list[dict[str, Any]]:
        """What a worker announces at registration: each kind with its queue and declared
        options (effect, actions, and the payload signature, :func:`leaseq.signature.describe`)."""
        out = []
        for h in self.handlers.values():
            try:
                signature: dict[str, Any] | None = describe(h.fn)
            except (TypeError, ValueError):  # no signature to read (a builtin): nothing to check against
                signature = None
            out.append({"kind": h.kind, "queue": h.queue, "effect": getattr(h, "effect", "read_only"),
                        "actions": getattr(h, "actions", None), "signature": signature})
        return out

    def queue_names(self) -> list[str]:
        """The queues the handlers' tasks are declared on, in declaration order."""
        return list(dict.fromkeys(h.queue for h in self.handlers.values()))

    def check_runnable(self) -> None:
        """Raise :class:`InvalidInput` (field ``app``) if no handler is declared: a worker
        with none would claim nothing, or, with no kind filter, every task only to fail it."""
        if not self.handlers:
            raise InvalidInput("app", f"{self.name} declares no task handlers (declare them with @app.task "
                                      "before starting a worker)")

    def __len__(self) -> int:
        return len(self.handlers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.handlers)

    def __contains__(self, kind: object) -> bool:
        return kind in self.handlers


class HandlerSource(Protocol):
    """What a runtime can be built from besides a bare :class:`Registry`: an :class:`leaseq.App`."""

    registry: Registry

    @property
    def queue(self) -> Any: ...

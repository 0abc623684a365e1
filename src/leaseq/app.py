"""App: declare task handlers once, enqueue them, run workers for them.

    app = leaseq.App("postgresql://…")          # or leaseq.App() for the embedded default

    @app.task("summarize", effect="read_only", lease_seconds=30)
    async def summarize(ctx, doc_id: int): ...

    summarize.enqueue(doc_id=1)                  # checked against summarize's signature
    summarize.options(key="doc-1").enqueue(doc_id=1)
    app.run_worker(concurrency=16)
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from .core import checks
from .core.errors import InvalidInput
from .core.model import Task
from .core.retry import RetryPolicy
from .engine.approvals import check_approval
from .engine.budgets import check_budget
from .engine.effects import check_actions
from .engine.enqueue import check_budgets
from .engine.fairness import check_weight
from .engine.limits import check_limits, check_units
from .engine.operator import check_versions
from .queue import Queue, connect
from .schedules import Schedule
from .signature import bind_payload, check_handler
from .worker.registry import Registry
from .worker.runtime import WorkerRuntime, WorkerStats


P = ParamSpec("P")
R = TypeVar("R")

#: the enqueue options a payload argument cannot be confused with (see TaskDefinition.options)
_LEGACY_OPTIONS = {"_key": "key", "_delay": "delay", "_priority": "priority"}


@dataclass
class TaskDefinition(Generic[P, R]):
    """A handler and the defaults its tasks are enqueued with.

    Its :meth:`enqueue` takes the handler's own arguments (after ``ctx``), checked
    against the handler's signature, statically by a type checker and at the call:
    a missing, unknown or ill-typed argument is an :class:`~leaseq.InvalidInput`
    naming it, and nothing is written."""

    app: App
    kind: str
    fn: Callable[Concatenate[Any, P], R]
    effect: str
    queue: str
    lease_seconds: float
    max_attempts: int
    priority: int
    #: the actions its tasks may begin (None: undeclared; see Queue.enqueue)
    actions: list[str] | None = None
    #: how its failures are retried (None: the queue's 1 s - 1 h backoff for every error)
    retry: RetryPolicy | None = None
    #: seconds one attempt may run (None: no limit); its tasks are enqueued with it
    timeout: float | None = None
    #: how long after its enqueue a task may still start (None: no deadline)
    deadline: timedelta | None = None
    #: "required": its tasks wait for an operator's approval (see Queue.enqueue)
    approval: str | None = None
    #: seconds an approval request waits before it is denied (None: no deadline)
    approval_deadline: float | None = None
    #: the limits its tasks count against (None: none; see Queue.set_limit)
    limits: list[str] | None = None
    #: its tasks' weight in limits that count units (see Queue.enqueue)
    units: int = 1
    #: what each of its tasks may consume, by key, over all its attempts (None: no budget)
    budget: dict[str, int] | None = None
    #: the fairness key its tasks are enqueued with (None: none; see Queue.enqueue)
    fairness_key: str | None = None
    #: their share against other keys' (see Queue.enqueue)
    fairness_weight: float = 1.0
    #: enqueue options bound by :meth:`options`
    bound: dict[str, Any] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (tests, scripts): ``ctx`` must be given."""
        return self.fn(*args, **kwargs)

    def options(self, *, key: str | None = None, delay: float = 0, priority: int | None = None,
                timeout: float | None = None, deadline: datetime | timedelta | None = None,
                after: Iterable[int] | None = None, on_dependency_failure: str = "cancel",
                connection: Any = None, units: int | None = None,
                resources: Iterable[str] | None = None,
                budget: Mapping[str, int] | None = None, fairness_key: str | None = None,
                fairness_weight: float | None = None) -> TaskDefinition[P, R]:
        """This definition with enqueue options bound: ``key`` is the idempotency key (a
        repeat with the same payload and options returns the existing task; another
        payload or option is refused, see :meth:`leaseq.Queue.enqueue`), ``delay`` seconds before
        it may be claimed, ``priority``, ``timeout`` and ``deadline`` (a time, or a
        timedelta from the enqueue) instead of the declared ones; ``after``, the tasks
        it waits for, and ``connection``, the application's own open transaction to
        write it in (see :meth:`leaseq.Queue.enqueue`); ``units``, the task's weight in
        limits that count units (a token estimate, say), instead of the declared one;
        ``resources``, the resource keys its effects may name (see :meth:`leaseq.Queue.enqueue`);
        ``budget``, what the task may consume (``ctx.consume``), instead of the declared one;
        ``fairness_key`` and ``fairness_weight``, the tenant it is served for and its share,
        instead of the declared ones (see :meth:`leaseq.Queue.enqueue`).
        ``summarize.options(key="doc-1").enqueue(doc_id=1)``."""
        bound = {**self.bound, "key": key, "delay": delay, "priority": priority, "timeout": timeout,
                 "deadline": deadline, "after": after, "on_dependency_failure": on_dependency_failure,
                 "connection": connection, "units": units, "resources": resources,
                 "budget": check_budget(budget), "fairness_key": fairness_key,
                 "fairness_weight": fairness_weight}
        return dataclasses.replace(self, bound=bound)

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The payload :meth:`enqueue` would send for these arguments (checked)."""
        return bind_payload(self.fn, args, kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """Enqueue one task whose handler will be called as ``fn(ctx, *args, **kwargs)``
        (sent as keyword arguments). Use :meth:`options` for a key, delay or priority."""
        payload, options = self._enqueue_call(args, kwargs)
        return self.app.queue.enqueue(self.kind, payload, **options)

    async def enqueue_async(self, *args: P.args, **kwargs: P.kwargs) -> Task:
        """:meth:`enqueue` for asyncio code: :meth:`leaseq.AsyncQueue.enqueue`, so on PostgreSQL
        it is awaited on the event loop and shares its commit with the enqueues made beside it
        (an ``options(connection=...)`` of the blocking kind is used from a thread)."""
        payload, options = self._enqueue_call(args, kwargs)
        if options.get("connection") is not None and not _is_async_connection(options["connection"]):
            return await asyncio.to_thread(self.app.queue.enqueue, self.kind, payload, **options)
        from .aio import AsyncQueue

        return await AsyncQueue(self.app.queue).enqueue(self.kind, payload, **options)

    def _enqueue_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The payload and the queue's enqueue options for a call of :meth:`enqueue`."""
        options = dict(self.bound)
        for legacy, name in _LEGACY_OPTIONS.items():
            if legacy in kwargs:
                warnings.warn(f"{legacy}= is deprecated: use .options({name}=...).enqueue(...)",
                              DeprecationWarning, stacklevel=3)
                options[name] = kwargs.pop(legacy)
        payload = bind_payload(self.fn, args, kwargs)
        priority, timeout, deadline = options.get("priority"), options.get("timeout"), options.get("deadline")
        units = options.get("units")
        budget = options.get("budget")
        fairness_key = self.fairness_key if options.get("fairness_key") is None else options["fairness_key"]
        # the declared weight goes with a key; a weight bound without one is refused by the enqueue
        fairness_weight = options.get("fairness_weight")
        if fairness_weight is None:
            fairness_weight = self.fairness_weight if fairness_key is not None else 1.0
        return payload, dict(
            effect=self.effect, queue=self.queue, idempotency_key=options.get("key"), delay=options.get("delay", 0),
            priority=self.priority if priority is None else priority, max_attempts=self.max_attempts,
            lease_seconds=self.lease_seconds, actions=self.actions,
            timeout=self.timeout if timeout is None else timeout,
            deadline=self.deadline if deadline is None else deadline, approval=self.approval,
            approval_deadline=self.approval_deadline, limits=self.limits,
            units=self.units if units is None else units, budget=self.budget if budget is None else budget,
            fairness_key=fairness_key, fairness_weight=fairness_weight,
            **{name: options[name] for name in ("after", "connection", "resources") if options.get(name) is not None},
            **({"on_dependency_failure": options["on_dependency_failure"]} if options.get("after") is not None else {}))


def _is_async_connection(connection: Any) -> bool:
    """Whether ``connection`` is an asyncio driver's (psycopg's ``AsyncConnection``)."""
    return inspect.iscoroutinefunction(getattr(connection, "execute", None))


def _caller_module() -> str:
    """The module that created the App (its default name), as Flask names an app."""
    try:
        return sys._getframe(2).f_globals.get("__name__") or "app"
    except (AttributeError, ValueError):  # pragma: no cover - no frame introspection
        return "app"


class App:
    """A set of task handlers bound to one queue database.

    ``name`` labels the app in messages (default: the module that created it).

    ``version`` names the version of the handlers' code (a release, a commit):
    each task records the version it started under (its first claim's worker's),
    and a worker of this app claims a task already started only under one of
    ``compatible_versions`` (default: only ``version`` itself, always among
    them), so a ledger recorded by one version of a handler is replayed only by
    code that declares it can. Tasks not yet started go to any worker; an app
    without a version serves tasks of every version.
    """

    def __init__(self, dsn: str | None = None, *, queue: Queue | None = None, name: str | None = None,
                 version: str | None = None, compatible_versions: Iterable[str] | None = None,
                 **connect_options: Any):
        self.dsn = dsn
        self._queue = queue
        self._connect_options = connect_options
        self._lock = threading.Lock()
        self.name = name if name is not None else _caller_module()
        #: the handlers, by kind: what a worker of this app runs
        self.registry = Registry(f"app {self.name!r}")
        self.registry.version, self.registry.compatible_versions = check_versions(version, compatible_versions)

    @property
    def version(self) -> str | None:
        """The version of the handlers' code (None: none declared)."""
        return self.registry.version

    @property
    def compatible_versions(self) -> list[str] | None:
        """The versions whose started tasks this app's workers serve (None: any)."""
        return self.registry.compatible_versions

    @property
    def definitions(self) -> dict[str, TaskDefinition[..., Any]]:
        """The declared handlers by kind."""
        return self.registry.handlers  # type: ignore[return-value]

    @property
    def queue(self) -> Queue:
        """The :class:`leaseq.Queue`, connected (and migrated) on first use."""
        with self._lock:
            if self._queue is None:
                queue = connect(self.dsn, **self._connect_options)
                queue.migrate()
                self._queue = queue
            return self._queue

    def task(self, kind: str | None = None, *, effect: str = "read_only", queue: str = "default",
             lease_seconds: float = checks.DEFAULT_LEASE_SECONDS, max_attempts: int = 5,
             priority: int = 0, actions: list[str] | None = None, retry: RetryPolicy | None = None,
             timeout: float | None = None, deadline: timedelta | None = None, approval: str | None = None,
             approval_deadline: float | None = None, limits: list[str] | None = None, units: int = 1,
             budget: Mapping[str, int] | None = None,
             fairness_key: str | None = None, fairness_weight: float = 1.0,
             ) -> Callable[[Callable[Concatenate[Any, P], R]], TaskDefinition[P, R]]:
        """Decorator declaring a handler ``fn(ctx, **payload)``, sync or async.

        ``actions`` lists the effects (``ctx.effect(action)``) its tasks may
        begin; the queue refuses any other. Undeclared (None): any action for
        an idempotent or side_effect task, none for a read_only one.

        ``retry`` (a :class:`leaseq.RetryPolicy`) decides which failures are
        retried and after how long, instead of the queue's 1 s - 1 h backoff.
        ``timeout``: seconds one attempt may run before the worker stops it
        and gives its lease up (reason ``timeout``). ``deadline``: a
        timedelta; a task not started that long after its enqueue never
        starts and ends ``expired``. Both are written on each task enqueued
        through the definition (:meth:`TaskDefinition.options` overrides
        them); a worker also applies ``timeout`` to tasks of this kind
        enqueued without one.
        ``approval="required"``: each task enqueued through the definition
        waits in ``awaiting_approval`` until an operator approves it, denied
        after ``approval_deadline`` seconds if given (see :meth:`Queue.enqueue`).
        ``limits`` names the limits its tasks count against, ``units`` their
        weight in limits that count units (see :meth:`Queue.set_limit`).
        ``budget`` (``{"tokens": 200_000}``): what each task may consume over all its
        attempts (``ctx.consume``); past it the task pauses for an approval (see
        :meth:`Queue.enqueue`).

        ``fairness_key`` and ``fairness_weight``: the tenant its tasks are served
        for and its share (see :meth:`Queue.enqueue`); the key is usually given per
        task (:meth:`TaskDefinition.options`), the declared weight then applying to it."""
        declared = None if actions is None else json.loads(check_actions(actions, checks.check_effect(effect)))
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInput("retry", f"must be a leaseq.RetryPolicy (got {type(retry).__name__})")
        budgets = check_budgets(timeout, deadline)
        if deadline is not None and not isinstance(deadline, timedelta):
            raise InvalidInput("deadline", "must be a timedelta from the enqueue (an absolute time belongs to "
                                           "one task: .options(deadline=...) or Queue.enqueue(deadline=...))")
        approval, approval_deadline = check_approval(approval, approval_deadline)
        limit_keys, weight = check_limits(limits), check_units(units)
        spend = check_budget(budget)
        fair_key = None if fairness_key is None else checks.check_key("fairness_key", fairness_key)
        fair_weight = check_weight(fairness_weight)

        def register(fn: Callable[Concatenate[Any, P], R]) -> TaskDefinition[P, R]:
            name = checks.check_kind(kind or f"{fn.__module__}.{fn.__qualname__}")
            if name in self.registry:
                raise InvalidInput("kind", f"{name!r} is already declared in this app")
            check_handler(fn)
            definition = TaskDefinition(
                app=self, kind=name, fn=fn, effect=checks.check_effect(effect), queue=checks.check_name("queue", queue),
                lease_seconds=checks.check_seconds("lease_seconds", lease_seconds, allow_zero=False),
                max_attempts=checks.check_int("max_attempts", max_attempts, minimum=1),
                priority=checks.check_int("priority", priority), actions=declared, retry=retry,
                timeout=budgets["timeout"], deadline=deadline, approval=approval,
                approval_deadline=approval_deadline, limits=limit_keys, units=weight, budget=spend,
                fairness_key=fair_key, fairness_weight=fair_weight)
            self.registry.add(definition)
            return definition

        return register

    def schedule(self, kind: str, *, cron: str | None = None, every: float | None = None, payload: Any = None,
                 name: str | None = None, catch_up: int = 1, queue: str | None = None) -> Schedule:
        """Enqueue a ``kind`` task with ``payload`` at every slot of ``cron`` (a cron
        expression, UTC) or ``every`` seconds: exactly one task per slot however
        many workers run this app, by the idempotency key
        ``schedule:<name>:<slot>``. Workers of this app fire it; after a pause at
        most ``catch_up`` missed slots are enqueued (the most recent).

        ``name`` (default: the kind) must be unique in the app. A kind declared
        with ``@app.task`` before the schedule gives its tasks its options
        (queue, effect, lease, attempts, priority, actions, fairness key); ``queue`` overrides
        the queue. Bad input raises :class:`InvalidInput` naming the field."""
        definition = self.definition(kind) if isinstance(kind, str) else None
        options: dict[str, Any] = {} if definition is None else dict(
            effect=definition.effect, queue=definition.queue, lease_seconds=definition.lease_seconds,
            max_attempts=definition.max_attempts, priority=definition.priority, actions=definition.actions,
            limits=definition.limits, units=definition.units)
        if definition is not None and definition.timeout is not None:
            options["timeout"] = definition.timeout
        if definition is not None and definition.budget is not None:
            options["budget"] = definition.budget
        if definition is not None and definition.fairness_key is not None:
            options.update(fairness_key=definition.fairness_key, fairness_weight=definition.fairness_weight)
        if queue is not None:
            options["queue"] = checks.check_name("queue", queue)
        declared = Schedule.declare(kind, cron=cron, every=every, payload=payload, name=name, catch_up=catch_up,
                                    options=options)
        if declared.name in self.registry.schedules:
            raise InvalidInput("name", f"a schedule named {declared.name!r} is already declared in this app")
        self.registry.schedules[declared.name] = declared
        return declared

    @property
    def schedules(self) -> list[Schedule]:
        """The declared schedules, in declaration order."""
        return list(self.registry.schedules.values())

    def definition(self, kind: str) -> TaskDefinition[..., Any] | None:
        """The handler declared for ``kind``, if any."""
        return self.definitions.get(kind)

    def queue_names(self) -> list[str]:
        """The queues this app's tasks are declared on, in declaration order."""
        return self.registry.queue_names()

    def check_runnable(self) -> None:
        """Raise :class:`InvalidInput` (field ``app``, naming this app) if it declares
        no handlers: a worker for it refuses to start."""
        self.registry.check_runnable()

    def worker(self, **options: Any) -> WorkerRuntime:
        """A :class:`WorkerRuntime` for this app (see its arguments)."""
        return WorkerRuntime(self, options.pop("transport", None), **options)

    def run_worker(self, *, until_idle: bool = False, install_signals: bool | None = None,
                   progress: Callable[[WorkerStats], None] | None = None, **options: Any) -> WorkerStats:
        """Run a worker in this thread until stopped (SIGTERM/SIGINT when in the
        main thread), or with ``until_idle`` until no work is left.
        Refuses to start when the app declares no handlers."""
        self.check_runnable()
        runtime = self.worker(**options)
        if install_signals is None:
            install_signals = threading.current_thread() is threading.main_thread()
        return asyncio.run(runtime.run(until_idle=until_idle, install_signals=install_signals, progress=progress))

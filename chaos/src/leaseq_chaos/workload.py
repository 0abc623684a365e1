"""The chaos workload: the task mix, and the handlers the worker processes run.

Every task's behaviour is decided when it is enqueued, from the run's seed,
and carried in its payload: how long it works (some long enough to need
several heartbeats), whether and how it fails (transiently, permanently,
for want of a credential, or after its side effect was sent but before the
response was recorded), and what it does to the downstream ledger:

* ``read_only``: nothing downstream;
* ``idempotent``: a fenced write under the effect's idempotency key, so a
  retry is replayed by the :class:`~leaseq.fencing.FencedStore`;
* ``side_effect``: a fenced write with *no* idempotency key, like an email
  that cannot be deduplicated downstream. Only the queue's recovery policy
  (an open intent goes to ``needs_reconciliation``, never back to the
  queue) keeps it from being sent twice, and the checker counts the sends.

Downstream writes go to the ``chaos_ledger`` table in a database of their
own, through the fenced store, with the attempt's claim generation as the
fencing token on the resource ``task:<id>``, and the action token verified
first when the queue signs them.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import leaseq
from leaseq.core.errors import CredentialMissing, Permanent, StaleToken

from .history import HistoryWriter, wall

QUEUE = "chaos"
PROBE_QUEUE = "chaos-probe"
ACTION = "ledger.write"
LEDGER_TABLE = "chaos_ledger"

#: Set by the worker process entry point.
HISTORY: HistoryWriter | None = None
PROC = "worker"

app = leaseq.App()  # $LEASEQ_DSN, set by the harness for each worker process
_fence: Any = None
_signer: Any = None


def _record(op: str, outcome: str, **fields: Any) -> None:
    if HISTORY is not None:
        HISTORY.record(op, outcome, **fields)


# -- the task mix ------------------------------------------------------------------


def task_spec(rng: random.Random, index: int, run_tag: str) -> dict[str, Any]:
    """Everything about task number ``index`` of a run: kind, effect, lease and payload."""
    roll = rng.random()
    if roll < 0.30:
        effect, kind = "read_only", ("chaos.read_async" if rng.random() < 0.3 else "chaos.read")
    elif roll < 0.58:
        effect, kind = "idempotent", "chaos.idempotent"
    else:
        effect, kind = "side_effect", "chaos.side_effect"
    long = rng.random() < 0.15
    payload: dict[str, Any] = {"work": round(rng.uniform(2.0, 4.0) if long else rng.uniform(0.01, 0.3), 3)}
    fault = rng.random()
    if fault < 0.12:
        payload["fail_until"] = rng.randint(1, 2)   # transient: fails attempts 1..n, then works
    elif fault < 0.15:
        payload["permanent"] = True
    elif fault < 0.17:
        payload["blocked"] = True
    elif fault < 0.22 and effect == "side_effect":
        payload["fail_after_send"] = True           # the ambiguous case: sent, response never recorded
    return {"kind": kind, "effect": effect, "payload": payload, "queue": QUEUE,
            "idempotency_key": f"{run_tag}-{index}", "lease_seconds": rng.choice([0.8, 1.0, 1.5]),
            "max_attempts": 6}


# -- the downstream ledger ------------------------------------------------------------


def ledger_schema(dialect: str) -> str:
    """The ledger table: one row per downstream write that was accepted."""
    serial = "BIGSERIAL" if dialect == "postgres" else "INTEGER"
    return (f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (id {serial} PRIMARY KEY, resource TEXT NOT NULL, "
            "idempotency_key TEXT NOT NULL, token BIGINT NOT NULL, task_id BIGINT NOT NULL, "
            "effect TEXT NOT NULL, proc TEXT NOT NULL)")


def _downstream() -> Any:
    global _fence, _signer
    if _fence is None:
        from leaseq.fencing import ActionSigner, FencedStore

        dsn = os.environ["LEASEQ_CHAOS_LEDGER_DSN"]
        _fence = FencedStore(dsn, **({"max_size": 4} if dsn.startswith("postgres") else {}))
        if os.environ.get("LEASEQ_ACTION_KEYS"):
            _signer = ActionSigner.from_env()
    return _fence


def send_downstream(ctx: leaseq.TaskContext, fx: Any, *, keyed: bool) -> Any:
    """Apply the task's ledger write through the fenced store; record what happened."""
    fence = _downstream()
    resource, token, key = f"task:{ctx.task_id}", fx.generation, fx.idempotency_key
    if _signer is not None and fx.token is not None:
        # Expiry is judged by the true clock, as a downstream service with a right clock would: the
        # token is issued on the queue database's clock, whoever signs it (the service for a remote
        # worker, a direct worker itself with its skewed clock; see docs/reliability.md, "Clock skew").
        _signer.verify(fx.token, action=ACTION, idempotency_key=key, generation=token,
                       now=wall(), leeway_seconds=1.0)
    mark = "%s" if fence.dialect == "postgres" else "?"

    def write(conn: Any) -> dict[str, Any]:
        conn.execute(f"INSERT INTO {LEDGER_TABLE} (resource, idempotency_key, token, task_id, effect, proc) "
                     f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark})",
                     (resource, key, token, ctx.task_id, ctx.task.effect, PROC))
        return {"token": token, "proc": PROC}

    fields = dict(task=ctx.task_id, gen=ctx.generation, resource=resource, token=token, key=key, keyed=keyed)
    try:
        out = fence.apply(resource, fx.fencing_token, write, idempotency_key=key if keyed else None)
    except StaleToken as exc:
        _record("downstream", "refused", **fields, newest=getattr(exc, "newest_token", None))
        raise
    except Exception as exc:
        _record("downstream", "unknown", **fields, error=type(exc).__name__)
        raise
    _record("downstream", "ok", **fields, replayed=out != {"token": token, "proc": PROC})
    return out


# -- handlers ------------------------------------------------------------------------------


def _fail_early(ctx: leaseq.TaskContext, payload: dict[str, Any]) -> None:
    if payload.get("blocked"):
        raise CredentialMissing("ledger credential revoked (chaos)")
    if payload.get("permanent"):
        raise Permanent("unprocessable input (chaos)")
    if ctx.task.attempts <= payload.get("fail_until", 0):
        raise RuntimeError(f"transient failure on attempt {ctx.task.attempts} (chaos)")


def _work(ctx: leaseq.TaskContext, seconds: float) -> None:
    left = seconds
    while left > 0:  # in slices, checking the lease between them
        step = min(0.25, left)
        ctx.pause(step)
        ctx.check()
        left -= step


def _result(ctx: leaseq.TaskContext) -> dict[str, Any]:
    """The handler's return value; called at the return, so the handler has
    succeeded: the "returned" record is what the checker holds the runtime to
    (a returned handler is never charged an attempt for the infrastructure)."""
    _record("returned", "ok", task=ctx.task_id, gen=ctx.generation)
    return {"task": ctx.task_id, "generation": ctx.generation, "proc": PROC}


def _effectful(ctx: leaseq.TaskContext, payload: dict[str, Any], *, keyed: bool) -> dict[str, Any]:
    _fail_early(ctx, payload)
    _work(ctx, payload.get("work", 0))
    with ctx.effect(ACTION) as fx:
        if not fx.replayed:
            out = send_downstream(ctx, fx, keyed=keyed)
            if payload.get("fail_after_send"):
                raise RuntimeError("connection reset after the request was sent (chaos)")
            fx.record(out)
    return _result(ctx)


@app.task("chaos.read", effect="read_only", queue=QUEUE, lease_seconds=1.0, max_attempts=6)
def read(ctx: leaseq.TaskContext, **payload: Any) -> dict[str, Any]:
    """Read-only work: safe to run again."""
    _fail_early(ctx, payload)
    _work(ctx, payload.get("work", 0))
    return _result(ctx)


@app.task("chaos.read_async", effect="read_only", queue=QUEUE, lease_seconds=1.0, max_attempts=6)
async def read_async(ctx: leaseq.TaskContext, **payload: Any) -> dict[str, Any]:
    """Read-only work on the event loop: cancelled at its next await when the lease is lost."""
    _fail_early(ctx, payload)
    await asyncio.sleep(payload.get("work", 0))
    return _result(ctx)


@app.task("chaos.idempotent", effect="idempotent", queue=QUEUE, lease_seconds=1.0, max_attempts=6)
def idempotent(ctx: leaseq.TaskContext, **payload: Any) -> dict[str, Any]:
    """A fenced, keyed downstream write: a retry is replayed, never repeated."""
    return _effectful(ctx, payload, keyed=True)


@app.task("chaos.side_effect", effect="side_effect", queue=QUEUE, lease_seconds=1.0, max_attempts=6)
def side_effect(ctx: leaseq.TaskContext, **payload: Any) -> dict[str, Any]:
    """A fenced downstream write the receiver cannot deduplicate."""
    return _effectful(ctx, payload, keyed=False)

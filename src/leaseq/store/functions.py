"""PostgreSQL: every named query as a ``SECURITY DEFINER`` function, and the roles that may call it.

On PostgreSQL the tables belong to ``leaseq_owner``, a role nobody logs in as,
and no worker, operator or viewer role holds a privilege on any of them.
What they can do is call functions, one per named query of
``sql/postgres/queries.sql``, whose body *is* that query (the same text, with
its parameters numbered), owned by ``leaseq_owner`` and run with its rights
under a fixed ``search_path``. So the lease guard a worker's completion
carries is not a clause the library chooses to send: it is the only
completion the worker's role can run. The functions are created or replaced
by every ``migrate`` (they are not versioned migrations: a fix to a query is
a fix to its function), and the library calls them on every connection,
whatever its role; there is one code path.

Who may call what is the query's ``-- callers:`` annotation (worker,
operator, viewer, verifier; none: only the owner). A verifier role (a
downstream service checking action tokens online) is granted
``verify_action_token`` and nothing else. On top of the query's own
conditions, each function holds its caller to what the caller's role was
created for (``leaseq roles create``, :mod:`leaseq.roles`):

* a worker id is usable only by the role that registered it (the worker
  row records ``session_user``): a worker names one of its own identities,
  never another role's;
* a role scoped to queues reaches only tasks and queues in its scope;
* a worker reads and writes evidence only for tasks one of its identities
  held, writes an effect only under a live lease it holds, and writes
  events only for a task its transaction has just changed (through a
  guarded function);
* an operator role acts under its own name: ``decided_by``, the audit's
  actor and an event's ``by`` are the login role's (or the deadline's, once
  a request's deadline has passed);
* a claim's lease is capped at the task's own ``lease_seconds`` (in the
  query itself, for every caller).

A trigger refuses any change to a task's lease columns (``status``,
``lease_owner``, ``lease_expires_at``, ``claim_generation``) made by any role
but ``leaseq_owner``: not even a superuser's ad-hoc ``UPDATE`` moves a lease.

The functions' signatures (parameter and column types) are PostgreSQL's own
inference for each query's text, recorded in ``sql/postgres/functions.json``
by ``python -m leaseq.store.functions --dsn <postgres DSN>``; a test fails
when the record is stale.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .queries import NamedQuery, load_named_queries

__all__ = ["GROUPS", "OWNER", "ROW_TYPE_COLUMNS", "Signature", "call_sql", "fingerprint", "function_name",
           "install_script", "load_signatures", "param_order", "returns_rows", "routed", "row_type", "wire_queries"]

#: The role that owns the schema's objects and the functions' rights; no one logs in as it.
OWNER = "leaseq_owner"
#: The group role of each kind of caller; ``leaseq roles create`` makes login roles members.
GROUPS = {"worker": "leaseq_worker", "operator": "leaseq_operator", "viewer": "leaseq_viewer",
          "verifier": "leaseq_verifier"}
_PARAM = re.compile(r"%\((\w+)\)s")
# integer parameters are declared bigint (what psycopg may send for any int) and cast back in the body
_WIDEN = {"integer": "bigint", "smallint": "bigint", "integer[]": "bigint[]", "smallint[]": "bigint[]"}


@dataclass(frozen=True)
class Signature:
    """A query's parameters and result columns as PostgreSQL infers them (``returns`` empty: no rows)."""

    params: tuple[tuple[str, str], ...]
    returns: tuple[tuple[str, str], ...]


def function_name(query: str) -> str:
    """The function a named query runs as."""
    return f"leaseq_q_{query}"


def routed(q: NamedQuery) -> bool:
    """Whether the query is sent as a call of its function (all but ``-- direct:`` ones)."""
    return q.direct is None


def param_order(sql: str) -> list[str]:
    """The query's parameters, in the order they first appear: the function's argument order."""
    out: list[str] = []
    for name in _PARAM.findall(sql):
        if name not in out:
            out.append(name)
    return out


def returns_rows(sig: Signature) -> bool:
    """Whether the function answers rows (a result of ``void`` columns counts as none)."""
    return bool(sig.returns) and not all(t == "void" for _, t in sig.returns)


@cache
def load_signatures() -> dict[str, Signature]:
    """The recorded signature of every routed query (``sql/postgres/functions.json``)."""
    raw = json.loads(resources.files("leaseq").joinpath("sql", "postgres", "functions.json").read_text())
    return {name: Signature(tuple(map(tuple, v["params"])), tuple(map(tuple, v["returns"])))
            for name, v in raw.items()}


def call_sql(q: NamedQuery, sig: Signature) -> str:
    """What the client sends for ``q``: its function called with the query's own parameters."""
    args = ", ".join(f"%({name})s::{_WIDEN.get(t, t)}" for name, t in sig.params)
    if returns_rows(sig):
        return f"SELECT * FROM {function_name(q.name)}({args})"
    return f"SELECT {function_name(q.name)}({args})"


@cache
def wire_queries() -> tuple[dict[str, str], frozenset[str]]:
    """What the PostgreSQL backend sends for each named query (routed ones as calls of their
    function, ``-- direct:`` ones as written), and the names of those answering no rows."""
    from .queries import compact

    sigs = load_signatures()
    sent, silent = {}, set()
    for name, q in load_named_queries("postgres").items():
        if not routed(q):
            sent[name] = compact(q.sql)
            continue
        if name not in sigs:
            raise RuntimeError(f"query {name!r} has no recorded signature in sql/postgres/functions.json: "
                               "run python -m leaseq.store.functions --dsn <postgres DSN>")
        sent[name] = call_sql(q, sigs[name])
        if not returns_rows(sigs[name]):
            silent.add(name)
    return sent, frozenset(silent)


def _numbered(sql: str, sig: Signature) -> str:
    index = {name: (i + 1, t) for i, (name, t) in enumerate(sig.params)}

    def sub(m: re.Match[str]) -> str:
        i, t = index[m.group(1)]
        return f"${i}::{t}" if t in _WIDEN else f"${i}"
    return _PARAM.sub(sub, sql)


def _qident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# The authority checks a function makes before its query runs, by caller kind
# (leaseq_caller(): admin, worker, operator, viewer). %(task)s and the like are
# the query's own parameters, numbered.
_SCOPE_QUEUE = """
IF _queues IS NOT NULL AND ({queue} IS NULL OR NOT {queue} = ANY(_queues)) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s may not reach queue %s', session_user, {queue});
END IF;"""
_SCOPE_TASK = """
IF _queues IS NOT NULL AND NOT EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.id = {task} AND t.queue = ANY(_queues)) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s may not reach task %s', session_user, {task});
END IF;"""
# A walk over queues (sweep_queues) given no list of queues walks every queue: a role scoped to
# queues walks its own (those it asked for among them), so it never stops at a queue it may not reach.
_WITHIN = """
IF _queues IS NOT NULL THEN
  {within} := CASE WHEN {within} IS NULL THEN _queues
                   ELSE ARRAY(SELECT unnest({within}) INTERSECT SELECT unnest(_queues)) END;
END IF;"""
# (_own: whether the worker row is the role's, read with the role's kind: see _checks)
_OWN_WORKER = """
IF _kind = 'worker' AND NOT _own THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('worker %s was not registered by role %s', {worker}, session_user);
END IF;"""
# (or made by this transaction: an intent's child, just inserted through a granted function)
_HELD_TASK = """
IF _kind = 'worker' AND NOT EXISTS (SELECT 1 FROM leaseq_events e JOIN leaseq_workers w ON w.id = e.worker_id
                                    WHERE e.task_id = {task} AND w.db_role = session_user)
        AND NOT EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.id = {task} AND t.xmin = pg_current_xact_id()::xid) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s never held task %s', session_user, {task});
END IF;"""
# A read (a row back, nothing written) counts only the rows its transaction inserted (no
# claim yet), not one it changed: a worker's expiry sweep changes strangers' tasks, and
# must not read them.
_HELD_TASK_READ = _HELD_TASK.replace("t.xmin = pg_current_xact_id()::xid",
                                     "t.xmin = pg_current_xact_id()::xid AND t.claim_generation = 0")
_LIVE_LEASE = """
IF _kind = 'worker' AND NOT EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.id = {task} AND t.status = 'running'
        AND t.lease_owner = {worker} AND t.claim_generation = {generation} AND t.lease_expires_at >= clock_timestamp()) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('worker %s holds no live lease of task %s', {worker}, {task});
END IF;"""
# evidence: only for a task this transaction has just written (through a guarded
# function), or whose live lease one of the role's identities holds
_EVIDENCE_ALLOWED = """(t.xmin = pg_current_xact_id()::xid OR (t.status = 'running'
        AND t.lease_expires_at >= clock_timestamp() AND EXISTS (SELECT 1 FROM leaseq_workers w
            WHERE w.id = t.lease_owner AND w.db_role = session_user)))"""
_FRESH_EVIDENCE = """
IF _kind = 'worker' AND EXISTS (SELECT 1 FROM jsonb_to_recordset({events}) AS e(task_id bigint)
        WHERE NOT EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.id = e.task_id AND """ + _EVIDENCE_ALLOWED + """)) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'a worker writes evidence only for a task its transaction changed or it holds';
END IF;"""
_FRESH_EVENT = """
IF _kind = 'worker' AND NOT EXISTS (SELECT 1 FROM leaseq_tasks t WHERE t.id = {task} AND """ + _EVIDENCE_ALLOWED + """) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'a worker writes evidence only for a task its transaction changed or it holds';
END IF;"""


def _written_here(message: str) -> str:
    """The check, for a worker, that each of ``{ids}`` is a task its own transaction wrote
    (made or ended), refused with ``message``."""
    return """
IF _kind = 'worker' AND EXISTS (SELECT 1 FROM unnest({ids}) AS x(id) WHERE NOT EXISTS (
        SELECT 1 FROM leaseq_tasks t WHERE t.id = x.id AND t.xmin = pg_current_xact_id()::xid)) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = '""" + message + """';
END IF;"""


# Statements a worker's enqueue or completion sends about tasks it never held:
# the tasks it just made (a child held until its upstreams end), and the tasks
# waiting for one it just ended. Sent about any other task, each would let a
# worker role park a stranger's task (hold_tasks, insert_dependencies) or
# release one early (settle_waiters).
_MADE_HERE = _written_here("a worker holds back only tasks its transaction made")
_WAITING_ON_ENDED_HERE = """
IF _kind = 'worker' AND EXISTS (SELECT 1 FROM jsonb_to_recordset({items}) AS c(task_id bigint) WHERE NOT EXISTS (
        SELECT 1 FROM leaseq_dependencies d JOIN leaseq_tasks u ON u.id = d.upstream
        WHERE d.waiter = c.task_id AND u.xmin = pg_current_xact_id()::xid)) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'a worker settles only tasks waiting for one its transaction ended';
END IF;"""
# An operator role acts under its own name: the name an action is recorded
# under (decided_by, the audit's actor, an event's "by") is the login role's,
# or the deadline's, which denies a request only once its deadline has passed.
_SELF = "leaseq:deadline"
_UNSCOPED = """
IF _queues IS NOT NULL THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s reaches only queues %s; {what} covers every queue',
                                                             session_user, array_to_string(_queues, ', '));
END IF;"""
_OWN_NAME = """
IF _kind = 'operator' AND {name} IS DISTINCT FROM session_user::text AND {name} IS DISTINCT FROM '""" + _SELF + """' THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s acts under its own name, not %s', session_user, {name});
END IF;"""
_DEADLINE_PASSED = """
IF _kind = 'operator' AND {name} = '""" + _SELF + """' AND NOT EXISTS (SELECT 1 FROM leaseq_approvals a
        WHERE a.task_id = {task} AND a.decision IS NULL AND a.deadline_at <= clock_timestamp()) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('the approval of task %s has not passed its deadline', {task});
END IF;"""
_OWN_NAMES = """
IF _kind = 'operator' AND EXISTS (SELECT 1 FROM jsonb_to_recordset({events}) AS e(detail jsonb)
        WHERE e.detail ? 'by' AND e.detail->>'by' IS DISTINCT FROM session_user::text
          AND e.detail->>'by' IS DISTINCT FROM '""" + _SELF + """') THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format('role %s acts under its own name', session_user);
END IF;"""

# The group roles that hold EXECUTE are the database's, shared by every leaseq schema in it; a
# role's authority is what the registry of *this* schema says (leaseq_caller), so a role made
# for one application's schema is no one in another's, and acts as nothing there.
_IN_SCHEMA = """
IF _kind IS NULL OR _kind NOT IN ({kinds}) THEN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
    'role %s has no leaseq role in schema %s that may call this (leaseq roles create against this schema makes one)',
    session_user, current_schema());
END IF;"""

# A parent waiting for children (ctx.wait_for) is woken by the transaction that ends its last
# child: a worker wakes only the parents of tasks its transaction changed.
_ENDED_HERE = _written_here("a worker wakes only the parents of tasks its transaction ended")

_ROW_RULES = {"hold_tasks": ("task_ids", _MADE_HERE), "insert_dependencies": ("waiters", _MADE_HERE),
              "settle_waiters": ("items", _WAITING_ON_ENDED_HERE), "wake_parents": ("task_ids", _ENDED_HERE)}


def _checks(q: NamedQuery, sig: Signature) -> str:
    if not q.callers:
        return ""
    pos = {name: f"${i + 1}" for i, (name, _) in enumerate(sig.params)}
    out = []
    if "queue" in pos:
        out.append(_SCOPE_QUEUE.format(queue=pos["queue"]))
    if "task_id" in pos:
        out.append(_SCOPE_TASK.format(task=pos["task_id"]))
    if "within" in pos:
        out.append(_WITHIN.format(within=pos["within"]))
    if "worker" in q.callers:
        if "worker_id" in pos:
            out.append(_OWN_WORKER.format(worker=pos["worker_id"]))
        if "lock_lease" in q.guard_reason and {"task_id", "generation", "worker_id"} <= pos.keys():
            out.append(_LIVE_LEASE.format(task=pos["task_id"], worker=pos["worker_id"],
                                          generation=pos["generation"]))
        elif "task_id" in pos and "worker_id" not in pos:
            held = _HELD_TASK if _WRITES.search(_body_only(q.sql)) else _HELD_TASK_READ
            out.append(held.format(task=pos["task_id"]))
        if "parent_task_id" in pos:
            out.append(_HELD_TASK.format(task=pos["parent_task_id"]))
        if q.name == "insert_event":
            out.append(_FRESH_EVENT.format(task=pos["task_id"]))
        if "events" in pos:
            out.append(_FRESH_EVIDENCE.format(events=pos["events"]))
        if q.name in _ROW_RULES:
            param, rule = _ROW_RULES[q.name]
            out.append(rule.format(ids=pos[param], items=pos[param]))
    if q.name in _UNSCOPED_ONLY:
        out.append(_UNSCOPED.format(what=q.name))
    if "operator" in q.callers:
        for name in ("actor", "decided_by"):
            if name in pos:
                out.append(_OWN_NAME.format(name=pos[name]))
        if "decided_by" in pos and "task_id" in pos:
            out.append(_DEADLINE_PASSED.format(name=pos["decided_by"], task=pos["task_id"]))
        if "detail" in pos and q.name == "insert_event":
            out.append(_OWN_NAMES.format(events=f"jsonb_build_array(jsonb_build_object('detail', {pos['detail']}))"))
        if "events" in pos:
            out.append(_OWN_NAMES.format(events=pos["events"]))
    # The owner (the role that migrates, a superuser: the library's default) skips every check:
    # each IF with a subquery runs the executor (about 40 us), where a simple test does not.
    # Anyone else acts here only as what this schema's registry made it (_IN_SCHEMA): the
    # registry's row is read here, as leaseq_caller() reads it for a non-owner, not through a
    # call of it (a nested definer function: its own settings, role test and executor run,
    # about 60 us a call), and in the same statement whether the worker named is the role's.
    own = (f", EXISTS (SELECT 1 FROM leaseq_workers w WHERE w.id = {pos['worker_id']} AND w.db_role = session_user)"
           if "worker" in q.callers and "worker_id" in pos else ", NULL::boolean")
    return ("IF NOT pg_has_role(session_user, 'leaseq_owner', 'MEMBER') THEN\n"
            f"SELECT r.kind, r.queues{own} INTO _kind, _queues, _own FROM leaseq_db_roles r\n"
            "WHERE r.role = session_user AND r.revoked_at IS NULL;"
            + _IN_SCHEMA.format(kinds=", ".join(_literal(k) for k in sorted(q.callers))) + "".join(out) + "\nEND IF;")


# Reads across every queue whose rows name none (the audit log, the workers and the kinds
# they serve, the kinds of every task, limits), limits (keys shared by every queue), and
# retention (which reaches every queue's ended tasks): a scoped role is refused them, as the
# service refuses a scoped token what spans every queue.
_UNSCOPED_ONLY = frozenset({"audit_list", "prune_finished_ids", "scrub_finished_ids", "prune_evidence", "prune_audit",
                            "prune_flow_keys", "prune_spend", "prune_fairness",
                            "list_workers", "dashboard_workers", "served_kinds", "dashboard_kinds",
                            "dashboard_worker_last_events",
                            "list_limits", "count_limit", "set_limit", "delete_limit"})


_WRITES = re.compile(r"(?<!FOR )(?<!KEY )\b(UPDATE|INSERT|DELETE)\b", re.IGNORECASE)  # not a row lock


def _body_only(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def _queue_column(q: NamedQuery, sig: Signature) -> str | None:
    """The column by which a scoped caller's rows of ``q``, a read across every queue, are cut
    to the caller's queues (None: not cut: the query names its queue or task, whose scope is
    checked before it runs, or locks rows, or its rows name no queue)."""
    params = {name for name, _ in sig.params}
    body = _body_only(q.sql)
    if not q.callers or params & {"queue", "task_id"} or _WRITES.search(body) or "FOR UPDATE" in body.upper():
        return None
    if q.name not in ("list_queues", "known_queues"):
        return "queue" if "queue" in dict(sig.returns) else None
    return "name"


# A function whose rows are this wide (a task's row: the claims, get_task, ...) answers rows of
# a composite type of its own (row_type), made beside it at install, not a TABLE(...) result:
# PostgreSQL builds a TABLE result's row description from the function's argument arrays at
# every call (a catalogue lookup and a name per column) and registers it as a record type;
# a named type's description is built once per connection, in the type cache. Narrow
# results keep TABLE (a type each would lengthen every migrate for a few microseconds).
ROW_TYPE_COLUMNS = 16


def row_type(query: str, sig: Signature) -> str | None:
    """The composite type the rows of ``query``'s function are (None: a ``TABLE`` result)."""
    return f"leaseq_r_{query}" if returns_rows(sig) and len(sig.returns) >= ROW_TYPE_COLUMNS else None


def _columns(sig: Signature) -> str:
    return ", ".join(f"{_qident(c)} {t}" for c, t in sig.returns)


def _function(q: NamedQuery, sig: Signature) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` of one query (``@@schema@@``: the schema, filled in at install)."""
    args = ", ".join(_WIDEN.get(t, t) for _, t in sig.params)
    body = _numbered(q.sql, sig).rstrip().rstrip(";")
    if returns_rows(sig):
        rows_of = row_type(q.name, sig)
        result = f"SETOF @@schema@@.{rows_of}" if rows_of else f"TABLE({_columns(sig)})"
        column = _queue_column(q, sig)
        run = (f"RETURN QUERY {body};" if column is None else
               f"RETURN QUERY SELECT * FROM ({_body_only(body).rstrip().rstrip(';')}) AS r\n"
               f"WHERE _queues IS NULL OR r.{column} = ANY(_queues);")
        if q.custom_above is not None:
            run = _sized(run, q, sig)
    elif sig.returns:  # a SELECT of void functions (pg_notify): run for its effect
        result, run = "void", f"PERFORM * FROM ({body}) AS s;"
    else:
        result, run = "void", f"{body};"
    # The plan mode travels with the function, not the session: a session setting would
    # not reach the server session a transaction-mode pooler gives the next transaction.
    # A hot statement is never compiled (JIT): a generic plan's estimates (a claim's
    # fair-share reads, sized by parameters it cannot see) can pass jit_above_cost, and
    # the compilation, seconds, would be paid at every call.
    settings = " SET plan_cache_mode = force_generic_plan SET jit = off" if q.generic_plan else ""
    code = f"#variable_conflict use_column\nDECLARE _kind text; _queues text[]; _own boolean;\nBEGIN\n{_checks(q, sig)}\n{run}\nEND"
    return (f"CREATE OR REPLACE FUNCTION @@schema@@.{function_name(q.name)}({args}) RETURNS {result} "
            f"LANGUAGE plpgsql SECURITY DEFINER SET search_path = @@schema@@, pg_temp{settings} AS {_dollar(code)}")


def _sized(run: str, q: NamedQuery, sig: Signature) -> str:
    """``run`` (a ``RETURN QUERY``) for a ``plan: generic up to <n> <param>`` query: the
    statement's cached generic plan while the array names at most n elements, else the
    statement as dynamic SQL (``EXECUTE ... USING``), planned for its values at that call: a
    one-shot plan, whose parameters the planner sees as values (a long id list counted, and
    probed by hash), whatever the function's plan_cache_mode."""
    assert q.custom_above is not None and run.startswith("RETURN QUERY ")
    param, n = q.custom_above
    names = [name for name, _ in sig.params]
    if param not in names or not sig.params[names.index(param)][1].endswith("[]"):
        raise RuntimeError(f"query {q.name!r}: 'plan: generic up to' names {param!r}, not an array parameter")
    statement = _body_only(run.removeprefix("RETURN QUERY ")).strip().rstrip(";")
    tag = "$sized$"
    assert tag not in statement
    using = ", ".join(f"${i + 1}" for i in range(len(sig.params)))
    return (f"IF cardinality(${names.index(param) + 1}) > {n} THEN\n"
            f"RETURN QUERY EXECUTE {tag}{statement}{tag} USING {using};\nELSE\n{run}\nEND IF;")


def _dollar(code: str) -> str:
    tag = "$fn$"
    assert tag not in code
    return f"{tag}\n{code}\n{tag}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# The caller's kind and queue scope: admin (the owner, or a member of it: the
# role that migrates, a superuser), else what `leaseq roles create` recorded in
# this schema, else none (a role made for another schema, or made a member of a
# group by hand, has no authority here). PL/pgSQL, not SQL:
# a SQL function that cannot be inlined is planned again at every call (about
# 130 us each, on every statement a role sends).
_CALLER = """
CREATE OR REPLACE FUNCTION @@schema@@.leaseq_caller(OUT kind text, OUT queues text[]) STABLE
LANGUAGE plpgsql SECURITY DEFINER SET search_path = @@schema@@, pg_temp AS $c$
BEGIN
  IF pg_has_role(session_user, 'leaseq_owner', 'MEMBER') THEN
    kind := 'admin';
    RETURN;
  END IF;
  SELECT r.kind, r.queues INTO kind, queues FROM leaseq_db_roles r
  WHERE r.role = session_user AND r.revoked_at IS NULL;
  kind := coalesce(kind, 'none');
END
$c$"""

_LEASE_TRIGGER = """
CREATE OR REPLACE FUNCTION @@schema@@.leaseq_refuse_lease_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = @@schema@@, pg_temp AS $t$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
    'role %s may not change the lease of task %s: leases change only through leaseq''s functions', current_user, OLD.id);
END
$t$"""
# Any UPDATE that names a lease column, by any role but the owner, is refused, whether or not it
# changes the value. A trigger's WHEN is read back from its stored tree and compiled at the first
# row of every UPDATE statement, and judged at every row: the claim, renewal and completion pay
# for it each time. So the WHEN is one comparison, and the column list (a test of the statement's
# SET list, not of the row) keeps it off every update that names no lease column. Comparing the
# four columns OLD with NEW, as this trigger once did, made that tree several times larger:
# about 20 us of parsing and compiling at every claim, renewal and completion (perf), for no
# guard more (a write of a lease column that changes nothing is no lease anyone needs to write
# by hand).
_LEASE_TRIGGER_ON = """
CREATE TRIGGER leaseq_tasks_lease_guard
BEFORE UPDATE OF status, lease_owner, lease_expires_at, claim_generation ON @@schema@@.leaseq_tasks FOR EACH ROW
WHEN (current_user <> 'leaseq_owner')
EXECUTE FUNCTION @@schema@@.leaseq_refuse_lease_write()"""


@cache
def fingerprint() -> str:
    """A digest of :func:`install_script`: recorded by each install, so a migrate that finds
    this version's functions in place has nothing to do."""
    import hashlib

    return hashlib.sha256(_install_body().encode()).hexdigest()[:32]


def install_script(schema: str) -> str:
    """:func:`_install_body` for ``schema``, recording its :func:`fingerprint`."""
    body = _install_body() + f"\nCOMMENT ON FUNCTION @@schema@@.leaseq_caller() IS {_literal(fingerprint())};"
    return body.replace("@@schema_literal@@", _literal(schema)).replace("@@schema@@", _qident(schema))


@cache
def _install_body() -> str:
    """The script every ``migrate`` runs after the versioned migrations (``@@schema@@``: the
    schema): the roles, the ownership of every leaseq object, then every function dropped and
    made anew from the named queries, with its grants. Plain statements, sent as one script:
    the same work as one DO block building each statement costs about four times as much."""
    queries = load_named_queries("postgres")
    sigs = load_signatures()
    statements = []
    for name, q in queries.items():
        if not routed(q):
            continue
        sig = sigs[name]
        args = ", ".join(_WIDEN.get(t, t) for _, t in sig.params)
        proc = f"@@schema@@.{function_name(name)}({args})"
        rows_of = row_type(name, sig)
        if rows_of:
            statements.append(f"CREATE TYPE @@schema@@.{rows_of} AS ({_columns(sig)});\n"
                              f"ALTER TYPE @@schema@@.{rows_of} OWNER TO {OWNER};")
        statements.append(f"{_function(q, sig)};\nALTER FUNCTION {proc} OWNER TO {OWNER};\n"
                          f"REVOKE ALL ON FUNCTION {proc} FROM PUBLIC;"
                          + "".join(f"\nGRANT EXECUTE ON FUNCTION {proc} TO {GROUPS[r]};" for r in sorted(q.callers)))
    roles = "\n".join(
        f"IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(r)}) THEN "
        f"CREATE ROLE {r} NOLOGIN; END IF;" for r in (OWNER, *GROUPS.values()))
    groups = ", ".join(GROUPS.values())
    # a verifier (a downstream service) calls verify_action_token and nothing else: not even
    # the migrations table the library reads on connecting is granted to it
    readers = ", ".join(g for kind, g in GROUPS.items() if kind != "verifier")
    # The query functions are dropped, not replaced: one whose result changed could not be,
    # and one whose query is gone must go; so are their row types (row_type), made anew. The migrate's transaction hides the gap.
    return f"""DO $install$
DECLARE s text := @@schema_literal@@; obj record;
BEGIN
{roles}
IF NOT pg_has_role(current_user, '{OWNER}', 'MEMBER') THEN EXECUTE format('GRANT {OWNER} TO %I', current_user); END IF;
EXECUTE format('GRANT USAGE ON SCHEMA %I TO {OWNER}, {groups}', s);
FOR obj IN SELECT c.relname, c.relkind FROM pg_class c WHERE c.relnamespace = s::regnamespace
           AND c.relname LIKE 'leaseq%' AND c.relkind IN ('r', 'v', 'm', 'p') LOOP
  EXECUTE format('ALTER TABLE %I.%I OWNER TO {OWNER}', s, obj.relname);
  EXECUTE format('REVOKE ALL ON %I.%I FROM PUBLIC', s, obj.relname);
END LOOP;
EXECUTE format('GRANT SELECT ON %I.leaseq_migrations TO {readers}', s);
FOR obj IN SELECT p.oid::regprocedure AS proc, p.proname LIKE 'leaseq\\_q\\_%' AS query
           FROM pg_proc p WHERE p.pronamespace = s::regnamespace AND p.proname LIKE 'leaseq%' LOOP
  IF obj.query THEN
    EXECUTE format('DROP FUNCTION %s', obj.proc);
  ELSE
    EXECUTE format('ALTER FUNCTION %s OWNER TO {OWNER}', obj.proc);
  END IF;
END LOOP;
FOR obj IN SELECT t.oid::regtype AS typ FROM pg_type t WHERE t.typnamespace = s::regnamespace
           AND t.typname LIKE 'leaseq\\_r\\_%' AND t.typtype = 'c' LOOP
  EXECUTE format('DROP TYPE %s', obj.typ);
END LOOP;
END
$install$;
{_CALLER.strip()};
ALTER FUNCTION @@schema@@.leaseq_caller() OWNER TO {OWNER};
REVOKE ALL ON FUNCTION @@schema@@.leaseq_caller() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @@schema@@.leaseq_caller() TO {groups};
{_LEASE_TRIGGER.strip()};
ALTER FUNCTION @@schema@@.leaseq_refuse_lease_write() OWNER TO {OWNER};
DROP TRIGGER IF EXISTS leaseq_tasks_lease_guard ON @@schema@@.leaseq_tasks;
{_LEASE_TRIGGER_ON.strip()};
{chr(10).join(statements)}"""


# -- the record of signatures ------------------------------------------------------------------

def infer_signatures(dsn: str) -> dict[str, Signature]:
    """Each routed query's signature, as PostgreSQL at ``dsn`` infers it, in a scratch schema
    holding the versioned migrations' tables (dropped afterwards)."""
    import psycopg

    from .base import load_migrations

    schema = f"leaseq_infer_{uuid.uuid4().hex[:8]}"
    out: dict[str, Signature] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        try:
            conn.execute(f"SET search_path = {schema}")
            for mig in load_migrations("postgres"):
                conn.execute(mig.sql)
            for name, q in load_named_queries("postgres").items():
                if not routed(q):
                    continue
                params = param_order(q.sql)
                text = _PARAM.sub(lambda m: f"${params.index(m.group(1)) + 1}", q.sql)
                conn.execute(f"PREPARE leaseq_infer AS {text}")
                types = conn.execute("SELECT parameter_types::text[] FROM pg_prepared_statements "
                                     "WHERE name = 'leaseq_infer'").fetchone()
                desc = conn.pgconn.describe_prepared(b"leaseq_infer")
                cols = []
                for i in range(desc.nfields):
                    row = conn.execute("SELECT format_type(%s, NULL)", (desc.ftype(i),)).fetchone()
                    assert row is not None
                    cols.append(((desc.fname(i) or b"").decode(), row[0]))
                conn.execute("DEALLOCATE leaseq_infer")
                assert types is not None
                out[name] = Signature(tuple(zip(params, types[0])), tuple(cols))
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return out


def dump_signatures(sigs: dict[str, Signature]) -> str:
    """The text of ``sql/postgres/functions.json`` for ``sigs``."""
    doc: dict[str, Any] = {name: {"params": [list(p) for p in s.params], "returns": [list(c) for c in s.returns]}
                           for name, s in sorted(sigs.items())}
    return json.dumps(doc, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m leaseq.store.functions --dsn DSN [--check]``: write (or check) the record."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = dump_signatures(infer_signatures(args.dsn))
    path = Path(__file__).resolve().parent.parent / "sql" / "postgres" / "functions.json"
    if args.check:
        if path.read_text() != text:
            print(f"{path} is stale: run python -m leaseq.store.functions --dsn DSN", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path} ({len(json.loads(text))} functions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

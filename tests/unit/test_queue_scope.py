"""Every row lock with SKIP LOCKED of the worker path is scoped by queue (no database).

A server that distributes leaseq's tables by queue and runs ``SKIP LOCKED``
only in single-shard statements (Citus) can run a worker's statement only if
each of its ``FOR UPDATE … SKIP LOCKED`` reads names the queue. The worker
path is every PostgreSQL statement a worker role may call (``-- callers:``
naming worker). Those reads are found in the expanded text the server runs:
the one ``SELECT`` each lock clause belongs to (the one at its own depth of
parentheses), scoped where its text says ``queue = %(queue)s``.

Every one is scoped (schema 41): the claims' candidates, their routing check
(claim_head's ``due`` and its probe of due sleepers), and the sweeps
(lock_expired, lock_sleepers, lock_overdue, prune_action_tokens), which take
a queue; the sweep of every queue asks ``sweep_queues`` (no lock) which
queues have work. A statement that starts reading across queues with SKIP
LOCKED fails this test (docs/how-to/poolers.md says none does).
"""

from __future__ import annotations

import re

import pytest

from leaseq.store.queries import compact, load_named_queries

#: A read's restriction to the statement's queue.
SCOPED = re.compile(r"\bqueue\s*=\s*%\(queue\)s")
_LOCK = re.compile(r"\bFOR\s+(?:UPDATE|SHARE)(?:\s+OF\s+\w+)?\s+SKIP\s+LOCKED\b", re.IGNORECASE)
_SELECT = re.compile(r"\bSELECT\b", re.IGNORECASE)

def enclosing_select(sql: str, lock_at: int) -> str:
    """The text of the ``SELECT`` that the lock clause at ``lock_at`` belongs to: the last one
    before it at the clause's own depth of parentheses, up to the clause."""
    depth = 0
    i = lock_at
    while i > 0:
        i -= 1
        ch = sql[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                break  # the clause's subquery opens here: its SELECT was passed over
            depth -= 1
        elif depth == 0 and _SELECT.match(sql, i) and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            return sql[i:lock_at]
    raise AssertionError(f"no SELECT before the lock clause at {lock_at}: {sql[max(0, lock_at - 200):lock_at]!r}")


def skip_locked_reads(sql: str) -> list[str]:
    """Each ``… SKIP LOCKED`` read of ``sql``: its SELECT's text."""
    return [enclosing_select(sql, m.start()) for m in _LOCK.finditer(sql)]


def worker_statements() -> dict[str, str]:
    """Every PostgreSQL statement a worker role may call, as the server runs it."""
    return {name: compact(q.sql) for name, q in load_named_queries("postgres").items() if "worker" in q.callers}


def test_the_reader_finds_each_lock_clauses_own_select() -> None:
    sql = ("WITH a AS (SELECT id FROM t WHERE x = (SELECT 1 FROM u) AND queue = %(queue)s "
           "FOR UPDATE SKIP LOCKED), b AS (SELECT id FROM t WHERE id IN (SELECT id FROM t "
           "WHERE y ORDER BY z LIMIT 1 FOR UPDATE SKIP LOCKED)) SELECT * FROM a")
    first, second = skip_locked_reads(sql)
    assert first.startswith("SELECT id FROM t WHERE x = (SELECT 1 FROM u) AND queue")
    assert SCOPED.search(first)
    assert second.startswith("SELECT id FROM t WHERE y") and not SCOPED.search(second)


def test_every_skip_locked_read_of_the_worker_path_is_scoped_by_queue() -> None:
    statements = worker_statements()
    assert {"claim_batch", "claim_plain", "complete_batch", "renew_leases", "lock_expired", "lock_sleepers",
            "lock_overdue", "prune_action_tokens"} <= statements.keys()
    locking = {name for name, sql in statements.items() if skip_locked_reads(sql)}
    # the statements that lock with SKIP LOCKED, every one found (the reader misses none)
    assert {"claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain", "lock_expired",
            "lock_sleepers", "lock_overdue", "prune_action_tokens"} <= locking
    across = {name: [read[:300] for read in skip_locked_reads(sql) if not SCOPED.search(read)]
              for name, sql in statements.items()}
    assert not {name: reads for name, reads in across.items() if reads}, (
        "SKIP LOCKED reads across queues (docs/how-to/poolers.md says there are none)")


def test_every_claims_routing_check_reads_its_own_queue_only() -> None:
    """claim_head's routing check: the expired lease it locks (due) and the due sleeper it
    probes (no lock: not seen by the SKIP LOCKED reader) are both the claiming queue's."""
    statements = worker_statements()
    for name in ("claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"):
        sql = statements[name]
        due = [r for r in skip_locked_reads(sql) if "status = 'running'" in r]
        assert due and all(SCOPED.search(r) for r in due), f"{name}: its due read is not scoped: {due}"
        sleepers = re.findall(r"SELECT 1 FROM leaseq_tasks s\s+WHERE s\.status = 'waiting'.*?now\(\)", sql, re.DOTALL)
        assert sleepers, f"{name}: no probe of due sleepers found"
        assert all(re.search(r"\bs\.queue\s*=\s*%\(queue\)s", p) for p in sleepers), \
            f"{name}: its probe of due sleepers reads every queue: {sleepers}"


def test_every_claim_takes_its_candidates_from_its_own_queue_only() -> None:
    statements = worker_statements()
    for name in ("claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"):
        reads = skip_locked_reads(statements[name])
        candidates = [r for r in reads if "status = 'queued'" in r or "t.status = 'queued'" in r]
        assert candidates, f"{name}: no claim of queued tasks found among its SKIP LOCKED reads"
        for read in candidates:
            assert SCOPED.search(read), f"{name}: a claim of queued tasks not scoped by queue: {read[:300]}"


#: The statements that take a queue for the rule's sake (the sweeps), and their queue parameter's text.
SWEEPS = ("lock_expired", "lock_sleepers", "lock_overdue", "prune_action_tokens")
PARAM = {"postgres": "%(queue)s", "sqlite": ":queue"}


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_one_rule_in_both_dialects_the_sweeps_and_the_routing_check_name_their_queue(dialect: str) -> None:
    """SQLite locks no row (a transaction holds the write lock), but its statements are the
    same: each sweep reads one queue, and so does the claim's check for work to route."""
    queries = {name: compact(q.sql) for name, q in load_named_queries(dialect).items()}
    scoped = re.compile(r"\bqueue\s*=\s*" + re.escape(PARAM[dialect]))
    for name in SWEEPS:
        assert scoped.search(queries[name]), f"{dialect} {name} reads every queue"
    for name in ("claim_batch", "claim_fair"):
        running = re.findall(r"\bstatus = 'running' AND.*?(?:now\(\)|86400\.0)", queries[name], re.DOTALL)
        waiting = re.findall(r"\bstatus = 'waiting' AND.*?(?:now\(\)|86400\.0)", queries[name], re.DOTALL)
        assert running and waiting, f"{dialect} {name}: no routing check found"
        for probe in running + waiting:
            assert scoped.search(probe), \
                f"{dialect} {name}: a routing check reads every queue: {probe}"

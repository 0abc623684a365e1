"""Which of the worker's row locks with SKIP LOCKED are scoped by queue (no database).

A server that distributes leaseq's tables by queue and runs ``SKIP LOCKED``
only in single-shard statements (Citus) can run a worker's statement only if
each of its ``FOR UPDATE … SKIP LOCKED`` reads names the queue. The worker
path is every PostgreSQL statement a worker role may call (``-- callers:``
naming worker). Those reads are found in the expanded text the server runs:
the one ``SELECT`` each lock clause belongs to (the one at its own depth of
parentheses), scoped where its text says ``queue = %(queue)s``.

The claims' candidates are scoped; the reads across queues are pinned here,
with why each reads every queue, so that docs/how-to/poolers.md's list of
them stays true: a statement that starts or stops reading across queues
fails this test until the list (and the page) says so.
"""

from __future__ import annotations

import re

from leaseq.store.queries import compact, load_named_queries

#: A read's restriction to the statement's queue.
SCOPED = re.compile(r"\bqueue\s*=\s*%\(queue\)s")
_LOCK = re.compile(r"\bFOR\s+(?:UPDATE|SHARE)(?:\s+OF\s+\w+)?\s+SKIP\s+LOCKED\b", re.IGNORECASE)
_SELECT = re.compile(r"\bSELECT\b", re.IGNORECASE)

#: The worker path's SKIP LOCKED reads that read every queue: {statement: why}. The claims'
#: read is their ``due`` step (claim_head): whether an expired lease waits for routing
#: anywhere, which the claim routes before it claims.
ACROSS_QUEUES = {
    "claim_batch": "its routing check (claim_head's due): an expired lease of any queue",
    "claim_fair": "its routing check (claim_head's due): an expired lease of any queue",
    "claim_fair_one": "its routing check (claim_head's due): an expired lease of any queue",
    "claim_fair_one_plain": "its routing check (claim_head's due): an expired lease of any queue",
    "claim_plain": "its routing check (claim_head's due): an expired lease of any queue",
    "lock_expired": "the expiry sweep: the expired leases of every queue",
    "lock_overdue": "the deadline sweep: the overdue tasks of every queue",
    "lock_sleepers": "the wake sweep: the waiting tasks of every queue whose wake time came",
    "prune_action_tokens": "the action tokens' sweep (a table with no queue column)",
}


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


def test_the_worker_path_reads_across_queues_only_where_listed() -> None:
    statements = worker_statements()
    assert {"claim_batch", "claim_plain", "complete_batch", "renew_leases"} <= statements.keys()
    across = {name for name, sql in statements.items()
              if any(not SCOPED.search(read) for read in skip_locked_reads(sql))}
    assert across == ACROSS_QUEUES.keys(), (
        f"reading every queue now: {sorted(across - ACROSS_QUEUES.keys())}; "
        f"scoped by queue now: {sorted(ACROSS_QUEUES.keys() - across)} "
        "(update ACROSS_QUEUES and docs/how-to/poolers.md)")


def test_every_claim_takes_its_candidates_from_its_own_queue_only() -> None:
    statements = worker_statements()
    for name in ("claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"):
        reads = skip_locked_reads(statements[name])
        candidates = [r for r in reads if "status = 'queued'" in r or "t.status = 'queued'" in r]
        assert candidates, f"{name}: no claim of queued tasks found among its SKIP LOCKED reads"
        for read in candidates:
            assert SCOPED.search(read), f"{name}: a claim of queued tasks not scoped by queue: {read[:300]}"

"""PostgreSQL's definer functions: the recorded signatures are current, and a function's body is its query."""

from __future__ import annotations

import leaseq
from leaseq.store.functions import function_name, infer_signatures, load_signatures, routed, wire_queries
from leaseq.store.queries import load_named_queries
from pg_modes import own_connection


def _base(dsn: str) -> str:
    return dsn.split("?", 1)[0]


def test_the_recorded_signatures_are_what_postgresql_infers_for_the_queries(pg_schema_dsn) -> None:
    """sql/postgres/functions.json is stale after a query changed: run
    python -m leaseq.store.functions --dsn <postgres DSN> to write it again."""
    assert infer_signatures(_base(pg_schema_dsn)) == load_signatures()


def test_every_query_but_the_migration_bookkeeping_runs_as_a_definer_function_of_the_owner(pg_schema_dsn) -> None:
    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
        with own_connection(pg_schema_dsn) as conn:
            found = {name: (definer, owner, config) for name, definer, owner, config in conn.execute(
                "SELECT p.proname, p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig FROM pg_proc p "
                "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'leaseq_q_%'")}
            body = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'leaseq_q_complete_batch' "
                                "AND pronamespace = current_schema()::regnamespace").fetchone()[0]
    queries = load_named_queries("postgres")
    assert set(found) == {function_name(n) for n, q in queries.items() if routed(q)}
    assert all(definer and owner == "leaseq_owner" for definer, owner, _ in found.values())
    assert all(any(c.startswith("search_path=") for c in config) for _, _, config in found.values())
    # the lease guard the worker's completion carries is in the function itself
    assert "t.lease_expires_at >= clock_timestamp()" in body and "t.claim_generation" in body
    assert wire_queries()[0]["complete_batch"].startswith("SELECT * FROM leaseq_q_complete_batch(")


def test_a_connection_says_what_the_database_lets_it_do(pg_schema_dsn, tmp_path) -> None:
    with leaseq.connect(pg_schema_dsn) as q:
        q.migrate()
        assert q.database_authority() == "admin"  # the superuser of the test server
    with leaseq.connect(f"sqlite:///{tmp_path / 'q.db'}") as q:
        q.migrate()
        assert q.database_authority() is None

"""The named queries, read as text (no database).

Both dialects must define the same names with the same parameters, and every
write made on the strength of a lease must carry the lease guard documented
at the top of each queries.sql. Deleting a guard line fails this file.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from leaseq.store.base import load_queries

DIALECTS = ("postgres", "sqlite")

#: The lease guard, line for line, per dialect (as each file's header documents it).
GUARD = {
    "postgres": [
        "AND t.status = 'running'",
        "AND t.lease_owner = %(worker_id)s",
        "AND t.claim_generation = %(generation)s",
        "AND t.lease_expires_at >= now()",
    ],
    "sqlite": [
        "AND t.status = 'running'",
        "AND t.lease_owner = :worker_id",
        "AND t.claim_generation = :generation",
        "AND t.lease_expires_at >= (julianday('now') - 2440587.5) * 86400.0",
    ],
}
#: renew_leases checks many (task, generation) pairs at once, joined as ``c``.
RENEW_GENERATION = "AND t.claim_generation = c.generation"

#: Queries that write (or lock for a write) on the strength of a lease.
LEASE_WRITES = ("renew_leases", "complete_batch", "lock_lease", "complete_task", "fail_task", "expire_lease")
#: The only queries allowed to set a deadline that is not NULL.
DEADLINE_WRITERS = {"claim_batch", "renew_leases", "expire_lease", "end_worker_leases"}

_PARAM = {"postgres": re.compile(r"%\((\w+)\)s"), "sqlite": re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")}


def _text(dialect: str) -> str:
    return resources.files("leaseq").joinpath("sql", dialect, "queries.sql").read_text()


def _code(sql: str) -> str:
    """``sql`` without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _lines(sql: str) -> list[str]:
    """The statement's lines, stripped, with the first WHERE condition written as an AND."""
    out = []
    for line in _code(sql).splitlines():
        line = " ".join(line.split()).rstrip(";").rstrip()
        if line:
            out.append(re.sub(r"^WHERE ", "AND ", line))
    return out


def guard_lines(dialect: str, name: str) -> list[str]:
    """The guard lines query ``name`` must contain."""
    lines = list(GUARD[dialect])
    if name in ("renew_leases", "complete_batch"):
        lines[2] = RENEW_GENERATION
    return lines


def missing_guards(dialect: str, name: str, sql: str) -> list[str]:
    """Guard lines absent from ``sql`` (empty when the query is guarded)."""
    present = set(_lines(sql))
    return [g for g in guard_lines(dialect, name) if g not in present]


def params(dialect: str, sql: str) -> set[str]:
    """The named parameters ``sql`` uses."""
    return set(_PARAM[dialect].findall(_code(sql)))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_header_documents_the_guard(dialect: str) -> None:
    header = re.split(r"^-- name:", _text(dialect), maxsplit=1, flags=re.MULTILINE)[0]
    documented = [" ".join(line.lstrip("-").split()) for line in header.splitlines()
                  if re.match(r"^--\s+AND t\.", line)]
    assert documented == GUARD[dialect]


def test_both_dialects_define_the_same_queries() -> None:
    pg, sl = load_queries("postgres"), load_queries("sqlite")
    assert set(pg) - set(sl) == set(), "missing from sqlite/queries.sql"
    assert set(sl) - set(pg) == set(), "missing from postgres/queries.sql"


@pytest.mark.parametrize("name", sorted(load_queries("postgres")))
def test_each_query_takes_the_same_parameters_in_both_dialects(name: str) -> None:
    sl = load_queries("sqlite")
    if name not in sl:
        pytest.fail(f"{name} is missing from sqlite/queries.sql")
    assert params("postgres", load_queries("postgres")[name]) == params("sqlite", sl[name])


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", LEASE_WRITES)
def test_lease_writes_carry_the_guard(dialect: str, name: str) -> None:
    assert missing_guards(dialect, name, load_queries(dialect)[name]) == []


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", LEASE_WRITES)
def test_the_guard_check_notices_a_deleted_line(dialect: str, name: str) -> None:
    """The check above is not vacuous: removing any one guard line is caught."""
    sql = load_queries(dialect)[name]
    for guard in guard_lines(dialect, name):
        kept = [line for line in sql.splitlines() if " ".join(line.split()).rstrip(";") != guard]
        assert len(kept) == len(sql.splitlines()) - 1, f"{guard!r} is not a line of its own in {name}"
        assert missing_guards(dialect, name, "\n".join(kept)) == [guard]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_only_claims_renewals_and_releases_set_a_deadline(dialect: str) -> None:
    """Nothing else can hand a worker a later deadline (guards compare with >= or <)."""
    setters = {name for name, sql in load_queries(dialect).items()
               if re.search(r"\blease_expires_at\s*=\s*(?!\s)(?!NULL\b)", _code(sql))}
    assert setters == DEADLINE_WRITERS


@pytest.mark.parametrize("dialect", DIALECTS)
def test_revocation_only_moves_deadlines_into_the_past(dialect: str) -> None:
    """end_worker_leases sets a deadline, but only one gone before the lease began."""
    sql = _code(load_queries(dialect)["end_worker_leases"])
    [value] = re.findall(r"\blease_expires_at\s*=\s*([^,]+),", sql)
    assert re.fullmatch(r"(t\.)?claimed_at - (interval '1 millisecond'|0\.001)", " ".join(value.split())), value


@pytest.mark.parametrize("dialect", DIALECTS)
def test_only_a_claim_advances_the_generation(dialect: str) -> None:
    advancing = {name for name, sql in load_queries(dialect).items()
                 if re.search(r"claim_generation\s*=\s*t\.claim_generation\s*\+", _code(sql))}
    assert advancing == {"claim_batch"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_claims_take_only_due_queued_tasks(dialect: str) -> None:
    lines = _lines(load_queries(dialect)["claim_batch"])
    assert any(line.startswith("AND status = 'queued' AND queue = ") for line in lines)
    assert any("available_at <=" in line for line in lines)


def test_python_code_only_names_queries_that_exist() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "leaseq"
    used = set()
    for path in src.rglob("*.py"):
        used |= set(re.findall(r"\.(?:rows|row|run_many)\(\s*\"(\w+)\"", path.read_text()))
    assert used, "no query calls found: the scan is broken"
    for dialect in DIALECTS:
        assert used - set(load_queries(dialect)) == set(), f"unknown in {dialect}/queries.sql"

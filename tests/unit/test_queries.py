"""The named queries, read as text (no database).

Both dialects must define the same names with the same parameters, and every
write made on the strength of a lease must carry the lease guard, defined once
per dialect as the ``lease_guard`` template of each queries.sql. Which queries
are lease-backed is said in the file itself (``-- guard: lease``, or
``-- guard: none -- <reason>`` for a query that takes a worker id without being
lease-backed): there is no list here to forget to update.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from leaseq.store.base import load_queries
from leaseq.store.queries import (LEASE_GUARD, NamedQuery, compact, load_named_queries, load_templates,
                                  parse_queries_file)

DIALECTS = ("postgres", "sqlite")

#: What the lease guard template must say, line for line, per dialect: the
#: template is the single source, and this pins what it holds.
GUARD = {
    "postgres": [
        "AND t.status = 'running'",
        "AND t.lease_owner = %(worker_id)s",
        "AND t.claim_generation = {generation}",
        "AND t.lease_expires_at >= clock_timestamp()",
    ],
    "sqlite": [
        "AND t.status = 'running'",
        "AND t.lease_owner = :worker_id",
        "AND t.claim_generation = {generation}",
        "AND t.lease_expires_at >= (julianday('now') - 2440587.5) * 86400.0",
    ],
}
DEFAULT_GENERATION = {"postgres": "%(generation)s", "sqlite": ":generation"}
#: A batch statement checks many (task, generation) pairs at once, joined as ``c``.
BATCH_GENERATION = "c.generation"
WORKER_PARAM = "worker_id"

#: The claims: the claim, the claim of a queue that uses fairness keys (engine.fairness), and
#: the lean claims: of a queue whose tasks never named a key, and of one key alone queued
#: (no-ops where the backend has none).
CLAIMS = {"claim_batch", "claim_fair", "claim_fair_one", "claim_fair_one_plain", "claim_plain"}
#: The only queries allowed to set a deadline that is not NULL.
DEADLINE_WRITERS = CLAIMS | {"renew_leases", "expire_lease", "end_worker_leases"}


def _run(dialect: str, names: set[str]) -> set[str]:
    """``names`` without the queries that are no-ops on ``dialect``."""
    return {n for n in names if not load_named_queries(dialect)[n].noop}

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


def guard_lines(dialect: str, query: NamedQuery) -> list[str]:
    """The guard lines ``query`` must contain, with the generation its template use names."""
    args = [arg for name, arg in query.templates if name == LEASE_GUARD]
    generation = (args[0] if args and args[0] else DEFAULT_GENERATION[dialect]).strip()
    return [line.replace("{generation}", generation) for line in GUARD[dialect]]


def missing_guards(dialect: str, query: NamedQuery, sql: str | None = None) -> list[str]:
    """Guard lines absent from the expanded ``sql`` (default: the query's own); empty when guarded."""
    present = set(_lines(query.sql if sql is None else sql))
    return [g for g in guard_lines(dialect, query) if g not in present]


def lint(dialect: str, queries: dict[str, NamedQuery]) -> list[str]:
    """Every lease-rule defect of a dialect's queries, as messages (empty: clean).

    - a query taking a worker id must say whether it is lease-backed;
    - a ``guard: lease`` query must expand the guard template, and its
      expanded text must hold every line of the guard.
    """
    problems = []
    for name, query in sorted(queries.items()):
        if query.noop:
            continue
        takes_worker = WORKER_PARAM in params(dialect, query.sql)
        if takes_worker and query.guard is None:
            problems.append(f"{dialect}/{name}: takes a worker id but is annotated neither "
                            "'-- guard: lease' nor '-- guard: none -- <reason>'")
        if query.lease_guarded:
            if LEASE_GUARD not in {t for t, _ in query.templates}:
                problems.append(f"{dialect}/{name}: guard: lease, but does not expand /* TEMPLATE: {LEASE_GUARD} */")
            for line in missing_guards(dialect, query):
                problems.append(f"{dialect}/{name}: guard: lease, but lacks {line!r}")
    return problems


def params(dialect: str, sql: str) -> set[str]:
    """The named parameters ``sql`` uses."""
    return set(_PARAM[dialect].findall(_code(sql)))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_guard_template_says_what_the_guard_is(dialect: str) -> None:
    template = load_templates(dialect)[LEASE_GUARD]
    assert template.param == "generation" and template.default == DEFAULT_GENERATION[dialect]
    assert [" ".join(line.split()) for line in template.body.splitlines()] == GUARD[dialect]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_query_taking_a_worker_id_is_annotated_and_guarded_ones_carry_the_guard(dialect: str) -> None:
    assert lint(dialect, load_named_queries(dialect)) == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_lease_backed_queries_are_found_by_annotation(dialect: str) -> None:
    """The guard annotations name the lease-backed writes (the set is read from the file, not kept here)."""
    guarded = {name for name, q in load_named_queries(dialect).items() if q.lease_guarded}
    assert {"renew_leases", "complete_batch", "fail_task", "lock_lease", "expire_lease"} <= guarded
    assert guarded == {name for name, q in load_named_queries("postgres").items() if q.lease_guarded}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_guard_none_always_gives_a_reason(dialect: str) -> None:
    for name, q in load_named_queries(dialect).items():
        if q.guard == "none":
            assert len(q.guard_reason) > 10, name


_HEADER = {
    "postgres": "-- template: lease_guard(generation=%(generation)s)\n"
                "AND t.status = 'running'\nAND t.lease_owner = %(worker_id)s\n"
                "AND t.claim_generation = {generation}\nAND t.lease_expires_at >= clock_timestamp()\n\n",
    "sqlite": "-- template: lease_guard(generation=:generation)\n"
              "AND t.status = 'running'\nAND t.lease_owner = :worker_id\n"
              "AND t.claim_generation = {generation}\n"
              "AND t.lease_expires_at >= (julianday('now') - 2440587.5) * 86400.0\n\n",
}
_W = {"postgres": "%(worker_id)s", "sqlite": ":worker_id"}
_T = {"postgres": "%(task_id)s", "sqlite": ":task_id"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_lint_fails_a_new_unannotated_query_taking_a_worker_id(dialect: str) -> None:
    text = _HEADER[dialect] + (f"-- name: steal_task\nUPDATE leaseq_tasks t SET result = NULL\n"
                               f"WHERE t.id = {_T[dialect]} AND t.lease_owner = {_W[dialect]};\n")
    [problem] = lint(dialect, parse_queries_file(text, "synthetic")[1])
    assert "steal_task: takes a worker id" in problem


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_lint_fails_a_guarded_query_without_the_guard(dialect: str) -> None:
    text = _HEADER[dialect] + (f"-- name: steal_task\n-- guard: lease\nUPDATE leaseq_tasks t SET result = NULL\n"
                               f"WHERE t.id = {_T[dialect]}\n  AND t.lease_owner = {_W[dialect]};\n")
    problems = lint(dialect, parse_queries_file(text, "synthetic")[1])
    assert any("does not expand" in p for p in problems), problems
    assert sum("lacks" in p for p in problems) == 3, problems  # only the owner line is there


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_lint_passes_the_same_query_once_it_expands_the_guard(dialect: str) -> None:
    text = _HEADER[dialect] + (f"-- name: steal_task\n-- guard: lease\nUPDATE leaseq_tasks t SET result = NULL\n"
                               f"WHERE t.id = {_T[dialect]}\n  /* TEMPLATE: lease_guard */;\n")
    queries = parse_queries_file(text, "synthetic")[1]
    assert lint(dialect, queries) == []
    assert queries["steal_task"].sql.rstrip().endswith("86400.0;" if dialect == "sqlite" else "clock_timestamp();")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_guard_argument_may_hold_parentheses(dialect: str) -> None:
    """A batch looks its generation up per row (renew_leases): the argument is an expression, not a column."""
    lookup = {"postgres": "(%(leases)s::jsonb ->> t.id::text)::bigint",
              "sqlite": "json_extract(:leases, '$.' || t.id)"}[dialect]
    text = _HEADER[dialect] + (f"-- name: renew\n-- guard: lease\nUPDATE leaseq_tasks t SET result = NULL\n"
                               f"WHERE t.id = {_T[dialect]}\n  /* TEMPLATE: lease_guard({lookup}) */;\n")
    queries = parse_queries_file(text, "synthetic")[1]
    assert queries["renew"].templates == ((LEASE_GUARD, lookup),)
    assert f"  AND t.claim_generation = {lookup}\n" in queries["renew"].sql
    assert lint(dialect, queries) == []


def test_plan_annotations() -> None:
    """``plan: generic`` and ``plan: generic up to <n> <param>`` are read; any other plan (``custom``
    among them: no query is planned for its values at every call any more) is refused."""
    body = "-- name: q\n-- plan: {}\nSELECT 1;\n"
    assert parse_queries_file(_HEADER["postgres"] + body.format("generic"), "synthetic")[1]["q"].generic_plan
    sized = parse_queries_file(_HEADER["postgres"] + body.format("generic up to 32 ids"), "synthetic")[1]["q"]
    assert sized.generic_plan and sized.custom_above == ("ids", 32)
    for bad in ("custom", "fast", "generic up to many ids", "generic up to 32"):
        with pytest.raises(RuntimeError, match="'plan: generic' or 'plan: generic up to <n> <array parameter>'"):
            parse_queries_file(_HEADER["postgres"] + body.format(bad), "synthetic")


def test_a_guard_annotation_without_a_reason_is_refused() -> None:
    with pytest.raises(RuntimeError, match="needs a reason"):
        parse_queries_file(_HEADER["sqlite"] + "-- name: q\n-- guard: none\nSELECT :worker_id;\n", "synthetic")


def test_both_dialects_define_the_same_queries() -> None:
    pg, sl = load_queries("postgres"), load_queries("sqlite")
    assert set(pg) - set(sl) == set(), "missing from sqlite/queries.sql"
    assert set(sl) - set(pg) == set(), "missing from postgres/queries.sql"


@pytest.mark.parametrize("name", sorted(load_queries("postgres")))
def test_each_query_takes_the_same_parameters_in_both_dialects(name: str) -> None:
    """Parity, apart from what a dialect declares: ``-- unused:`` parameters, ``-- no-op:`` statements."""
    pg, sl = load_named_queries("postgres")[name], load_named_queries("sqlite").get(name)
    if sl is None:
        pytest.fail(f"{name} is missing from sqlite/queries.sql")
    if pg.noop or sl.noop:
        return  # nothing runs on that backend: it needs no parameters
    assert params("postgres", pg.sql) | pg.unused == params("sqlite", sl.sql) | sl.unused
    for q, dialect in ((pg, "postgres"), (sl, "sqlite")):
        assert not q.unused & params(dialect, q.sql), f"{dialect}/{name} uses a parameter it declares unused"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", sorted(n for n, q in load_named_queries("postgres").items() if q.lease_guarded))
def test_the_guard_check_notices_a_deleted_line(dialect: str, name: str) -> None:
    """The check is not vacuous: removing any one line of the expanded guard is caught."""
    query = load_named_queries(dialect)[name]
    if query.noop:
        pytest.skip(f"{name} is a no-op on {dialect}: no statement to guard")
    sql = query.sql
    for guard in guard_lines(dialect, query):
        kept = [line for line in sql.splitlines() if " ".join(line.split()).rstrip(";") != guard]
        assert len(kept) == len(sql.splitlines()) - 1, f"{guard!r} is not a line of its own in {name}"
        assert missing_guards(dialect, query, "\n".join(kept)) == [guard]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_only_claims_renewals_and_releases_set_a_deadline(dialect: str) -> None:
    """Nothing else can hand a worker a later deadline (guards compare with >= or <)."""
    setters = {name for name, sql in load_queries(dialect).items()
               if re.search(r"\blease_expires_at\s*=\s*(?!\s)(?!NULL\b)", _code(sql))}
    assert setters == _run(dialect, DEADLINE_WRITERS)


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
    assert advancing == _run(dialect, CLAIMS)


@pytest.mark.parametrize("claim", sorted(CLAIMS))
@pytest.mark.parametrize("dialect", DIALECTS)
def test_claims_take_only_due_queued_tasks(dialect: str, claim: str) -> None:
    if claim not in _run(dialect, {claim}):
        pytest.skip(f"{claim} is a no-op on {dialect}")
    lines = _lines(load_queries(dialect)[claim])
    assert any(line.startswith("AND status = 'queued' AND queue = ") for line in lines)
    assert any("available_at <=" in line for line in lines)


def test_python_code_only_names_queries_that_exist() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "leaseq"
    used = set()
    for path in src.rglob("*.py"):
        used |= set(re.findall(r"\b(?:rows|row|one|run_many)\(\s*\"(\w+)\"", path.read_text()))
    assert used, "no query calls found: the scan is broken"
    for dialect in DIALECTS:
        assert used - set(load_queries(dialect)) == set(), f"unknown in {dialect}/queries.sql"


# -- what is sent: the statements without their comments ------------------------------------

def test_compact_drops_comments_and_indentation_and_keeps_quoted_text_exactly() -> None:
    sql = ("-- a comment line\n"
           "SELECT 'a -- not a comment, ''quoted''\n   still the literal' AS \"col -- x\",  -- gone\n"
           "\n"
           "       b   -- gone too\n"
           "  FROM t WHERE c = '' -- and this\n")
    assert compact(sql) == ("SELECT 'a -- not a comment, ''quoted''\n   still the literal' AS \"col -- x\",\n"
                            "b\nFROM t WHERE c = ''")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_compacting_changes_nothing_but_comments_and_whitespace(dialect: str) -> None:
    def words(sql: str) -> list[str]:
        # the statement's text with comment lines and trailing comments cut by hand:
        # every comment in the queries files starts a line or follows code after "  --"
        kept = [re.split(r"\s--\s", " " + line, maxsplit=1)[0] for line in sql.splitlines()
                if not line.lstrip().startswith("--")]
        return " ".join(kept).split()

    for name, sql in load_queries(dialect).items():
        assert compact(sql).split() == words(sql), name


def test_every_postgres_statement_fits_psycopgs_query_cache() -> None:
    """psycopg converts a query's placeholders once and caches it only under a size (and
    parameter count) limit: a statement over it is parsed again on every call. On
    PostgreSQL what is sent is a call of the query's function (leaseq.store.functions), or
    the query as written for the few sent directly."""
    from psycopg import _queries

    from leaseq.store.functions import wire_queries

    for name, sql in wire_queries()[0].items():
        assert len(sql.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, (name, len(sql.encode()))
        assert len(set(re.findall(r"%\((\w+)\)s", sql))) <= _queries.MAX_CACHED_STATEMENT_PARAMS, name


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_unsettled_side_effect_rule_is_written_once_for_both_dialects(dialect: str) -> None:
    # The recovery policy's first rule lives in sql/shared/templates.sql: every statement that
    # ends an attempt on its own judgement expands it, and none writes the rule out again.
    queries = load_named_queries(dialect)
    users = {name for name, q in queries.items() if any(t == "unsettled_side_effect" for t, _ in q.templates)}
    assert users == {"fail_task", "retry_task", "route_expired", "suspend_task"}
    assert "e.effect = 'side_effect'" not in _code(_text(dialect))
    for name in users:
        assert "THEN 'needs_reconciliation'" in queries[name].sql


def test_a_dialect_may_not_redefine_a_shared_template() -> None:
    shared = resources.files("leaseq").joinpath("sql", "shared", "templates.sql").read_text()
    with pytest.raises(RuntimeError, match="defined twice"):
        parse_queries_file(shared + "\n" + shared, "postgres/queries.sql")

"""Fuzzing the command line: generated arguments for every operator command, on both backends.

Each command runs in-process through click's test runner (the acceptance
suite runs the fixed cases in a real subprocess; here the point is volume).
A command either succeeds or exits non-zero with one clear error naming
what was wrong (leaseq's ``error: <field>: …`` or click's ``Error: Invalid
value for '--option'``), never an internal error or a traceback, and a
refused command leaves every table as it was.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import leaseq
from leaseq.cli.main import cli

from .support import JSONISH, NUMBERS, ODD_TEXT, TEXT, fuzz_settings, snapshot

FUZZ = fuzz_settings(60)
CLEAR_ERROR = re.compile(r"^(error: [a-z_]+: |Error: (Invalid value|Missing|No such|Got unexpected|Option))", re.M)

WORD = st.one_of(TEXT, ODD_TEXT, NUMBERS.map(str))
JSON_TEXT = st.one_of(JSONISH.map(json.dumps), TEXT, st.sampled_from(["{", "[1,", "nan", "{\"a\": NaN}", "1e999",
                                                                       "[" * 900 + "]" * 900, "\"\\u00e9\""]))


def commands(task: str) -> st.SearchStrategy[list[str]]:
    """Argument lists for the operator commands, with hostile values anywhere."""
    task_arg = st.one_of(st.just(task), WORD)
    opt = lambda name, values: st.one_of(st.just([]), values.map(lambda v: [name, v]))  # noqa: E731
    enqueue = st.tuples(st.just(["enqueue"]), WORD.map(lambda v: [v]), opt("--payload", JSON_TEXT),
                        opt("--queue", WORD), opt("--effect", WORD), opt("--key", WORD), opt("--priority", WORD),
                        opt("--delay", WORD), opt("--max-attempts", WORD), opt("--lease-seconds", WORD))
    ls = st.tuples(st.just(["ls"]), opt("--status", WORD), opt("--queue", WORD), opt("--limit", WORD))
    show = st.tuples(st.just(["show"]), task_arg.map(lambda v: [v]))
    cancel = st.tuples(st.just(["cancel"]), task_arg.map(lambda v: [v]), WORD.map(lambda v: ["--reason", v]))
    reconcile = st.tuples(st.just(["reconcile"]), task_arg.map(lambda v: [v]),
                          st.one_of(WORD, st.sampled_from(["completed", "requeue", "cancel"])).map(
                              lambda v: ["--outcome", v]),
                          WORD.map(lambda v: ["--note", v]), opt("--result", JSON_TEXT))
    resume = st.tuples(st.sampled_from([["unblock"], ["requeue"]]), task_arg.map(lambda v: [v]),
                       WORD.map(lambda v: ["--note", v]))
    switch = st.tuples(st.sampled_from([["pause"], ["resume"]]), WORD.map(lambda v: [v]))
    flat = lambda parts: [a for part in parts for a in part]  # noqa: E731
    return st.one_of(enqueue, ls, show, cancel, reconcile, resume, switch).map(flat)


@pytest.fixture
def seeded(dsn) -> str:
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("fuzz")
        q.enqueue("running-one")
        q.claim(w)
        return str(q.enqueue("queued-one", effect="idempotent").id)


@FUZZ
@given(data=st.data())
def test_operator_commands(dsn, seeded, data):
    argv = data.draw(commands(seeded), label="argv")
    before = snapshot(dsn)
    result = CliRunner().invoke(cli, ["--dsn", dsn, *argv])
    if isinstance(result.exception, BaseException) and not isinstance(result.exception, SystemExit):
        pytest.fail(f"{argv!r} raised {result.exception!r}; the user would see an internal error")
    if result.exit_code == 0:
        return
    assert CLEAR_ERROR.search(result.stderr), f"{argv!r} -> exit {result.exit_code}: {result.stderr!r}"
    assert "Traceback" not in result.output
    assert snapshot(dsn) == before, f"{argv!r} was refused but changed the tables"


@pytest.mark.parametrize("args, field", [
    (["--duration", "5"], "duration"), (["--duration", "1e9"], "duration"), (["--workers", "0"], "workers"),
    (["--workers", "65"], "workers"), (["--tasks", "-3"], "tasks"), (["--faults", "kill,meteor"], "faults"),
    (["--backend", "sqlite", "--faults", "partition"], "faults"), (["--concurrency", "0"], "concurrency"),
])
def test_chaos_refuses_bad_options_before_starting_anything(args, field, tmp_path):
    result = CliRunner().invoke(cli, ["chaos", *args, "--history", str(tmp_path / "h.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {field}: "), result.stderr
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("argv, field", [
    (["enqueue", "x", "--payload", "[" * 3000 + "]" * 3000], "payload"),
    (["enqueue", "\udcff"], "kind"),
    (["enqueue", "x", "--payload", "[" * 900 + "]" * 900], None),
])
def test_known_bad_arguments(dsn, seeded, argv, field):
    before = snapshot(dsn)
    result = CliRunner().invoke(cli, ["--dsn", dsn, *argv])
    if field is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {field}: "), (result.exception, result.stderr)
    assert snapshot(dsn) == before

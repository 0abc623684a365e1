"""Bad input on the real CLI: one clear ``error:`` line, a non-zero exit, no traceback, nothing changed."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import leaseq
from leaseq.core.policy import MAX_PAYLOAD_BYTES

from .cli_support import assert_one_error_line, snapshot

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"

# (arguments after --dsn, the field the error must name, words the message must contain)
# "{task}" is a queued task; "{big}" a file holding a payload over the size limit;
# "{latin1}" a file that is not UTF-8.
BAD_INPUT = [
    (["ls", "--status", "bogus"], "status", ["must be one of", "'bogus'"]),
    (["enqueue", "x", "--effect", "bogus"], "effect", ["read_only", "'bogus'"]),
    (["enqueue", "x", "--payload", "{bad"], "payload", ["not valid JSON"]),
    (["enqueue", "x", "--payload", "@{big}"], "payload", [f"{MAX_PAYLOAD_BYTES} byte limit"]),
    (["enqueue", "x", "--payload", "@{latin1}"], "payload", ["cannot read", "utf-8"]),
    (["enqueue", "x", "--payload", "@{big}.missing"], "payload", ["cannot read", "No such file"]),
    (["enqueue", ""], "kind", ["non-empty"]),
    (["enqueue", "x", "--delay", "-1"], "delay", ["at least 0"]),
    (["enqueue", "x", "--queue", "no spaces"], "queue", ["'no spaces'"]),
    (["show", "999999"], "task", ["999999 does not exist"]),
    (["show", "abc"], "task_id", ["positive integer"]),
    (["cancel", "999999", "--reason", "r"], "task", ["does not exist"]),
    (["reconcile", "{task}", "--outcome", "completed", "--note", "n"], "status", ["queued, not needs_reconciliation"]),
    (["reconcile", "{task}", "--outcome", "maybe", "--note", "n"], "outcome", ["completed, requeue, cancel"]),
    (["reconcile", "{task}", "--outcome", "completed", "--note", "n", "--result", "{"], "result", ["not valid JSON"]),
    (["unblock", "{task}", "--note", "n"], "status", ["not blocked"]),
    (["requeue", "{task}"], "status", ["not dead"]),
    (["cancel", "{task}", "--reason", " "], "reason", ["non-empty"]),
    (["pause", "bad queue"], "queue", ["'bad queue'"]),
]


@pytest.fixture
def seeded(dsn):
    """A migrated database with a worker, a running task and a queued task; yields the queued task's id."""
    with leaseq.connect(dsn) as q:
        q.migrate()
        w = q.register_worker("worker-e")
        q.enqueue("running-one", {"n": 1})
        q.claim(w)
        yield q.enqueue("queued-one", {"n": 2}, effect="idempotent").id


def test_bad_input_is_refused_and_changes_nothing(dsn, seeded, run_cli, tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * MAX_PAYLOAD_BYTES}))
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"name": "Zoë"}'.encode("latin-1"))

    def attempt(case: tuple[list[str], str, list[str]]) -> str | None:
        """Run one bad command; returns what was wrong with its handling, or None."""
        args, field, words = case
        args = [a.replace("{task}", str(seeded)).replace("{big}", str(big)).replace("{latin1}", str(latin1))
                for a in args]
        try:
            line = assert_one_error_line(run_cli("--dsn", dsn, *args), field)
            assert all(word in line for word in words), f"{line!r} lacks one of {words}"
        except AssertionError as exc:
            return f"leaseq {' '.join(args)[:60]}: {exc}"
        return None

    before = snapshot(dsn)
    # The commands only read (or are refused), so they can run side by side.
    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(attempt, BAD_INPUT) if p]
    assert problems == []
    assert snapshot(dsn) == before


def test_oversized_payload_on_stdin(dsn, seeded, run_cli):
    before = snapshot(dsn)
    proc = run_cli("--dsn", dsn, "enqueue", "x", "--payload", "-",
                   input=json.dumps({"blob": "y" * (MAX_PAYLOAD_BYTES + 1)}))
    assert "byte limit" in assert_one_error_line(proc, "payload")
    assert snapshot(dsn) == before


@pytest.mark.parametrize("dsn_text, command, words", [
    ("nonsense://x", ["ls"], ["unsupported scheme 'nonsense'"]),
    ("postgresql://a b", ["migrate"], ["cannot parse"]),
    ("sqlite://", ["enqueue", "x"], ["no file path"]),
    ("", ["stats"], ["non-empty"]),
])
def test_unparsable_dsn(run_cli, dsn_text, command, words):
    line = assert_one_error_line(run_cli("--dsn", dsn_text, *command), "dsn")
    for word in words:
        assert word in line, line
    assert list(run_cli.cwd.iterdir()) == [], "nothing may be created"


@pytest.mark.parametrize("command", [["ls"], ["migrate"], ["demo"]])
def test_unreachable_database_exits_1(run_cli, command):
    line = assert_one_error_line(run_cli("--dsn", UNREACHABLE, *command), "database", exit_code=1)
    assert "cannot connect to PostgreSQL" in line and "port 1" in line


def test_sqlite_file_that_cannot_be_opened(run_cli, tmp_path):
    line = assert_one_error_line(run_cli("--dsn", f"sqlite:///{tmp_path}/no/such/dir/q.db", "migrate"),
                                 "database", exit_code=1)
    assert "cannot open SQLite database" in line


def test_missing_sqlite_file_is_not_created(run_cli, tmp_path):
    target = tmp_path / "typo.db"
    for command in (["ls"], ["enqueue", "x"], ["show", "1"], ["cancel", "1", "--reason", "r"]):
        line = assert_one_error_line(run_cli("--dsn", f"sqlite:///{target}", *command), "dsn")
        assert "leaseq migrate" in line
    assert not target.exists()


def test_usage_errors_stay_click_usage_errors(run_cli):
    proc = run_cli("enqueue", "x", "--priority", "high")
    assert proc.returncode == 2 and "Usage:" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("cancel", "1")
    assert proc.returncode == 2 and "--reason" in proc.stderr
    assert list(run_cli.cwd.iterdir()) == []


def test_migrate_into_a_schema_that_does_not_exist_says_how_to_fix_it(run_cli):
    from conftest import _pg_or_skip, with_search_path

    missing = with_search_path(_pg_or_skip(), "leaseq_no_such_schema")
    line = assert_one_error_line(run_cli("--dsn", missing, "migrate"), "dsn")
    assert "no schema to create leaseq's tables in" in line and "CREATE SCHEMA" in line and "internal" not in line
    with pytest.raises(leaseq.ConfigError, match="CREATE SCHEMA"), leaseq.connect(missing) as q:
        q.migrate()

"""Workers announce what they serve, and say whether they are alive.

Real worker processes (``leaseq worker``) on both backends: one killed with
SIGKILL shows as lost a lease length after its last heartbeat, read from the
database's clock with no sweep; one stopped with SIGTERM shows as stopped,
with the reason. A worker's registration records the kinds it serves with
their declared options, which the CLI's enqueue checks against; a payload
that does not fit a handler fails its task at once, never retried.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

import leaseq
from leaseq.cli.main import cli
from leaseq.core.model import worker_state
from leaseq.signature import check_payload, describe

from .conftest import wait_for
from .liveness_app import summarize

ROOT = Path(__file__).resolve().parents[2]


def _worker(q: leaseq.Queue, worker_id: str) -> leaseq.Worker:
    [w] = [w for w in q.workers() if w.id == worker_id]
    return w


# -- the state, judged at read time ---------------------------------------------------------

def test_the_state_is_judged_from_the_last_heartbeat_by_the_clock_given() -> None:
    t0 = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def state(seconds: float, **row: object) -> str:
        args = dict(revoked_at=None, stopped_at=None, last_heartbeat_at=t0, heartbeat_seconds=1.0,
                    lease_seconds=3.0, now=t0 + timedelta(seconds=seconds))
        args.update(row)
        return worker_state(**args).value  # type: ignore[arg-type]

    assert [state(s) for s in (0, 1.0, 1.5, 2.99, 3.0, 100)] == ["alive", "alive", "late", "late", "lost", "lost"]
    assert state(100, stopped_at=t0) == "stopped"
    assert state(0, stopped_at=t0, revoked_at=t0) == "revoked"
    assert state(0, heartbeat_seconds=None, lease_seconds=None) == "unknown"


# -- real processes -----------------------------------------------------------------------------

@pytest.fixture
def processes(dsn: str, tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _start(dsn: str, tmp_path: Path, procs: list[subprocess.Popen], name: str) -> subprocess.Popen:
    env = dict(os.environ, LEASEQ_DSN=dsn, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli.main", "worker", "tests.worker.liveness_app:app",
                             "--name", name, "--lease-seconds", "1.5", "--poll-interval", "0.05"],
                            cwd=ROOT, env=env, stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def _registered(q: leaseq.Queue, name: str) -> leaseq.Worker:
    return wait_for(lambda: next((w for w in q.workers() if w.name == name and w.state == "alive"), None),
                    timeout=30)


def test_a_killed_worker_is_lost_after_a_lease_length_and_a_stopped_one_says_why(
        q: leaseq.Queue, dsn: str, tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    killed = _start(dsn, tmp_path, processes, "killed")
    stopped = _start(dsn, tmp_path, processes, "stopped")
    k, s = _registered(q, "killed"), _registered(q, "stopped")
    assert k.kinds == ["summarize"] and (k.heartbeat_seconds, k.lease_seconds) == (0.5, 1.5)
    # a live worker keeps heartbeating: still alive after several lease lengths
    time.sleep(2.0)
    assert _worker(q, k.id).state == "alive"
    assert _worker(q, k.id).last_heartbeat_at > k.last_heartbeat_at

    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(30) == 0
    w = _worker(q, s.id)
    assert (w.state, w.stop_reason) == ("stopped", "signal SIGTERM") and w.stopped_at is not None
    # nothing sweeps: the state is judged from the last heartbeat when read
    lost = wait_for(lambda: (w := _worker(q, k.id)).state == "lost" and w, timeout=10)
    assert lost.stopped_at is None and lost.stop_reason is None
    assert (q.now() - lost.last_heartbeat_at).total_seconds() >= 1.5
    # and the CLI says so
    result = CliRunner().invoke(cli, ["workers"], env={"LEASEQ_DSN": dsn, "COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith(("killed", "stopped"))}
    assert "lost" in lines[k.id] and "stopped" in lines[s.id] and "signal SIGTERM" in lines[s.id]


# -- what a worker declares -------------------------------------------------------------------

def test_a_running_worker_declares_its_kinds_and_records_its_stop(app: leaseq.App, start_worker) -> None:
    @app.task("summarize", effect="side_effect", actions=["mail.send"])
    def handler(ctx, doc_id: int, tags: list[str] | None = None) -> None:
        return None

    running = start_worker(lease_seconds=3.0)
    q = app.queue
    declared = q.kind_declaration("summarize")
    assert declared is not None and declared["worker_id"] == running.runtime.worker.id
    assert (declared["effect"], declared["actions"], declared["queue"]) == ("side_effect", ["mail.send"], "default")
    assert declared["signature"] == describe(handler.fn)
    assert q.kind_declaration("summarise") is None
    assert _worker(q, running.runtime.worker.id).state == "alive"
    running.runtime.stop("deploying v2")
    running.thread.join(15)
    w = _worker(q, running.runtime.worker.id)
    assert (w.state, w.stop_reason) == ("stopped", "deploying v2")
    q.heartbeat_worker(w)  # a late heartbeat does not bring a stopped worker back
    assert _worker(q, w.id).state == "stopped"


def test_a_declared_signature_refuses_what_the_handler_could_not_take() -> None:
    sig = describe(summarize.fn)
    check_payload(sig, {"doc_id": 1, "tags": ["a"]})
    for payload, field in (([1, 2], "doc_id"), (None, "doc_id"), ({"doc": 9}, "doc"), ({"doc_id": "9"}, "doc_id"),
                           ({"doc_id": 1, "tags": [1]}, "tags"), ({"doc_id": 1, "ctx": 2}, "ctx")):
        with pytest.raises(leaseq.InvalidInput) as caught:
            check_payload(sig, payload)
        assert caught.value.field == field, (payload, caught.value)


def test_a_payload_that_does_not_fit_the_handler_fails_at_once_without_retries(app: leaseq.App) -> None:
    @app.task("summarize", effect="idempotent")
    def handler(ctx, doc_id: int) -> None:
        return None

    # the library's own enqueue of a kind by name takes any payload: the worker judges it
    tasks = [app.queue.enqueue("summarize", payload) for payload in ({"doc": 9}, {"doc_id": 1, "extra": 2}, None)]
    app.run_worker(until_idle=True, poll_interval=0.05)
    for t in tasks:
        done = app.queue.get(t.id)
        assert (done.status, done.attempts) == ("dead", 1), done
        assert "does not fit the handler for 'summarize'" in done.last_error



def test_a_type_error_from_inside_a_handler_is_its_failure_and_retried(app: leaseq.App) -> None:
    """Only a call the payload cannot make is permanent: a TypeError the handler's own code
    raises (the payload fits) fails the attempt like any other error, and is retried."""
    @app.task("sync_kind", effect="idempotent", max_attempts=2)
    def sync_handler(ctx, doc_id: int) -> None:
        raise TypeError("unsupported operand")

    @app.task("async_kind", effect="idempotent", max_attempts=2)
    async def async_handler(ctx, doc_id: int) -> None:
        raise TypeError("unsupported operand")

    tasks = [app.queue.enqueue(kind, {"doc_id": 1}, max_attempts=2) for kind in ("sync_kind", "async_kind")]
    misfit = app.queue.enqueue("async_kind", {"doc": 1})
    app.run_worker(until_idle=True, poll_interval=0.05)
    for t in tasks:
        done = app.queue.get(t.id)
        assert (done.status, done.attempts) == ("queued", 1), done  # to be tried again, after its backoff
        assert "does not fit" not in done.last_error and "unsupported operand" in done.last_error
    done = app.queue.get(misfit.id)
    assert (done.status, done.attempts) == ("dead", 1) and "does not fit the handler for 'async_kind'" in done.last_error

# -- the CLI's enqueue ----------------------------------------------------------------------------

def _enqueue(dsn: str, *args: str) -> object:
    return CliRunner().invoke(cli, ["enqueue", *args], env={"LEASEQ_DSN": dsn})


def test_the_cli_warns_of_a_kind_no_worker_serves_and_checks_a_declared_one(q: leaseq.Queue, dsn: str) -> None:
    typo = _enqueue(dsn, "summarise", "--payload", '{"doc_id": 1}')
    assert typo.exit_code == 0, typo.output
    assert "no registered worker serves kind 'summarise'" in typo.stderr
    [task] = q.list_tasks()
    assert (task.kind, task.effect) == ("summarise", "read_only")

    q.register_worker("w", kinds=summarize.app.registry.declarations(), heartbeat_seconds=1, lease_seconds=3)
    for payload, field in (("[1,2]", "doc_id"), ("null", "doc_id"), ('{"doc": 9}', "doc"),
                           ('{"doc_id": "x"}', "doc_id")):
        refused = _enqueue(dsn, "summarize", "--payload", payload)
        assert refused.exit_code == 2, refused.output
        assert f"error: {field}:" in refused.stderr and "Traceback" not in refused.stderr
    assert len(q.list_tasks()) == 1  # nothing written

    ok = _enqueue(dsn, "summarize", "--payload", '{"doc_id": 7}')
    assert ok.exit_code == 0 and "warning" not in ok.stderr, ok.output
    assert q.list_tasks()[0].effect == "side_effect"  # the declared effect, not read_only
    explicit = _enqueue(dsn, "summarize", "--payload", '{"doc_id": 8}', "--effect", "idempotent")
    assert explicit.exit_code == 0 and q.list_tasks()[0].effect == "idempotent"
    # a kind served by workers elsewhere: no look-up, no check
    escaped = _enqueue(dsn, "summarize", "--payload", '{"doc": 9}', "--no-check")
    assert escaped.exit_code == 0 and "warning" not in escaped.stderr, escaped.output
    assert (q.list_tasks()[0].payload, q.list_tasks()[0].effect) == ({"doc": 9}, "read_only")


def test_the_cli_warns_of_a_queue_other_than_the_one_a_kind_is_declared_on(q: leaseq.Queue, dsn: str) -> None:
    q.register_worker("w", kinds=summarize.app.registry.declarations(), heartbeat_seconds=1, lease_seconds=3)
    typo = _enqueue(dsn, "summarize", "--payload", '{"doc_id": 1}', "--queue", "defualt")
    assert typo.exit_code == 0, typo.output
    assert ("warning: kind 'summarize' is declared on queue 'default', not 'defualt'" in typo.stderr
            and "leaseq worker --queue defualt" in typo.stderr), typo.stderr
    assert [t.queue for t in q.list_tasks()] == ["defualt"]  # written, as a kind no worker serves is
    declared = _enqueue(dsn, "summarize", "--payload", '{"doc_id": 2}')
    assert declared.exit_code == 0 and "warning" not in declared.stderr, declared.output


def test_a_worker_started_on_other_queues_records_its_kinds_on_the_queue_it_claims_from(app: leaseq.App) -> None:
    @app.task("summarize")
    def handler(ctx, doc_id: int) -> None:
        return None

    app.run_worker(until_idle=True, poll_interval=0.05, queues=["batch"])  # `leaseq worker --queue batch`
    declared = app.queue.kind_declaration("summarize")
    assert declared is not None and declared["queue"] == "batch"

"""The reference lists every status and every event type the code knows, and no other.

The lists on docs/reference/events.md are checked against three sources:
the ``Status`` enum; the event types written by the code (read from the
source: the literal types passed to the queue's event writers and the SQL
that writes or reads events); and a run on a real SQLite queue that makes
every kind of event happen.
"""

from __future__ import annotations

import contextlib

import ast
import re
import time
from datetime import timedelta
from pathlib import Path

import leaseq

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "leaseq"
PAGE = ROOT / "docs" / "reference" / "events.md"
NAME = re.compile(r"^[a-z][a-z_]*$")

#: The queue's event writers and which positional argument is the event type.
EVENT_WRITERS = {"event": 2, "event_params": 2, "_resume": 3}


def documented(section: str) -> set[str]:
    """The backticked names in the first column of the tables under ``## section``."""
    text = PAGE.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", body, flags=re.M))


def event_types_in_source() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            candidates = [kw.value for kw in node.keywords if kw.arg in ("event", "event_type")]
            if name in EVENT_WRITERS and len(node.args) > EVENT_WRITERS[name]:
                candidates.append(node.args[EVENT_WRITERS[name]])
            found |= {c.value for c in candidates
                      if isinstance(c, ast.Constant) and isinstance(c.value, str) and NAME.match(c.value)}
    for sql in (SRC / "sql").rglob("queries.sql"):
        text = sql.read_text()
        found |= set(re.findall(r"'([a-z_]+)' AS type", text))
        found |= set(re.findall(r"SELECT :task_id, '([a-z_]+)'", text))
    return found


def event_types_of_a_run(tmp_path: Path) -> set[str]:
    """Make every kind of event happen on a real SQLite queue; return the types seen."""
    q = leaseq.connect(f"sqlite:///{tmp_path / 'events.db'}")
    q.migrate()
    w = q.register_worker("w")
    ids = []

    def take(**options):  # each task on a queue of its own, so the claim takes that one
        queue = f"q{len(ids)}"
        ids.append(q.enqueue("k", {"n": len(ids)}, queue=queue, **options).id)
        [claim] = q.claim(w, queue=queue)
        return claim

    q.complete(w, take(), "ok")                                        # claimed, completed
    upstream = take()
    ids.append(q.enqueue("k", queue="later", after=[upstream.task_id]).id)  # waiting
    q.complete(w, upstream, "ok")                                      # dependencies_met
    q.fail(w, take(), "boom", retry=False)                             # failed, dead
    q.requeue(ids[-1], "again")                                        # requeued
    q.fail(w, take(), "no key", block=True)                            # blocked
    q.unblock(ids[-1], "key fixed")                                    # unblocked
    claim = take(effect="side_effect", lease_seconds=0.3)
    fx = q.begin_effect(w, claim, "mail.send")                         # effect_intent
    q.finish_effect(w, claim, fx, {"id": 1})                           # effect_response
    q.begin_effect(w, claim, "mail.send", "mail:0", effect="side_effect", args_digest="ab")
    q.finish_effect(w, claim, q.begin_effect(w, claim, "mail.send", "mail:0", effect="side_effect"), {"id": 2})
    q.begin_effect(w, claim, "mail.send", "mail:0", effect="side_effect")  # tool_replayed
    q.begin_effect(w, claim, "mail.send", "second")
    time.sleep(0.4)
    q.sweep()                                                          # lease_expired, needs_reconciliation
    q.report_loss(w, claim, "heartbeat refused")                       # lease_lost
    q.reconcile(ids[-1], "cancel", "checked")                          # reconciled
    q.release(w, take(), "shutdown")                                   # lease_released
    q.retry(w, take(), after=0, reason="429")                          # retry_requested
    ids.append(q.enqueue("k", {"n": "late"}, queue="late", deadline=timedelta(0)).id)
    q.sweep()                                                          # deadline_passed
    take()
    q.revoke_worker(w)                                                 # lease_revoked
    w2 = q.register_worker("w2")
    ids.append(q.enqueue("k", {"n": "last"}).id)
    [claim] = q.claim(w2)
    q.cancel(claim.task_id, reason="not needed")                       # cancelled
    gated = q.enqueue("k", {"n": "gated"}, approval="required")        # approval_requested
    ids.append(gated.id)
    q.approve(gated.id, q.approval(gated.id).digest)                   # approved
    ids.append(q.enqueue("k", {"n": "refused"}, approval="required").id)
    q.deny(ids[-1], "not now")                                         # denied
    ids.append(q.enqueue("k", {"n": "agent"}, queue="agents", effect="idempotent").id)
    [claim] = q.claim(w2, queue="agents")
    child = q.intend(w2, claim, "k", {"n": "child"}, key="child", queue="executors")  # intent_recorded
    ids.append(child.id)
    q.claim(w2, queue="executors")
    q.cancel(claim.task_id, reason="agent stopped")                    # parent_cancelled (its running intent)
    ids.append(q.enqueue("k", queue="single", singleton_key="s").id)
    q.enqueue("k", queue="single", singleton_key="s")                  # singleton_skipped
    ids.append(q.enqueue("k", queue="calm", debounce=60, key="d").id)
    q.enqueue("k", queue="calm", debounce=60, key="d")                 # debounced
    ids.append(q.enqueue("k", {"n": "waits"}, queue="waits", idempotency_key="waits").id)
    [claim] = q.claim(w2, queue="waits")
    q.sleep(w2, claim, "waits:sleep:0", seconds=0.2)                    # suspended
    time.sleep(0.3)
    [claim] = q.claim(w2, queue="waits")                               # woke
    q.signal(claim.task_id, "go", 1)                                   # signal_sent
    q.wait_signal(w2, claim, "waits:signal:go:0", "go")                # signal_received
    q.wait_signal(w2, claim, "waits:signal:late:0", "late", timeout=0)  # wait_timed_out
    q.emit(w2, claim, {"progress": 1})                                 # stream_started
    q.wait_signal(w2, claim, "waits:ask:0", "leaseq.answer", ask={"question": "ok?", "schema": {"type": "boolean"}})
    q.answer(claim.task_id, True)                                      # answered
    ids.append(q.enqueue("k", {"n": "parent"}, queue="parents", idempotency_key="parent").id)
    [claim] = q.claim(w2, queue="parents")
    child = q.spawn(w2, claim, "k", {"n": "child"}, key="child")        # child_spawned
    q.wait_children(w2, claim, "parent:children:0", [child.id])         # suspended (children)
    [kid] = q.claim(w2, queue="parents")
    q.complete(w2, kid, "done")                                        # woke (children)
    [claim] = q.claim(w2, queue="parents")
    q.wait_children(w2, claim, "parent:children:0", [child.id])         # children_awaited
    q.spawn(w2, claim, "k", {"n": "second"}, key="second")
    q.cancel(claim.task_id, reason="enough", tree=True)                # tree_cancelled
    ids.append(q.enqueue("k", {"n": "spends"}, queue="spends", budget={"tokens": 1}).id)
    [claim] = q.claim(w2, queue="spends")
    q.consume(w2, claim, "spends:consume:0", "tokens", 2)              # budget_exceeded
    ids.append(q.enqueue("k", {"n": "replays"}, queue="replays", idempotency_key="replays").id)
    [claim] = q.claim(w2, queue="replays")
    q.sleep(w2, claim, "replays:sleep:0", seconds=0)
    with contextlib.suppress(leaseq.ToolCallDiverged):                 # diverged
        q.consume(w2, claim, "replays:sleep:0", "tokens", 1)  # a consume where a sleep was recorded
    seen = {e.type for task_id in ids for e in q.events(task_id)}
    q.close()
    return seen


def test_every_status_is_documented():
    assert documented("Statuses") == {s.value for s in leaseq.Status}


def test_the_source_still_shows_its_event_types():
    """If the event writers are renamed, update EVENT_WRITERS: the scan must keep finding them."""
    assert len(event_types_in_source()) >= 12, event_types_in_source()


def test_every_event_type_is_documented_and_none_other(tmp_path: Path):
    docs = documented("Events")
    status_events = {leaseq.Status.DEAD, leaseq.Status.BLOCKED, leaseq.Status.NEEDS_RECONCILIATION}
    in_source = event_types_in_source() | {s.value for s in status_events}
    in_a_run = event_types_of_a_run(tmp_path)
    assert in_source - docs == set(), "written by the code, missing from docs/reference/events.md"
    assert in_a_run - docs == set(), "seen in a run, missing from docs/reference/events.md"
    assert docs - (in_source | in_a_run) == set(), "documented, but the code never writes it"
    assert in_a_run == docs, "the run should make every documented event happen"


def test_every_effect_status_and_class_is_documented():
    assert documented("Effect classes") == {e.value for e in leaseq.EffectKind}
    schema = (SRC / "sql" / "sqlite" / "migrations" / "0001_initial.sql").read_text()
    effect_statuses = set(re.findall(r"'(\w+)'", re.search(r"status\s+TEXT[^\n]*'pending'[^\n]*", schema)[0]))
    assert documented("Effects") == effect_statuses


def test_every_environment_variable_the_code_reads_is_documented():
    """Each ``LEASEQ_…`` name written in the source or the test fixtures is on the configuration page
    (the per-option variables are generated there from the command tree)."""
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    names: set[str] = set()
    for path in [*SRC.rglob("*.py"), *(ROOT / "chaos" / "src").rglob("*.py"), ROOT / "tests" / "conftest.py",
                 ROOT / "tests" / "system_tools.py"]:
        names |= set(re.findall(r"[\"'](LEASEQ_[A-Z][A-Z_]*[A-Z])[\"']", path.read_text()))
    names.discard("LEASEQ_CHAOS")  # a prefix the harness strips from its workers' environment
    assert len(names) >= 10, names
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"not on docs/reference/configuration.md: {missing}"

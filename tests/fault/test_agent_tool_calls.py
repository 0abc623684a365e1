"""The design note's scenario with an agent, in real worker processes killed with SIGKILL.

An agent task makes five calls (two read-only model requests, one
idempotent write, two side effects through a FencedStore): see
``tests/fault/agent_app.py``, written once per framework adapter and once
with plain ``ctx.tool``. Its worker is killed after the third call; the
next attempt finishes the run. Downstream, each side effect was applied
exactly once, the model was called as often as in a run without the crash,
and the trail shows which calls were replayed. Killed between a side
effect's call and its recorded response instead, the task goes to
reconciliation and nothing is repeated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import leaseq
from leaseq.fencing import FencedStore

from .support import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: long enough for a loaded machine to keep renewing it, short enough to wait out after the kill
LEASE = 2.0
FRAMEWORKS = {"pydantic_ai": "pydantic_ai", "openai_agents": "agents", "langgraph": "langgraph"}


class AgentWorkers:
    def __init__(self, dsn: str, fault_dir: Path, agent: str):
        self.dsn, self.fault_dir, self.agent = dsn, fault_dir, agent
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, **env: str) -> subprocess.Popen:
        full = dict(os.environ, LEASEQ_DSN=self.dsn, FENCE_DSN=self.dsn, FAULT_DIR=str(self.fault_dir),
                    AGENT=self.agent, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **env)
        log = open(self.fault_dir / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "tests.fault.agent_app"], cwd=ROOT, env=full, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.fault_dir / f"{name}.log").read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    def count(self, name: str, task_id: int) -> int:
        path = self.fault_dir / f"{name}-{task_id}.log"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def queue(dsn: str) -> Iterator[leaseq.Queue]:
    q = leaseq.connect(dsn)
    q.migrate()
    FencedStore(dsn).migrate()
    yield q
    q.close()


def _workers(request: pytest.FixtureRequest, dsn: str, tmp_path: Path, agent: str) -> AgentWorkers:
    if agent in FRAMEWORKS:
        pytest.importorskip(FRAMEWORKS[agent])
    workers = AgentWorkers(dsn, tmp_path, agent)
    request.addfinalizer(workers.close)
    return workers


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


MODEL_ACTION = {"plain": "llm.request", "pydantic_ai": "llm.request", "openai_agents": "llm.response",
                "langgraph": "llm.invoke"}
# Every adapter on PostgreSQL, and plain ctx.tool on both backends: the ledger's
# rules are the conformance suite's; here the processes and the frameworks are under test.
CASES = [pytest.param(a, id=a) for a in ("plain", *FRAMEWORKS)]


@pytest.mark.parametrize("agent", CASES)
def test_an_agent_killed_after_its_third_call_resumes_without_repeating_anything(
        request: pytest.FixtureRequest, queue: leaseq.Queue, dsn: str, tmp_path: Path, agent: str) -> None:
    if agent != "plain" and queue.dialect != "postgres":
        pytest.skip("the adapters run on one backend; plain ctx.tool covers both")
    workers = _workers(request, dsn, tmp_path, agent)
    crashed = queue.enqueue("refund", {}, effect="side_effect", idempotency_key="refund-7",
                            lease_seconds=LEASE)
    clean = queue.enqueue("refund", {}, effect="side_effect", idempotency_key="refund-8",
                          lease_seconds=LEASE)
    first = workers.start("first", HOLD_AFTER="charge")
    wait_for(lambda: (tmp_path / f"held-{crashed.id}").exists() or first.poll() is not None, 60,
             "the first attempt made its third call")
    assert first.poll() is None, workers.log("first")
    # the clean run may be anywhere; the crashed one has recorded three calls and begun no fourth
    entries = queue.effects(crashed.id)
    assert [(e.action, e.status) for e in entries] == [(MODEL_ACTION[agent], "done"), ("save_note", "done"),
                                                       ("charge", "done")]
    _kill(first)
    workers.start("second")
    wait_for(lambda: queue.get(crashed.id).status == "completed" and queue.get(clean.id).status == "completed",
             90, "both runs completed")

    for task in (crashed, clean):
        done = queue.get(task.id)
        assert "refunded 5" in str(done.result), done.result
        for action in ("charge", "send_receipt"):
            assert workers.count(f"applied-{action}", task.id) == 1, (action, task.id)  # downstream: once each
            assert workers.count(action, task.id) == 1, (action, task.id)  # the tool itself ran once
        assert workers.count("save_note", task.id) == 1
    # the model was called as often as in the run without the crash: the first request was replayed
    assert workers.count("model", crashed.id) == workers.count("model", clean.id) == 2
    assert queue.get(crashed.id).claim_generation == 2
    trail = queue.events(crashed.id)
    replayed = [e.detail["action"] for e in trail if e.type == "tool_replayed"]
    assert replayed == [MODEL_ACTION[agent], "save_note", "charge"], replayed
    assert all(e.generation == 2 for e in trail if e.type == "tool_replayed")
    assert [e.type for e in queue.events(clean.id)].count("tool_replayed") == 0
    expired = [e for e in trail if e.type == "lease_expired"]
    assert expired and expired[0].detail["routed_to"] == "queued"  # no side effect was open


@pytest.mark.parametrize("agent", [pytest.param("plain", id="plain"), pytest.param("pydantic_ai", id="pydantic_ai")])
def test_a_kill_between_a_side_effect_and_its_recorded_response_goes_to_reconciliation(
        request: pytest.FixtureRequest, queue: leaseq.Queue, dsn: str, tmp_path: Path, agent: str) -> None:
    if agent != "plain" and queue.dialect != "postgres":
        pytest.skip("the adapter runs on one backend; plain ctx.tool covers both")
    workers = _workers(request, dsn, tmp_path, agent)
    task = queue.enqueue("refund", {}, effect="side_effect", idempotency_key="refund-9",
                         lease_seconds=LEASE)
    first = workers.start("first", HOLD_BEFORE="charge")
    wait_for(lambda: (tmp_path / f"held-{task.id}").exists() or first.poll() is not None, 60,
             "the first attempt made the charge")
    assert first.poll() is None, workers.log("first")
    _kill(first)
    second = workers.start("second")  # claims nothing: the task must not run again
    wait_for(lambda: queue.get(task.id).status == "needs_reconciliation", 60, "the task went to reconciliation")
    [expired] = [e for e in queue.events(task.id) if e.type == "lease_expired"]
    assert expired.detail["routed_to"] == "needs_reconciliation"
    open_calls = [(e.action, e.effect) for e in queue.effects(task.id) if e.status == "pending"]
    assert open_calls == [("charge", "side_effect")]
    assert workers.count("applied-charge", task.id) == 1 and workers.count("charge", task.id) == 1
    assert workers.count("send_receipt", task.id) == 0 and workers.count("applied-send_receipt", task.id) == 0
    assert workers.count("model", task.id) == 1
    assert second.poll() is None and queue.get(task.id).claim_generation == 1  # nobody ran it again

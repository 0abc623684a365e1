"""Asking a person over HTTP and in the dashboard: a remote worker's ctx.ask ends its attempt
through the worker API; `GET /v1/asks` lists the question (redacted for a token that may not
read payloads), `POST /v1/tasks/{id}/answer` takes an answer from an operator only, within its
queues, after checking it against the question's schema (422 naming the field, 409 for a task
that waits for no answer, never a 500); the dashboard's inbox answers through a form built from
the schema; `leaseq answer` refuses a bad answer in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import leaseq
from leaseq import auth
from leaseq.worker import WorkerRuntime
from leaseq_chaos.traces import validate_queue
from snapshots import snapshot
from worker.conftest import RunningWorker, wait_for

from .browser import browser, chromium, login, needs_browser  # noqa: F401  (fixtures)
from .conftest import serve
from .support import error_of

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"type": "object",
         "properties": {"approve": {"type": "boolean", "title": "Approve"},
                        "level": {"enum": ["low", "high"], "title": "Level"},
                        "amount": {"type": "integer", "minimum": 1, "title": "Amount"},
                        "note": {"type": "string", "title": "Note"}},
         "required": ["approve", "amount"], "additionalProperties": False}


def _app() -> leaseq.App:
    app = leaseq.App(name="asks-http")

    @app.task("refund")
    def refund(ctx: leaseq.TaskContext, order: int) -> Any:
        decision = ctx.ask(f"Refund order {order}?", ORDER)
        return {"order": order, "decision": decision}

    @app.task("tags")
    async def tags(ctx: leaseq.TaskContext) -> Any:  # an answer no simple form fits: a JSON text area
        return await ctx.ask("Which tags?", {"type": "array", "items": {"type": "string"}, "minItems": 1})

    return app


def _data(dsn: str) -> dict[str, Any]:
    """Every table but the tokens' (whose last use each request records)."""
    return {name: rows for name, rows in snapshot(dsn).items() if name != "leaseq_tokens"}


def test_a_remote_worker_asks_and_an_operator_answers_over_http(svc: Any) -> None:
    q = svc.q
    task = q.enqueue("refund", {"order": 7})
    remote = svc.remote(svc.token("worker", all_queues=True))
    running = RunningWorker(WorkerRuntime(_app(), remote, concurrency=2, poll_interval=0.05,
                                          grace=20))
    try:
        wait_for(lambda: q.get(task.id).status == "waiting", timeout=30)
        assert q.get(task.id).lease_owner is None
        operator = svc.http(svc.token("operator", name="olga"))
        [asked] = operator.get("/v1/asks").json()["asks"]
        assert (asked["task_id"], asked["question"], asked["key"]) == (task.id, "Refund order 7?",
                                                                      f"{q.get(task.id).idempotency_key}:ask:0")
        assert asked["schema"] == ORDER and list(asked["schema"]["properties"]) == list(ORDER["properties"])
        assert asked["schema_summary"] == 'approve: boolean, level?: "low"|"high", amount: integer, note?: string'
        viewer = svc.http(svc.token("viewer"))
        [hidden] = viewer.get("/v1/asks").json()["asks"]
        assert hidden["question"] == "[redacted]" and hidden["schema"] == ORDER
        refused = (viewer, svc.http(svc.token("worker", all_queues=True)),
                   svc.http(svc.token("operator", queues=["other"])),
                   svc.http(svc.token("operator", name="blind", read_payloads=False)))
        before = _data(svc.dsn)
        for body, field in (({"answer": {"approve": True, "amount": "5"}}, "answer.amount"),
                            ({"answer": {"approve": True}}, "answer.amount"),
                            ({"answer": {"approve": True, "amount": 5, "level": "urgent"}}, "answer.level"),
                            ({"answer": {"approve": True, "amount": 5}, "by": "someone else"}, "by"),
                            ({}, "answer")):
            resp = operator.post(f"/v1/tasks/{task.id}/answer", json=body)
            assert resp.status_code == 422 and error_of(resp)["field"] == field, (body, resp.text)
        for who in refused:
            resp = who.post(f"/v1/tasks/{task.id}/answer", json={"answer": {"approve": True, "amount": 5}})
            assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden", resp.text
        assert _data(svc.dsn) == before and q.get(task.id).status == "waiting"
        ok = operator.post(f"/v1/tasks/{task.id}/answer", json={"answer": {"approve": True, "amount": 5}})
        assert ok.status_code == 200 and ok.json()["answered_by"].startswith("olga (operator token ")
        again = operator.post(f"/v1/tasks/{task.id}/answer", json={"answer": {"approve": False, "amount": 1}})
        assert again.status_code == 409  # taken once: answered already, or by now completed with it
        assert re.search(r"answered already|is completed", error_of(again)["message"]), again.text
        wait_for(lambda: q.get(task.id).status == "completed", timeout=30)
    finally:
        running.stop()
    assert q.get(task.id).result == {"order": 7, "decision": {"approve": True, "amount": 5}}
    [answered] = [e for e in q.events(task.id) if e.type == "answered"]
    assert answered.detail["by"] == ok.json()["answered_by"]
    assert [e["action"] for e in auth.audit_log(q, 100) if e["target"] == f"task:{task.id}"] == ["answer"]
    missing = svc.http(svc.token("operator")).post("/v1/tasks/999999/answer", json={"answer": 1})
    assert missing.status_code == 404
    done = operator.post(f"/v1/tasks/{task.id}/answer", json={"answer": 1})
    assert done.status_code == 409 and "completed" in error_of(done)["message"]
    assert validate_queue(q) == []


def test_remote_queue_lists_and_answers(svc: Any) -> None:
    q = svc.q
    task = q.enqueue("tags", {})
    running = RunningWorker(WorkerRuntime(_app(), svc.remote(svc.token("worker", all_queues=True)),
                                          poll_interval=0.05, grace=20))
    try:
        wait_for(lambda: q.get(task.id).status == "waiting", timeout=30)
        person = svc.remote(svc.token("operator"))
        [asked] = person.asks()
        assert asked["task_id"] == task.id and asked["schema_summary"] == "list of string"
        try:
            person.answer(task.id, [])
            raise AssertionError("an empty list was taken")
        except leaseq.InvalidInput as exc:
            assert exc.field == "answer" and "at least 1 items" in exc.problem
        person.answer(task.id, ["urgent", "vip"])
        wait_for(lambda: q.get(task.id).status == "completed", timeout=30)
    finally:
        running.stop()
    assert q.get(task.id).result == ["urgent", "vip"]


def test_leaseq_answer_refuses_a_bad_answer_in_one_line(q: leaseq.Queue, dsn: str, tmp_path: Path) -> None:
    task = q.enqueue("refund", {"order": 8}, idempotency_key="refund-8")
    w = q.register_worker("w")
    [claim] = q.claim(w)
    q.wait_signal(w, claim, "refund-8:ask:0", "leaseq.answer", ask={"question": "Refund order 8?", "schema": ORDER})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               LEASEQ_DSN=dsn, COLUMNS="200")

    def leaseq_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "leaseq.cli", *args], env=env, capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)

    listed = leaseq_cli("asks")
    assert listed.returncode == 0 and "Refund order 8?" in listed.stdout, listed.stderr
    assert 'approve: boolean, level?: "low"|"high", amount: integer, note?: string' in listed.stdout
    before = snapshot(dsn)
    for bad, field in (('{"approve": true, "amount": 0}', "answer.amount"), ('{"approve": tru', "json")):
        refused = leaseq_cli("answer", str(task.id), "--json", bad)
        assert refused.returncode == 2 and refused.stdout == "", refused
        [line] = refused.stderr.splitlines()  # one line, no traceback
        assert line.startswith(f"error: {field}: "), line
    assert snapshot(dsn) == before
    done = leaseq_cli("answer", str(task.id), "--json", '{"approve": true, "amount": 3, "level": "low"}')
    assert done.returncode == 0 and done.stdout.strip() == f"task {task.id} answered: it is queued again"
    twice = leaseq_cli("answer", str(task.id), "--json", '{"approve": false, "amount": 3}')
    assert twice.returncode == 2 and len(twice.stderr.splitlines()) == 1 and "answered already" in twice.stderr
    [answered] = [e for e in q.events(task.id) if e.type == "answered"]
    assert answered.detail["by"].startswith("cli:")


@needs_browser
def test_the_inbox_answers_a_question_through_its_form(browser, q: leaseq.Queue) -> None:  # noqa: F811
    refund = q.enqueue("refund", {"order": 9})
    tagging = q.enqueue("tags", {})
    operator = auth.create_token(q, name="olga", role="operator", created_by="test")[0]
    running = RunningWorker(WorkerRuntime(_app(), q, concurrency=2, poll_interval=0.05, grace=20))
    try:
        wait_for(lambda: all(q.get(t.id).status == "waiting" for t in (refund, tagging)), timeout=30)
        with serve(q) as (url, _service):
            context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.set_default_timeout(10_000)
            try:
                login(page, operator)
                page.goto("/inbox")
                card = page.locator(f'.ask-item[data-task="{refund.id}"]')
                assert card.locator(".question").inner_text() == "Refund order 9?"
                form = card.locator("form.answer")
                # the fields the schema asks for, in its order
                assert [form.locator(f"[name='field.{n}']").count() for n in ORDER["properties"]] == [1, 1, 1, 1]
                assert form.locator("[name='field.approve']").get_attribute("type") == "checkbox"
                assert form.locator("[name='field.amount']").get_attribute("type") == "number"
                form.locator("[name='field.approve']").check()
                form.locator("[name='field.level']").select_option(label="high")
                form.locator("[name='field.amount']").fill("0")  # below the minimum: refused by the queue
                with page.expect_navigation(url=re.compile(r"/inbox$")):
                    form.locator("button").click()
                assert "answer.amount: must be at least 1" in page.inner_text("[role=alert]")
                assert q.get(refund.id).status == "waiting"
                form = page.locator(f'.ask-item[data-task="{refund.id}"] form.answer')
                form.locator("[name='field.approve']").check()
                form.locator("[name='field.level']").select_option(label="high")
                form.locator("[name='field.amount']").fill("25")
                form.locator("[name='field.note']").fill("checked the order")
                with page.expect_navigation(url=re.compile(r"/inbox$")):
                    form.locator("button").click()
                assert f"task {refund.id} answered" in page.inner_text("[role=status]")
                assert page.locator(f'.ask-item[data-task="{refund.id}"]').count() == 0
                # the JSON text area, for an answer no simple form fits
                card = page.locator(f'.ask-item[data-task="{tagging.id}"]')
                assert card.locator("code.schema-summary").inner_text() == "list of string"
                card.locator("textarea[name=json]").fill('["vip"]')
                with page.expect_navigation(url=re.compile(r"/inbox$")):
                    card.locator("form.answer button").click()
                assert page.locator("#no-questions").is_visible()
            finally:
                context.close()
        wait_for(lambda: all(q.get(t.id).status == "completed" for t in (refund, tagging)), timeout=30)
    finally:
        running.stop()
    assert q.get(refund.id).result == {"order": 9, "decision": {"approve": True, "level": "high", "amount": 25,
                                                                "note": "checked the order"}}
    assert q.get(tagging.id).result == ["vip"]
    [answered] = [e for e in q.events(refund.id) if e.type == "answered"]
    assert answered.detail["by"].startswith("olga (operator token ")
    assert [e["detail"].get("via") for e in auth.audit_log(q, 100) if e["action"] == "answer"] == \
        ["dashboard", "dashboard"]

"""The dashboard's pages in a real headless Chromium, on both backends.

Live updates arrive without a reload (and do not when the service's live
updates are off: the same wait then finds nothing, so the test cannot pass
by reloading); bulk requeue and cancel with one note, checked in the
database and the audit log; search and keyset paging; the workers and
charts pages; a viewer sees no action form. Each page's screenshot is saved
under tmp_path (and, with ``LEASEQ_DASHBOARD_SCREENSHOTS=<folder>``, copied
there: that is how docs/img/dashboard-*.png are made).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import leaseq
from leaseq import auth

from .browser import browser, chromium, login, needs_browser, png_facts  # noqa: F401  (fixtures)
from .conftest import serve

pytestmark = needs_browser


@contextmanager
def dashboard(browser: Any, q: leaseq.Queue, **settings: Any) -> Iterator[Any]:
    """A service for ``q`` with ``settings``, and a fresh browser page on it."""
    with serve(q, **settings) as (url, _app):
        context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(10_000)
        try:
            yield pg
        finally:
            context.close()


def token(q: leaseq.Queue, role: str, name: str) -> str:
    return auth.create_token(q, name=name, role=role, created_by="test", all_queues=True)[0]


def appears(page: Any, selector: str, seconds: float) -> bool:
    """Whether ``selector`` shows up within ``seconds`` (without reloading the page)."""
    try:
        page.wait_for_selector(selector, timeout=seconds * 1000)
        return True
    except Exception as exc:
        if "Timeout" in type(exc).__name__:
            return False
        raise


def _mark(page: Any) -> None:
    # A reload or a navigation would lose this: it proves the page stayed the same document.
    page.evaluate("window.__same_document = 42")


def _unmarked(page: Any) -> bool:
    return page.evaluate("window.__same_document") != 42


@pytest.mark.parametrize("live", [True, False], ids=["live", "live-off"])
def test_changes_arrive_without_a_reload(browser, q: leaseq.Queue, live: bool) -> None:
    # live: up to twenty intervals for each change to arrive (it returns as soon as one does);
    # not live: six intervals in which nothing may arrive, where one would have arrived in the first
    waited = 4.0 if live else 1.2
    with dashboard(browser, q, live_updates=live, live_interval=0.2) as page:
        w = q.register_worker("w")
        first = q.enqueue("summarize", {"doc": 1}, queue="mail")
        login(page, token(q, "operator", "olga"))
        assert (page.locator("script[src='/static/live.js']").count() == 1) is live
        # the overview: a new queue's row
        _mark(page)
        q.enqueue("ingest", queue="reports")
        assert appears(page, '#queues tr[data-queue="reports"]', waited) is live
        assert not _unmarked(page)
        # the task list: a new task's row, and a ticked box survives the update
        page.goto("/tasks")
        _mark(page)
        ticked = page.locator(f'input[name=ids][value="{first.id}"]')
        ticked.check()
        newer = q.enqueue("summarize", {"doc": 2}, queue="mail")
        assert appears(page, f'#tasks tr[data-task="{newer.id}"]', waited) is live
        assert not _unmarked(page) and ticked.is_checked()
        # a task's evidence trail: a claim, then a completion, as they happen
        page.goto(f"/tasks/{first.id}")
        _mark(page)
        [c] = q.claim(w, queue="mail")
        assert c.task_id == first.id
        assert appears(page, '#timeline .gen[data-generation="1"]', waited) is live
        q.complete(w, c, {"ok": True})
        assert appears(page, "#status:has-text('completed')", waited) is live
        assert not _unmarked(page)
        if live:
            assert int(page.get_attribute("body", "data-live-updates")) >= 2
        else:  # the data is there: a reload shows it
            page.reload()
            assert page.inner_text("#status") == "completed"


def _dead(q: leaseq.Queue, w: leaseq.Worker, n: int) -> list[int]:
    ids = [q.enqueue("send", {"n": i}, queue="bulk").id for i in range(n)]
    for c in q.claim(w, queue="bulk", limit=n):
        q.fail(w, c, "provider down", retry=False)
    assert {q.get(i).status for i in ids} == {"dead"}
    return ids


def test_bulk_requeue_and_cancel_with_one_note(browser, q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    dead = _dead(q, w, 3)
    done = q.enqueue("send", queue="bulk")
    [c] = q.claim(w, queue="bulk")
    q.complete(w, c)
    with dashboard(browser, q, live_interval=0.2) as page:
        login(page, token(q, "operator", "olga"))
        page.goto("/tasks?queue=bulk")
        for i in [*dead, done.id]:
            page.locator(f'input[name=ids][value="{i}"]').check()
        page.fill("#bulk input[name=note]", "provider is back")
        with page.expect_navigation(url=re.compile(r"/tasks\?queue=bulk$")):
            page.click("#bulk button.bulk-requeue")
        assert "requeue: 3 of 4 tasks done" in page.inner_text("[role=status]")
        refusal = page.inner_text("[role=alert]")
        assert f"task {done.id}: " in refusal and "completed" in refusal and "1 task(s)" in refusal
        assert [q.get(i).status for i in dead] == ["queued"] * 3 and q.get(done.id).status == "completed"
        for i in dead:
            [ev] = [e for e in q.events(i) if e.type == "requeued"]
            assert ev.detail["note"] == "provider is back" and ev.detail["by"].startswith("olga (operator token ")
        entries = [e for e in auth.audit_log(q) if e["action"] == "requeue"]
        assert sorted(e["target"] for e in entries) == sorted(f"task:{i}" for i in dead)
        assert {e["detail"]["via"] for e in entries} == {"dashboard"}
        # cancel needs its reason: an empty note is refused and nothing changes
        page.goto("/tasks?queue=bulk&status=queued")
        page.locator(f'input[name=ids][value="{dead[0]}"]').check()
        page.click("#bulk button.bulk-cancel")
        assert "reason: required field is missing" in page.inner_text("main")
        assert q.get(dead[0]).status == "queued"
        page.goto("/tasks?queue=bulk&status=queued")
        for i in dead[:2]:
            page.locator(f'input[name=ids][value="{i}"]').check()
        page.fill("#bulk input[name=note]", "superseded by the new campaign")
        with page.expect_navigation():
            page.click("#bulk button.bulk-cancel")
        assert "cancel: 2 of 2 tasks done" in page.inner_text("[role=status]")
        assert [q.get(i).status for i in dead] == ["cancelled", "cancelled", "queued"]
        [ev] = [e for e in q.events(dead[0]) if e.type == "cancelled"]
        assert ev.detail["reason"] == "superseded by the new campaign"


def test_search_and_keyset_paging_keep_their_urls(browser, q: leaseq.Queue) -> None:
    ids = [q.enqueue("ingest" if i % 3 else "mail", {"i": i}, idempotency_key=f"order-{i:03d}").id for i in range(60)]
    with dashboard(browser, q) as page:
        # searching keys needs a token that may read them (a viewer without read_payloads searches ids only)
        login(page, auth.create_token(q, name="vera", role="viewer", created_by="test", read_payloads=True)[0])
        page.goto("/tasks?limit=25")
        shown = [int(x) for x in page.locator("#tasks tr[data-task]").evaluate_all(
            "rows => rows.map(r => r.dataset.task)")]
        assert shown == ids[::-1][:25] and page.locator("#newer").count() == 0
        page.click("#older")
        second_url = page.url
        second = page.locator("#tasks tr[data-task]").evaluate_all("rows => rows.map(r => +r.dataset.task)")
        assert second == ids[::-1][25:50]
        for i in range(10):  # new tasks do not shift a page's rows
            q.enqueue("ingest", {"late": i})
        page.goto(second_url)
        assert page.locator("#tasks tr[data-task]").evaluate_all("rows => rows.map(r => +r.dataset.task)") == second
        page.click("#older")
        assert page.locator("#tasks tr[data-task]").evaluate_all(
            "rows => rows.map(r => +r.dataset.task)") == ids[::-1][50:]
        assert page.locator("#older").count() == 0
        page.click("#newer")
        assert page.locator("#tasks tr[data-task]").evaluate_all("rows => rows.map(r => +r.dataset.task)") == second
        # search: a key substring, within a kind
        page.goto("/tasks")
        page.fill("#search", "order-01")
        page.select_option("select[name=kind]", "mail")
        page.click("#filter")
        found = page.locator("#tasks tr[data-task]").evaluate_all("rows => rows.map(r => +r.dataset.task)")
        assert found == [ids[i] for i in (18, 15, 12)], found  # order-010..019 whose i % 3 == 0
        assert "q=order-01" in page.url and "kind=mail" in page.url


def test_viewer_sees_no_action_forms(browser, q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    dead = _dead(q, w, 1)[0]
    blocked = q.enqueue("charge", effect="side_effect", queue="bulk")
    [c] = q.claim(w, queue="bulk")
    q.fail(w, c, "key revoked", block=True)
    with dashboard(browser, q) as page:
        login(page, token(q, "viewer", "vera"))
        assert page.locator("#queues form").count() == 0
        for path in ("/tasks", f"/tasks/{dead}", f"/tasks/{blocked.id}", "/inbox", "/workers", "/charts",
                     "/limits", "/fairness", "/redrive?action=redrive&status=dead"):
            page.goto(path)
            assert page.locator("main form[method=post]").count() == 0, path
            assert page.locator("input[name=ids]").count() == 0, path
        assert page.locator("header form[action='/logout']").count() == 1  # logging out is the one post


def test_workers_page_shows_leases_and_revocations(browser, q: leaseq.Queue) -> None:
    # busy heartbeats (as a runtime does); idle was registered by hand, with no heartbeat interval
    busy, idle = q.register_worker("busy", heartbeat_seconds=300, lease_seconds=900), q.register_worker("idle")
    gone = q.register_worker("gone")
    done = q.register_worker("done", heartbeat_seconds=300, lease_seconds=900)
    q.stop_worker(done, "deploying v2")
    tasks = [q.enqueue("crawl", {"n": i}, lease_seconds=600) for i in range(2)]
    claims = q.claim(busy, limit=2)
    q.revoke_worker(gone, by="test")
    with dashboard(browser, q) as page:
        login(page, token(q, "viewer", "vera"))
        page.goto("/workers")
        row = page.locator(f'#worker-table tr[data-worker="{busy.id}"]')
        for t, c in zip(tasks, claims):
            lease = row.locator(f'.lease[data-task="{c.task_id}"]')
            assert f"task {c.task_id}" in lease.inner_text() and "crawl" in lease.inner_text()
            assert f"generation {c.generation}" in lease.inner_text()
        assert "alive" in row.inner_text()
        assert "unknown" in page.inner_text(f'#worker-table tr[data-worker="{idle.id}"]')
        assert "deploying v2" in page.inner_text(f'#worker-table tr[data-worker="{done.id}"] .worker-state + div')
        assert "revoked" in page.inner_text(f'#worker-table tr[data-worker="{gone.id}"]')
        assert "none" in page.inner_text(f'#worker-table tr[data-worker="{idle.id}"]')
        # revoked workers are listed last
        order = page.locator("#worker-table tr[data-worker]").evaluate_all("rows => rows.map(r => r.dataset.worker)")
        assert order[-1] == gone.id
        assert page.locator("form.revoke_worker").count() == 0  # a viewer may not revoke
    with dashboard(browser, q) as page:
        login(page, token(q, "operator", "olga"))
        page.goto("/workers")
        assert page.locator(f'tr[data-worker="{gone.id}"] form.revoke_worker').count() == 0  # already revoked
        with page.expect_navigation(url=re.compile(r"/workers$")):
            page.click(f'tr[data-worker="{busy.id}"] form.revoke_worker button')
        assert f"worker {busy.id} revoked" in page.inner_text("[role=status]")
        # its leases ended at once; the next claim or sweep routes them
        assert page.inner_text(f'#worker-table tr[data-worker="{busy.id}"]').count("expired, not yet routed") == 2
    q.sweep()
    assert all(q.get(t.id).status == "queued" for t in tasks)
    [entry] = [e for e in auth.audit_log(q) if e["action"] == "revoke_worker" and e["target"] == f"worker:{busy.id}"]
    assert entry["detail"]["via"] == "dashboard" and entry["actor"].startswith("olga (operator token ")


def test_pause_label_and_charts(browser, q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    for kind in ("mail", "mail", "crawl"):
        q.enqueue(kind, queue="jobs")
    for c in q.claim(w, queue="jobs", limit=3):
        (q.fail(w, c, "bad input", retry=False) if c.task_id == 3 else q.complete(w, c))
    with dashboard(browser, q) as page:
        login(page, token(q, "operator", "olga"))
        state = page.locator('#queues tr[data-queue="jobs"] .state')
        assert state.inner_text() == "RUNNING"
        with page.expect_navigation():
            page.click('#queues tr[data-queue="jobs"] form.pause button')
        assert state.inner_text() == "PAUSED"
        assert q.claim(w, queue="jobs") == []
        page.goto("/charts?window=15m&by=kind")
        assert page.inner_text("#total-completed") == "(2 in the window)"
        assert page.inner_text("#total-failed") == "(1)"
        bars = page.locator("#chart-completed svg rect title").all_text_contents()
        assert any("mail: 2 completed" in b for b in bars), bars
        assert page.locator("#chart-durations svg rect").count() == 1  # one kind completed: mail
        page.select_option("select[name=by]", "queue")
        page.click("#chart-options button")
        assert "by=queue" in page.url and "jobs" in page.inner_text(".legend")


def test_a_screenshot_of_each_page(browser, q: leaseq.Queue, tmp_path: Path) -> None:
    w, w2 = q.register_worker("worker-a"), q.register_worker("worker-b")
    for i in range(12):
        q.enqueue(("summarize", "send_welcome", "crawl")[i % 3], {"doc": i}, queue=("default", "mail")[i % 2],
                  effect="side_effect" if i % 3 == 1 else "idempotent", lease_seconds=600)
    claims = q.claim(w, limit=4) + q.claim(w2, queue="mail", limit=4)
    for c in claims[:3]:
        q.complete(w, c, {"ok": True})
    q.fail(w2, claims[4], "provider down", retry=False)
    fx_claim = claims[7]  # a send_welcome (side_effect) task: its open intent needs a person
    q.begin_effect(w2, fx_claim, "email.send", key="welcome:7")
    q.release(w2, fx_claim, "worker stopped")
    assert q.get(fx_claim.task_id).status == "needs_reconciliation"
    gated = q.enqueue("refund", {"order": 7, "amount": 5}, queue="payments", effect="side_effect",
                      approval="required", lease_seconds=600)
    q.approve(gated.id, digest=q.approval(gated.id).digest, note="order 7 checked", by="alice")
    [paid] = q.claim(w, queue="payments")
    q.complete(w, paid, {"refund_id": "re_7"})
    q.pause("mail", by="test")
    # a limit with windows and a day's spend, and a queue served by fair share
    q.set_limit("llm-tokens", counts="units", per_minute=90_000, per_day=2_000_000, max_running=8)
    llm = q.enqueue("summarize", {"doc": 99}, queue="agents", limits=["llm-tokens"], units=4000)
    [call] = q.claim(w, queue="agents")
    q.consume(w, call, f"{llm.idempotency_key}:consume:0", "llm-tokens", 3600)
    q.complete(w, call, {"ok": True})
    for tenant, weight, n in (("acme", 1, 40), ("globex", 2, 12), ("initech", 1, 3)):
        q.enqueue_many("summarize", [{"doc": i} for i in range(n)], queue="agents", fairness_key=tenant,
                       fairness_weight=weight)
    for i, fair in enumerate(q.claim(w, queue="agents", limit=12)[:6]):  # spend split by tenant
        q.consume(w, fair, f"fair-{fair.task_id}:consume:0", "llm-tokens", 1500 + 700 * i)
    pages = {"login": "/login", "overview": "/", "tasks": "/tasks", "task": f"/tasks/{gated.id}",
             "inbox": "/inbox", "workers": "/workers", "charts": "/charts?window=15m",
             "redrive": "/redrive?action=redrive&status=dead&older_than=0s", "limits": "/limits",
             "fairness": "/fairness"}
    out = os.environ.get("LEASEQ_DASHBOARD_SCREENSHOTS")
    with dashboard(browser, q) as page:
        page.goto("/login")
        page.screenshot(path=str(tmp_path / "dashboard-login.png"), full_page=True)
        login(page, token(q, "operator", "olga"))
        for name, path in pages.items():
            if name == "login":
                continue
            page.goto(path)
            page.screenshot(path=str(tmp_path / f"dashboard-{name}.png"), full_page=True)
    for name in pages:
        shot = tmp_path / f"dashboard-{name}.png"
        width, height, distinct_rows = png_facts(shot)
        assert width >= 1280 and height >= 300 and distinct_rows > 30, (name, width, height, distinct_rows)
        if out and q.dialect == "sqlite":
            shutil.copy(shot, Path(out) / shot.name)


def test_a_queued_task_of_a_kind_no_worker_serves_is_flagged(browser, q: leaseq.Queue) -> None:
    q.register_worker("w", kinds=[{"kind": "crawl", "queue": "default", "effect": "read_only"}],
                      heartbeat_seconds=300, lease_seconds=900)
    served, typo = q.enqueue("crawl", {"n": 1}), q.enqueue("crawll", {"n": 1})
    with dashboard(browser, q) as page:
        login(page, token(q, "viewer", "vera"))
        page.goto("/tasks")
        assert page.locator("span.unserved").count() == 1
        assert "crawll" in page.inner_text("span.unserved >> xpath=..")
        page.goto(f"/tasks/{typo.id}")
        assert "no worker serves this kind" in page.inner_text("#task-title")
        page.goto(f"/tasks/{served.id}")
        assert "no worker serves this kind" not in page.inner_text("#task-title")

"""The dashboard of a queue-limited token: its queues only, on every route, on both backends.

A viewer or operator token limited to queue "alpha" logs in; the queue holds
tasks of every kind of state on "alpha" and on "bravo" (kinds, payloads, keys,
workers, a question, a limit and a paused queue all named after their queue).
Every dashboard route is fetched, found by enumerating the app's routes (so a
route added later without scoping fails here), and nothing of "bravo" may
appear: no name, kind, payload, key, worker, limit or task link, and a bravo
task's page is a 404 exactly as a task that does not exist. Every form action
against a bravo target is refused and changes nothing; the same token acts on
its own queue. A live stream sends no change for bravo's changes, and one for
alpha's. One check in a real browser.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import leaseq
from leaseq import auth, authz
from leaseq.worker import WorkerRuntime
from snapshots import snapshot
from worker.conftest import RunningWorker, wait_for

from .browser import browser, chromium, login, needs_browser  # noqa: F401  (fixtures)
from .conftest import serve
from .support import dashboard_login, page_csrf

#: Routes of the app that are not the dashboard's (the API, its docs, probes).
NOT_DASHBOARD = ("/v1/", "/openapi.json", "/docs", "/redoc", "/healthz", "/metrics")
QUESTION = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _asking_app() -> leaseq.App:
    app = leaseq.App(name="scope")

    @app.task("alpha_ask", queue="alpha")
    def alpha_ask(ctx: leaseq.TaskContext, secret: str) -> Any:
        return ctx.ask("alpha question?", QUESTION)

    @app.task("bravo_ask", queue="bravo")
    def bravo_ask(ctx: leaseq.TaskContext, secret: str) -> Any:
        return ctx.ask("bravo question about bravo-secret?", QUESTION)

    return app


def _populate(q: leaseq.Queue) -> dict[str, dict[str, Any]]:
    """On each of "alpha" and "bravo": a task queued, one awaiting approval, one completed, one dead
    (failed), one blocked, one running (a live lease), one asking a person; a worker serving it."""
    made: dict[str, dict[str, Any]] = {}
    for name in ("alpha", "bravo"):
        kind = f"{name}_kind"
        w = q.register_worker(f"{name}-worker", kinds=[{"kind": kind, "queue": name, "effect": "read_only"}])
        ids: dict[str, Any] = {"worker": w.id}
        ids["queued"] = q.enqueue(kind, {"secret": f"{name}-secret"}, queue=name,
                                  idempotency_key=f"{name}-key-queued", priority=-10).id
        ids["gated"] = q.enqueue(kind, {"secret": f"{name}-secret"}, queue=name, approval="required",
                                 idempotency_key=f"{name}-key-gated").id
        for outcome in ("completed", "dead", "blocked", "running"):
            task = q.enqueue(kind, {"secret": f"{name}-secret-{outcome}"}, queue=name, max_attempts=1,
                             idempotency_key=f"{name}-key-{outcome}", priority=10)
            [claim] = q.claim(w, queue=name, lease_seconds=300)
            assert claim.task_id == task.id
            if outcome == "completed":
                q.complete(w, claim, {"answer": f"{name}-result"})
            elif outcome == "dead":
                q.fail(w, claim, f"{name}-error", retry=False)
            elif outcome == "blocked":
                q.fail(w, claim, f"{name}-credential-error", block=True)
            ids[outcome] = task.id
        made[name] = ids
    q.pause("bravo")
    q.set_limit("bravo-limit", max_running=3)
    runtime = RunningWorker(WorkerRuntime(_asking_app(), q, queues=["alpha", "bravo"], poll_interval=0.05,
                                          grace=20))
    try:
        q.resume("bravo")
        for name in ("alpha", "bravo"):
            made[name]["asking"] = q.enqueue(f"{name}_ask", {"secret": f"{name}-secret-ask"}, queue=name).id
        for name in ("alpha", "bravo"):
            wait_for(lambda: q.get(made[name]["asking"]).status == "waiting", timeout=30)
    finally:
        runtime.stop()
    q.pause("bravo")
    return made


def _dashboard_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app but the API's, its docs and probes."""
    found = []
    for route in _flat(app.routes):
        path = getattr(route, "path", "")
        if path.startswith(NOT_DASHBOARD):
            continue
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                found.append((method, path))
    return found


def _flat(routes: list[Any]) -> Iterator[Any]:
    for route in routes:  # an included router (built lazily by newer FastAPI): its own routes
        inner = getattr(route, "original_router", None)
        yield from _flat(inner.routes) if inner is not None else [route]


def _fill(path: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)(:[^}]*)?\}", lambda m: values[m.group(1)], path)


def _assert_nothing_of_bravo(text: str, bravo: dict[str, Any], where: str, echoed: tuple[str, ...] = ()) -> None:
    """Nothing of bravo in ``text`` but the ``echoed`` strings (what the request itself named)."""
    for own in echoed:
        text = text.replace(own, "")
    assert "bravo" not in text.lower(), (where, text[max(0, text.lower().find("bravo") - 300):][:600])
    for key in ("queued", "gated", "completed", "dead", "blocked", "running", "asking"):
        task_id = bravo[key]
        for link in (f"/tasks/{task_id}\"", f"/tasks/{task_id}/", f"data-task=\"{task_id}\"",
                     f"value=\"{task_id}\"", f"task {task_id}<", f"#{task_id}<"):
            assert link not in text, (where, key, link)


def _pages(url: str, client: httpx.Client, app: Any, made: dict[str, dict[str, Any]]) -> Iterator[
        tuple[str, httpx.Response]]:
    """Every dashboard GET route, each with the alpha targets and with the query strings its page offers."""
    alpha = made["alpha"]
    get_routes = [path for method, path in _dashboard_routes(app) if method == "GET"]
    assert {"/", "/tasks", "/tasks/{task_id}", "/inbox", "/approvals", "/workers", "/charts", "/live"} <= \
        set(get_routes), get_routes
    for template in get_routes:
        targets = [{}] if "{" not in template else [
            {"task_id": str(alpha[k]), "name": "alpha", "worker_id": alpha["worker"]}
            for k in ("queued", "gated", "completed", "dead", "blocked", "running", "asking")]
        for values in targets:
            path = _fill(template, values)
            if path == "/live":
                continue  # streams: below
            queries = [""]
            if path == "/tasks":
                queries += ["?status=" + s for s in ("queued", "running", "completed", "dead", "blocked",
                                                     "awaiting_approval", "waiting")]
                queries += ["?q=key", "?limit=200", "?before=9999999"]
            if path == "/charts":
                queries += [f"?window={w}&by={b}" for w in ("15m", "24h") for b in ("kind", "queue")]
            for query in queries:
                yield path + query, client.get(path + query, headers={"Accept": "text/html"})


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_queue_limited_token_sees_only_its_queues_on_every_route(q: leaseq.Queue, dsn: str, role: str) -> None:
    made = _populate(q)
    alpha, bravo = made["alpha"], made["bravo"]
    with serve(q, live_interval=0.05, live_stream_seconds=2) as (url, app):
        secret = auth.create_token(q, name="limited", role=role, queues=["alpha"], read_payloads=True,
                                   created_by="test")[0]
        client = dashboard_login(url, secret)
        # pages refused by design: the limits (their keys span every queue) to any token limited
        # to queues, and the bulk actions by filter to a viewer; the refusal leaks nothing either
        refused = {"/limits"} | ({"/redrive"} if role == "viewer" else set())
        for where, resp in _pages(url, client, app, made):
            expected = 403 if where.split("?")[0] in refused else 200
            assert resp.status_code == expected, (where, resp.status_code, resp.text[:300])
            _assert_nothing_of_bravo(resp.text, bravo, where)
        # a filter naming another queue's kind: the form echoes it, and lists no task
        echoed = client.get("/tasks?kind=bravo_kind", headers={"Accept": "text/html"}).text
        assert "No tasks match." in echoed
        _assert_nothing_of_bravo(echoed, bravo, "?kind=bravo_kind", echoed=("bravo_kind",))
        # what it does see: its own queue's tasks, payloads and counts
        overview = client.get("/").text
        assert "alpha" in overview and "alpha-secret" in client.get(f"/tasks/{alpha['queued']}").text
        assert f"/tasks/{alpha['queued']}" in client.get("/tasks").text
        assert "alpha question?" in client.get("/inbox").text
        assert alpha["worker"] in client.get("/workers").text
        # a task of another queue: a 404, the same page as a task that does not exist
        missing = max(bravo.values(), key=lambda v: v if isinstance(v, int) else 0) + 1000
        nothing = client.get(f"/tasks/{missing}", headers={"Accept": "text/html"})
        assert nothing.status_code == 404
        for key in ("queued", "gated", "completed", "dead", "blocked", "running", "asking"):
            other = client.get(f"/tasks/{bravo[key]}", headers={"Accept": "text/html"})
            assert other.status_code == 404, key
            assert _unnamed(other.text, bravo[key]) == _unnamed(nothing.text, missing), key
        # the task list refuses a filter naming another queue, as the API does
        refused = client.get("/tasks?queue=bravo", headers={"Accept": "text/html"})
        assert refused.status_code == 403 and "may not use queue" in refused.text
        # live streams: another queue's task reads as one that does not exist; its changes send nothing
        for view in ("overview", "tasks", "workers", "inbox"):
            with client.stream("GET", f"/live?view={view}&v=0000000000000000", timeout=10) as resp:
                assert resp.status_code == 200, view
                lines = _first_event(resp.iter_lines())
                assert lines[-2] == "event: change", (view, lines)
        versions = {}
        for task_id in (bravo["queued"], missing):
            with client.stream("GET", f"/live?view=task&id={task_id}&v=0000000000000000", timeout=10) as resp:
                versions[task_id] = _first_event(resp.iter_lines())[-1]
        assert versions[bravo["queued"]] == versions[missing]
        _live_sees_only_alpha(client, q)


def _unnamed(text: str, task_id: int) -> str:
    return re.sub(rf"\b([Tt]ask) {task_id}(?!\d)", r"\1 N", text)


def _first_event(lines: Iterator[str]) -> list[str]:
    seen = []
    for line in lines:
        seen.append(line)
        if line.startswith("data: "):
            return seen
    return seen


def _live_sees_only_alpha(client: httpx.Client, q: leaseq.Queue) -> None:
    """The overview's stream: bravo's new task sends no change within many looks; alpha's does."""
    html = client.get("/", headers={"Accept": "text/html"}).text
    version = html.split('data-live-version="')[1][:16]
    with client.stream("GET", f"/live?view=overview&v={version}", timeout=10) as resp:
        changes: list[str] = []
        done = threading.Event()

        def read() -> None:
            try:
                for line in resp.iter_lines():
                    if line == "event: change":
                        changes.append(line)
                    if done.is_set():
                        return
            except httpx.HTTPError:
                assert done.is_set()  # the stream was closed under it, once the test was done with it

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        q.enqueue("bravo_kind", {"secret": "bravo-late"}, queue="bravo")
        time.sleep(0.6)  # a dozen looks at 0.05 s
        assert changes == [], "a change on another queue reached the stream"
        q.enqueue("alpha_kind", {"secret": "alpha-late"}, queue="alpha")
        wait_for(lambda: bool(changes), timeout=5)
        done.set()
    reader.join(5)


def _form_fields(action: str, digest: str) -> dict[str, str]:
    return {"reason": "no", "note": "checked", "outcome": "cancel", "digest": digest, "name": "go",
            "payload": "{}", "ok": "true", "ids": "", "back": "/"}


def test_a_queue_limited_operator_acts_only_on_its_queues_from_the_dashboard(q: leaseq.Queue, dsn: str) -> None:
    made = _populate(q)
    alpha, bravo = made["alpha"], made["bravo"]
    with serve(q) as (url, app):
        secret = auth.create_token(q, name="olga", role="operator", queues=["alpha"], read_payloads=True,
                                   created_by="test")[0]
        client = dashboard_login(url, secret)
        csrf = page_csrf(client, "/tasks")
        digest = q.approval(bravo["gated"]).digest
        before = _data(dsn)
        posts = 0
        for method, template in _dashboard_routes(app):
            if method != "POST" or template in ("/login", "/logout"):
                continue
            segments = [a.verb or a.name for a in authz.operator_actions("dashboard")] + ["answer", "signal"]
            for action in segments if "{action}" in template else [""]:
                for key in ("queued", "gated", "dead", "blocked", "running", "asking"):
                    path = _fill(template, {"task_id": str(bravo[key]), "name": "bravo",
                                            "worker_id": bravo["worker"], "action": action})
                    data = dict(_form_fields(action, digest), csrf=csrf, ids=str(bravo[key]))
                    resp = client.post(path, data=data, headers={"Accept": "text/html"})
                    posts += 1
                    assert resp.status_code in (303, 403, 404, 422), (path, resp.status_code, resp.text[:300])
                    if resp.status_code == 303:  # refused, back to the page with the reason
                        shown = client.get(resp.headers["location"], headers={"Accept": "text/html"})
                        assert "done" not in shown.text.split("flash", 1)[-1][:200] or "refused" in shown.text
                        _assert_nothing_of_bravo(shown.text, bravo, path, echoed=("queue &#39;bravo&#39;",))
        assert posts > 20
        assert _data(dsn) == before  # nothing cancelled, decided, answered, signalled, paused, revoked or audited
        # its own queue's tasks: the same forms act
        resp = client.post(f"/tasks/{alpha['queued']}/cancel", data={"csrf": csrf, "reason": "done"})
        assert resp.status_code == 303 and q.get(alpha["queued"]).status == "cancelled"
        resp = client.post("/queues/alpha/pause", data={"csrf": csrf})
        assert resp.status_code == 303 and {r["name"]: r["paused"] for r in q.queues()}["alpha"]
        assert q.get(bravo["queued"]).status == "queued"


def _data(dsn: str) -> dict[str, Any]:
    """Every table but the tokens' and the sessions' (whose last use each request records)."""
    return {name: rows for name, rows in snapshot(dsn).items() if name not in ("leaseq_tokens", "leaseq_sessions")}


@needs_browser
def test_a_queue_limited_token_in_the_browser(browser, q: leaseq.Queue) -> None:  # noqa: F811
    made = _populate(q)
    with serve(q) as (url, _app):
        context = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(10_000)
        try:
            login(page, auth.create_token(q, name="vic", role="viewer", queues=["alpha"], created_by="test")[0])
            for path in ("/", "/tasks", "/inbox", "/approvals", "/workers", "/charts"):
                page.goto(path)
                text = page.content()
                assert "bravo" not in text.lower(), path
            page.goto("/tasks")
            shown = {int(t) for t in page.locator("tr[data-task]").evaluate_all(
                "rows => rows.map(r => r.dataset.task)")}
            assert shown and shown <= {v for v in made["alpha"].values() if isinstance(v, int)}, shown
            page.goto(f"/tasks/{made['bravo']['queued']}")
            assert "does not exist" in page.content()
        finally:
            context.close()

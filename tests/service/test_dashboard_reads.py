"""The dashboard's reads and its bulk actions without a browser, on both backends.

Keyset paging walks every filtered task once, forwards and back, however many
tasks arrive meanwhile; a bulk action authorizes and audits each task on its
own and reports refusals per task; the live stream sends a change when the
page's data changes, stops when the session ends, and is absent when turned off.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

import leaseq
from leaseq import auth, authz
from leaseq.service import stats
from pg_modes import own_connection

from .conftest import Service, serve
from .support import dashboard_login, page_csrf, snapshot

ORIGIN = {"Sec-Fetch-Site": "same-origin"}


def _walk(queue: leaseq.Queue, /, **filters: str) -> tuple[list[int], list[int]]:
    """Every page's ids, following the older links, then the newer links back."""
    q = queue
    f = stats.TaskFilter.parse({**filters, "limit": "7"})
    pages, page = [], stats.task_page(q, f)
    while True:
        pages.append([t.id for t in page.tasks])
        if page.older is None:
            break
        page = stats.task_page(q, stats.TaskFilter.parse(_query(page.older)))
        q.enqueue("late", {"x": 1}, idempotency_key=f"late-{len(pages)}-{filters}")  # arrives meanwhile
    back = [[t.id for t in page.tasks]]
    while page.newer is not None:
        page = stats.task_page(q, stats.TaskFilter.parse(_query(page.newer)))
        back.append([t.id for t in page.tasks])
    return [i for p in pages for i in p], [i for p in reversed(back) for i in p]


def _query(url: str) -> dict[str, str]:
    return dict(httpx.URL(url).params)


def test_keyset_paging_visits_each_task_once_both_ways(q: leaseq.Queue) -> None:
    ids = [q.enqueue(("a", "b")[i % 2], {"i": i}, queue=("x", "y", "z")[i % 3], idempotency_key=f"k-{i:02d}").id
           for i in range(50)]
    forward, backward = _walk(q)
    assert forward == sorted(ids, reverse=True)
    # backward starts from the last page and ends at the newest: new tasks show up only there
    assert [i for i in backward if i in ids] == forward
    wanted = [i for n, i in enumerate(ids) if n % 2 == 1 and n % 3 == 2]  # kind b, queue z
    assert _walk(q, kind="b", queue="z")[0] == wanted[::-1]
    assert _walk(q, q="k-1")[0] == [ids[n] for n in range(19, 9, -1)]
    assert _walk(q, status="dead")[0] == []


@pytest.mark.parametrize("params, field", [
    ({"before": "abc"}, "before"), ({"before": "-5"}, "before"), ({"before": "0"}, "before"),
    ({"before": "1e3"}, "before"), ({"after": str(2**63)}, "after"), ({"before": "1", "after": "2"}, "after"),
    ({"limit": "100000"}, "limit"), ({"limit": "0"}, "limit"), ({"limit": "ten"}, "limit"),
    ({"limit": "9" * 400}, "limit"), ({"status": "bogus"}, "status"), ({"queue": "a b"}, "queue"),
    ({"q": "x" * 256}, "q"), ({"q": "a\x00b"}, "q"), ({"kind": "k" * 201}, "kind"), ({"sort": "id"}, "sort"),
])
def test_bad_list_parameters_are_a_clear_422(svc: Service, params: dict[str, str], field: str) -> None:
    svc.q.enqueue("job")
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    before = snapshot(svc.dsn)
    page = viewer.get("/tasks", params=params, headers={"Accept": "text/html"})
    assert page.status_code == 422 and f"{field}: " in page.text, page.text[-600:]
    api = viewer.get("/tasks", params=params)
    assert api.status_code == 422 and api.json()["error"]["field"] == field
    assert snapshot(svc.dsn) == before


def test_bulk_actions_report_each_task(q: leaseq.Queue, dsn: str) -> None:
    olga = auth.Principal(token_id="0123456789ab", name="olga", role="operator", queues=None, read_payloads=True)
    vera = auth.Principal(token_id="0123456789ac", name="vera", role="viewer", queues=None, read_payloads=False)
    w = q.register_worker("w")
    ids = [q.enqueue("job", {"i": i}).id for i in range(3)]
    for c in q.claim(w, limit=2):
        q.fail(w, c, "boom", retry=False)
    before = snapshot(dsn)
    with pytest.raises(auth.AccessDenied):
        authz.perform_many(q, vera, "requeue", ids, note="no")
    assert snapshot(dsn) == before
    with pytest.raises(ValueError, match="not a bulk action"):
        authz.perform_many(q, olga, "reconcile", ids, outcome="requeue", note="x")
    outcomes = authz.perform_many(q, olga, "requeue", [*ids, 10_000], via="test", note="retry them")
    assert [(o.target, o.error is None) for o in outcomes] == [(ids[0], True), (ids[1], True), (ids[2], False),
                                                              (10_000, False)]
    assert isinstance(outcomes[2].error, leaseq.InvalidTransition) and isinstance(outcomes[3].error, leaseq.NotFound)
    audited = [e for e in auth.audit_log(q) if e["action"] == "requeue"]
    assert sorted(e["target"] for e in audited) == [f"task:{ids[0]}", f"task:{ids[1]}"]
    assert all(e["detail"]["via"] == "test" and e["detail"].get("note") in (None, "retry them") for e in audited)


def test_bulk_posts_need_csrf_origin_the_role_and_sane_ids(svc: Service) -> None:
    q = svc.q
    w = q.register_worker("w")
    dead = [q.enqueue("job", {"i": i}).id for i in range(3)]
    for c in q.claim(w, limit=3):
        q.fail(w, c, "boom", retry=False)
    operator, viewer = dashboard_login(svc.url, svc.token("operator")), dashboard_login(svc.url, svc.token("viewer"))
    csrf = page_csrf(operator, "/tasks")
    ids = [str(i) for i in dead]
    before = snapshot(svc.dsn)
    refused = [
        (operator, "/bulk/requeue", {"ids": ids, "note": "x"}, ORIGIN, 403),  # no CSRF token
        (operator, "/bulk/requeue", {"ids": ids, "note": "x", "csrf": "0" * 64}, ORIGIN, 403),
        (operator, "/bulk/requeue", {"ids": ids, "note": "x", "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}, 403),
        (operator, "/bulk/requeue", {"ids": ids, "note": "x", "csrf": csrf}, {"Origin": "https://evil.example"}, 403),
        (viewer, "/bulk/requeue", {"ids": ids, "note": "x", "csrf": page_csrf(viewer, "/tasks")}, ORIGIN, 403),
        (operator, "/bulk/reconcile", {"ids": ids, "note": "x", "csrf": csrf}, ORIGIN, 404),  # not a bulk action
        (operator, "/bulk/pause", {"ids": ids, "csrf": csrf}, ORIGIN, 404),  # nor a task action
        (operator, f"/tasks/{dead[0]}/pause", {"csrf": csrf}, ORIGIN, 404),  # a queue action on a task route
        (operator, "/bulk/requeue", {"ids": [*ids, "7x"], "note": "x", "csrf": csrf}, ORIGIN, 422),
        (operator, "/bulk/requeue", {"ids": [*ids, "-1"], "note": "x", "csrf": csrf}, ORIGIN, 422),
        (operator, "/bulk/requeue", {"ids": [str(2**63)], "note": "x", "csrf": csrf}, ORIGIN, 422),
        (operator, "/bulk/requeue", {"ids": [str(i) for i in range(1, 202)], "csrf": csrf}, ORIGIN, 422),
        (operator, "/bulk/requeue", {"note": "nothing ticked", "csrf": csrf}, ORIGIN, 422),
        (operator, "/bulk/cancel", {"ids": ids, "note": "  ", "csrf": csrf}, ORIGIN, 422),  # cancel needs a reason
        (operator, "/bulk/requeue", {"ids": ids, "note": "x" * 10_001, "csrf": csrf}, ORIGIN, 422),
    ]
    for client, path, form, headers, status in refused:
        resp = client.post(path, data=form, headers=headers)
        assert resp.status_code == status, (path, form.get("ids", [])[:4], headers, resp.text[:300])
    assert snapshot(svc.dsn) == before
    ok = operator.post("/bulk/requeue", data={"ids": [*ids, ids[0]], "csrf": csrf, "back": "//evil.example"},
                       headers=ORIGIN)
    assert ok.status_code == 303 and ok.headers["location"] == "/"  # never off the service; no text in the URL
    assert "requeue: 3 of 3 tasks done" in operator.get("/").text
    assert [q.get(i).status for i in dead] == ["queued"] * 3  # the note's default, each once


def _events(lines: Iterator[str], until: str) -> list[str]:
    seen = []
    for line in lines:
        seen.append(line)
        if line.startswith(until):
            return seen
    return seen


def test_the_live_stream(q: leaseq.Queue, dsn: str) -> None:
    with serve(q, live_interval=0.05) as (url, _app):
        secret = auth.create_token(q, name="vera", role="viewer", created_by="test")[0]
        viewer = dashboard_login(url, secret)
        assert httpx.get(f"{url}/live?view=overview").status_code == 204  # no session: nothing to stream
        assert viewer.get("/live?view=calendar").status_code == 422
        assert viewer.get("/live?view=overview&v=zz").status_code == 422
        assert viewer.get("/live?view=tasks&before=x").status_code == 422
        assert viewer.get("/live?view=task&id=0").status_code == 422
        page = viewer.get("/tasks", headers={"Accept": "text/html"}).text
        version = page.split('data-live-version="')[1][:16]
        with viewer.stream("GET", f"/live?view=tasks&v={version}", timeout=10) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            threading.Timer(0.3, q.enqueue, ("job",)).start()
            stream = resp.iter_lines()
            lines = _events(stream, "data: ")
            assert "event: change" in lines and lines[-1] != f"data: {version}"
            auth.revoke_token(q, secret.split("_")[1], by="test")
            assert _events(stream, "data: ")[-2:] == ["event: end", "data: session ended"]
        # a stream opened after the session ended: 204 (EventSource stops), the cookie left alone
        late = viewer.get("/live?view=overview")
        assert late.status_code == 204 and "set-cookie" not in late.headers
    with serve(q, live_updates=False) as (url, _app):
        viewer = dashboard_login(url, auth.create_token(q, name="v", role="viewer", created_by="test")[0])
        assert viewer.get("/live?view=overview").status_code == 404
        assert httpx.get(f"{url}/static/live.js").status_code == 404
        assert "live.js" not in viewer.get("/").text


def test_chart_data_counts_by_kind_and_queue(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    for kind, queue in (("mail", "a"), ("mail", "b"), ("crawl", "a")):
        q.enqueue(kind, queue=queue)
    for queue in ("a", "b"):
        for c in q.claim(w, queue=queue, limit=2):
            if q.get(c.task_id).kind == "crawl":
                q.fail(w, c, "bad", retry=False)
            else:
                q.complete(w, c)
    by_kind = stats.chart_data(q, "15m", "kind")
    assert {k: sum(v) for k, v in by_kind["completed"].items()} == {"mail": 2}
    assert {k: sum(v) for k, v in by_kind["failed"].items()} == {"crawl": 1}
    assert by_kind["durations"]["mail"]["count"] == 2 and by_kind["durations"]["mail"]["max"] >= 0
    assert len(by_kind["minutes"]) == 15
    by_queue = stats.chart_data(q, "1h", "queue")
    assert {k: sum(v) for k, v in by_queue["completed"].items()} == {"a": 1, "b": 1}
    with pytest.raises(leaseq.InvalidInput, match="window"):
        stats.chart_window("1y")
    with pytest.raises(leaseq.InvalidInput, match="by"):
        stats.chart_grouping("worker")


def _age(dsn: str, sql_pg: str, sql_sqlite: str, *params: object) -> None:
    """Move recorded times back, as if what they record happened minutes ago."""
    if dsn.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            conn.execute(sql_sqlite, params)
        return
    with own_connection(dsn, autocommit=True) as conn:
        conn.execute(sql_pg, params)


def test_the_queue_depth_over_the_window_counts_what_waited_at_each_minutes_end(q: leaseq.Queue, dsn: str) -> None:
    """Three tasks made ten minutes ago; one claimed five minutes ago, one cancelled three
    minutes ago: 0 waiting before they were made, 3 after, then 2, then 1 (the overview's depth)."""
    w = q.register_worker("w")
    t1, t2, t3 = (q.enqueue("job", {"n": i}) for i in range(3))
    [claim] = q.claim(w)
    q.cancel(t2.id, reason="not needed")
    _age(dsn, "UPDATE leaseq_tasks SET created_at = now() - interval '600 s', available_at = now() - interval '600 s'",
         "UPDATE leaseq_tasks SET created_at = created_at - 600, available_at = available_at - 600")
    _age(dsn, "UPDATE leaseq_tasks SET claimed_at = now() - interval '300 s' WHERE id = %s",
         "UPDATE leaseq_tasks SET claimed_at = claimed_at - 300 WHERE id = ?", claim.task_id)
    _age(dsn, "UPDATE leaseq_tasks SET updated_at = now() - interval '180 s' WHERE id = %s",
         "UPDATE leaseq_tasks SET updated_at = updated_at - 180 WHERE id = ?", t2.id)
    depth = [sum(v[i] for v in stats.chart_data(q, "15m", "queue")["depth"].values()) for i in range(15)]
    assert claim.task_id == t1.id
    assert depth[:3] == [0, 0, 0] and depth[-1] == 1 and max(depth) == 3, depth
    assert depth.count(3) in (4, 5, 6) and depth.count(2) in (1, 2, 3), depth  # by whole minutes
    assert stats.chart_data(q, "15m", "kind")["depth"].keys() == {"job"}

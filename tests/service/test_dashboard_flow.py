"""The dashboard's limits and fair-share pages, on both backends: each limit's windows (what each
holds now of its total) and today's spend, in the overview's table and on the limits page, with
the spend per day over the last 7 days; and, for each queue that uses fairness keys, each key's
queued tasks, weight and share of the recent claims, the keys read bounded (the most queued)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import leaseq
from leaseq import auth, authz
from leaseq.service.dashboard_flow import fair_share
from leaseq.service.stats import OTHER_TENANT, SPEND_TENANTS

from .browser import browser, chromium, login, needs_browser, page  # noqa: F401  (fixtures)
from .conftest import Service
from .support import dashboard_login, move_spend_back, settle_by_tenant

DAY = 86400


def _spend(q: leaseq.Queue, units: int) -> None:
    w = q.register_worker("w")
    task = q.enqueue("call", limits=["tok"], units=10)
    [c] = q.claim(w, kinds=["call"])
    q.consume(w, c, f"{task.idempotency_key}:consume:0", "tok", units)
    q.complete(w, c, None)


def _cells(html: str, row: str) -> list[str]:
    """The texts of one table row's cells (tags stripped)."""
    found = re.search(rf'<tr {row}>(.*?)</tr>', html, re.S)
    assert found, row
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)]


def test_each_limit_shows_its_windows_and_the_spend_per_day(svc: Service) -> None:
    q = svc.q
    q.set_limit("tok", counts="units", per_minute=100, per_day=1000, max_running=3)
    q.set_limit("plain", per_second=2, burst=5)
    _spend(q, 7)
    move_spend_back(svc.dsn, 2)
    _spend(q, 5)
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    overview = viewer.get("/").text
    tok = _cells(overview, 'data-limit="tok"')
    assert tok[8] == "minute 12 / 100 · day 12 / 1000"  # what the two calls used (the rest of each reservation came back)
    assert tok[9] == "5"  # settled today
    assert _cells(overview, 'data-limit="plain"')[8:] == ["-", "0"]
    assert 'href="/limits"' in overview
    page = viewer.get("/limits")
    assert page.status_code == 200
    assert _cells(page.text, 'data-limit="tok"') == tok
    today = q.now().date()
    days = re.findall(r'<td class="num[^"]*" data-day="([0-9-]+)">', page.text)
    assert len(days) == 7 and days[0] == today.isoformat()
    spend = _cells(page.text, 'data-spend="tok"')
    assert spend == ["tok", "5", "0", "7", "0", "0", "0", "0", "12"]
    assert [r["units"] for r in q.limit_spend("tok")] == [5, 7]  # what leaseq limits spend says


def test_the_limits_page_splits_each_days_spend_by_tenant_bounded(svc: Service) -> None:
    """Each day's spend per limit split by tenant, the largest first: the SPEND_TENANTS tenants
    that settled the most, exactly, and the rest summed under "(other)" (as /metrics has it)."""
    q = svc.q
    spend = {f"t{n:03d}": n + 1 for n in range(SPEND_TENANTS + 10)} | {"": 100}
    settle_by_tenant(q, "tok", spend)
    html = dashboard_login(svc.url, svc.token("viewer")).get("/limits").text
    [(day, row)] = re.findall(r'<tr data-tenants="tok" data-on="([0-9-]+)">(.*?)</tr>', html, re.S)
    assert day == q.now().date().isoformat()
    shown = [(t, int(n)) for t, n in re.findall(r'data-tenant="([^"]*)">[^<]*<b class="units">(\d+)</b>', row)]
    ranked = sorted(spend.items(), key=lambda kv: -kv[1])
    assert len(shown) == SPEND_TENANTS + 1
    assert shown[:SPEND_TENANTS] == ranked[:SPEND_TENANTS]  # exact, the largest first ("" the largest)
    assert shown[-1] == (OTHER_TENANT, sum(n for _, n in ranked[SPEND_TENANTS:]))  # 1 + ... + 10
    assert _cells(html, 'data-tenants="tok" data-on="' + day + '"')[:3] == ["today", "tok", str(sum(spend.values()))]
    assert _cells(html, 'data-spend="tok"')[1] == str(sum(spend.values()))
    assert len(q.limit_spend("tok")[0]["tenants"]) == len(spend)  # leaseq limits spend: every tenant


def test_the_limits_page_without_limits(svc: Service) -> None:
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    html = viewer.get("/limits").text
    assert "No limit is set" in html and "Nothing settled in these days" in html


def _fair_queue(q: leaseq.Queue) -> leaseq.Worker:
    w = q.register_worker("w")
    q.enqueue_many("job", [{"n": n} for n in range(30)], queue="fq", fairness_key="acme")
    q.enqueue_many("job", [{"n": n} for n in range(5)], queue="fq", fairness_key="pro", fairness_weight=2)
    q.enqueue("job", queue="fq")
    assert len(q.claim(w, queue="fq", limit=9)) == 9
    q.enqueue("job", queue="plain")  # a queue without keys: not shown
    q.claim(w, queue="plain")
    return w


def test_each_fairness_key_shows_its_queue_weight_and_share(svc: Service) -> None:
    q = svc.q
    _fair_queue(q)
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    html = viewer.get("/fairness").text
    assert 'data-queue="fq"' in html and 'data-queue="plain"' not in html
    assert "9 claims in the last 60 minutes" in html
    # pro (weight 2) was served twice as often as acme while both had tasks; then acme alone
    assert _cells(html, 'data-key="acme"') == ["acme", "27", "1", "3", "33%"]
    assert _cells(html, 'data-key="pro"') == ["pro", "0", "2", "5", "56%"]
    assert _cells(html, 'data-key=""') == ["no key", "0", "1", "1", "11%"]
    assert "<form" not in html.split("</header>", 1)[1]  # a read-only page


def test_a_queue_limited_token_sees_the_keys_of_its_queues_only(svc: Service) -> None:
    """What the page shows a token limited to some queues (the dashboard admits such tokens once
    every page honours the scope): its queues' keys, and no limits, which span every queue."""
    q = svc.q
    _fair_queue(q)
    q.enqueue("job", queue="other", fairness_key="acme")
    everything = fair_share(q, auth.verify_token(q, svc.token("viewer")))
    assert [e["name"] for e in everything] == ["fq", "other"]
    scoped = auth.verify_token(q, svc.token("viewer", queues=["other"]))
    [mine] = fair_share(q, scoped)
    assert mine["name"] == "other" and [k["key"] for k in mine["keys"]] == ["acme"]
    with pytest.raises(auth.AccessDenied):
        authz.authorize(scoped, "read")  # the limits page's check


def test_the_fair_share_page_reads_a_bounded_number_of_keys(svc: Service) -> None:
    q = svc.q
    for n in range(55):
        q.enqueue_many("job", [{"n": i} for i in range(1 + n // 10)], queue="many", fairness_key=f"k{n:02d}")
    viewer = dashboard_login(svc.url, svc.token("viewer"))
    html = viewer.get("/fairness").text
    keys = re.findall(r'<tr data-key="(k\d+)">', html)
    assert len(keys) == 50 and keys[:10] == [f"k{n}" for n in range(50, 55)] + [f"k{n}" for n in range(40, 45)]
    assert not {f"k{n:02d}" for n in range(5, 10)} & set(keys)  # five of the fewest queued are left out


def test_no_fairness_keys(svc: Service) -> None:
    svc.q.enqueue("job")
    html = dashboard_login(svc.url, svc.token("viewer")).get("/fairness").text
    assert 'id="no-fairness"' in html


@needs_browser
def test_the_limits_and_fair_share_pages_in_a_browser(page: Any, svc: Service) -> None:
    q = svc.q
    q.set_limit("tok", counts="units", per_hour=500)
    _spend(q, 40)
    settle_by_tenant(q, "calls", {"globex": 12, "acme": 30})
    _fair_queue(q)
    login(page, svc.token("viewer", "vera"))
    assert page.inner_text('#limits tr[data-limit="tok"] [data-window="hour"]') == "hour 40 / 500"
    page.click("header >> text=Limits")
    page.wait_for_url(re.compile(r"/limits$"))
    assert page.inner_text('#spend tr[data-spend="tok"] .total') == "40"
    assert page.inner_text('#spend-tenants tr[data-tenants="tok"] .tenants') == "no key 40"
    calls = page.locator('#spend-tenants tr[data-tenants="calls"]')
    assert calls.locator(".tenants").inner_text() == "acme 30 · globex 12"
    assert calls.locator('[data-tenant="globex"] .units').inner_text() == "12"
    page.click("header >> text=Fair share")
    page.wait_for_url(re.compile(r"/fairness$"))
    row = page.locator('[data-queue="fq"] tr[data-key="pro"]')
    assert row.locator(".weight").inner_text() == "2" and row.locator(".share").inner_text() == "56%"

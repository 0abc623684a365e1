"""``POST /v1/tasks`` under concurrent requests: each request gets its own task, and on
PostgreSQL the requests the service receives together share transactions (one commit and one
NOTIFY for several: leaseq.engine.shared), as the library's concurrent ``AsyncQueue.enqueue``
calls do. The rows one transaction writes carry its id (``xmin``)."""

from __future__ import annotations

import asyncio

import httpx

from pg_modes import own_connection

from .conftest import Service


def test_concurrent_enqueue_requests_each_get_their_task_and_share_commits(svc: Service) -> None:
    token = svc.token("operator", all_queues=True)

    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=30, limits=httpx.Limits(max_connections=40)) as client:
            return await asyncio.gather(*(client.post("/v1/tasks", json={"kind": "job", "payload": {"i": i}})
                                          for i in range(200)))

    answers = asyncio.run(flood())
    assert [r.status_code for r in answers] == [201] * 200, [r.text for r in answers if r.status_code != 201][:3]
    ids = [r.json()["id"] for r in answers]
    assert len(set(ids)) == 200
    assert sorted(svc.q.get(i).payload["i"] for i in ids) == list(range(200))
    if svc.q.dialect == "postgres":
        with own_connection(svc.dsn) as conn:
            row = conn.execute("SELECT count(DISTINCT xmin::text) FROM leaseq_tasks WHERE id = ANY(%s)",
                               (ids,)).fetchone()
        assert row is not None and row[0] < 200, row

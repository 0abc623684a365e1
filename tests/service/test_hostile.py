"""Hostile input: a clear 4xx JSON error naming the problem, and nothing written.

Every table is snapshotted before and after each request on both backends.
"""

from __future__ import annotations

import json
from typing import Any

from .conftest import Service
from .support import snapshot

MiB = 1024 * 1024
EVIL_QUEUE = "default'; DROP TABLE leaseq_tasks; --"


def _setup(svc: Service) -> tuple[Any, Any, str, int]:
    worker = svc.http(svc.token("worker", all_queues=True))
    operator = svc.http(svc.token("operator"))
    wid = worker.post("/v1/workers", json={"name": "w"}).json()["id"]
    task = svc.q.enqueue("job", {"n": 1})
    operator.get("/v1/queues").raise_for_status()  # first use is recorded once; later requests write nothing
    return worker, operator, wid, task.id


def test_hostile_requests_are_refused_and_change_nothing(svc: Service) -> None:
    worker, operator, wid, task_id = _setup(svc)
    J = {"Content-Type": "application/json"}
    cases = [
        # (client, method, path, kwargs, status, code, field)
        (operator, "POST", "/v1/tasks", {"content": b'{"kind": "x", "payload": "' + b"a" * (3 * MiB) + b'"}',
                                         "headers": J}, 413, "too_large", None),
        (operator, "POST", "/v1/tasks", {"content": (b"a" * (256 * 1024) for _ in range(12)), "headers": J},
         413, "too_large", None),
        (operator, "POST", "/v1/tasks", {"content": b'{"kind": "x", ', "headers": J}, 400, "invalid", "body"),
        (operator, "POST", "/v1/tasks", {"content": b"[" * 50_000 + b"]" * 50_000, "headers": J},
         400, "invalid", "body"),
        (operator, "POST", "/v1/tasks", {"json": ["kind", "x"]}, 422, "invalid", "body"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "owner": "me"}}, 422, "invalid", "owner"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "priority": "9"}}, 422, "invalid", "priority"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "priority": 2**40}}, 422, "invalid", "priority"),
        (operator, "POST", "/v1/tasks", {"content": b'{"kind": "x", "delay": NaN}', "headers": J},
         422, "invalid", "delay"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "effect": "explosive"}}, 422, "invalid", "effect"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "payload": "p" * (MiB + 10)}},
         422, "invalid", "payload"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "payload": {"note": "a\x00b"}}},
         422, "invalid", "payload.note"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "a\x00b"}}, 422, "invalid", "kind"),
        (operator, "POST", "/v1/tasks", {"content": b'{"kind": "a\\ud800b"}', "headers": J}, 422, "invalid", "kind"),
        (operator, "POST", "/v1/tasks", {"content": b'{"kind": "x", "payload": {"\\udfff": 1}}', "headers": J},
         422, "invalid", "payload.\\udfff"),
        (operator, "POST", "/v1/tasks", {"json": {"kind": "x", "queue": EVIL_QUEUE}}, 422, "invalid", "queue"),
        (operator, "GET", "/v1/tasks", {"params": {"queue": "x' OR '1'='1"}}, 422, "invalid", "queue"),
        (operator, "GET", "/v1/tasks", {"params": {"status": "running' --"}}, 422, "invalid", "status"),
        (operator, "POST", "/v1/queues/a'b;--/pause", {}, 422, "invalid", "path.name"),
        (worker, "POST", f"/v1/workers/{wid}/claim", {"json": {"queue": EVIL_QUEUE}}, 422, "invalid", "queue"),
        (worker, "POST", f"/v1/workers/{wid}/claim", {"json": {"limit": "5"}}, 422, "invalid", "limit"),
        (worker, "POST", f"/v1/workers/{wid}/claim", {"json": {"limit": 0}}, 422, "invalid", "limit"),
        (worker, "POST", f"/v1/workers/{wid}/claim", {"json": {"lease_seconds": -1}}, 422, "invalid",
         "lease_seconds"),
        (worker, "POST", f"/v1/workers/{wid}/tasks/{task_id}/complete", {"json": {"generation": "1"}},
         422, "invalid", "generation"),
        (worker, "POST", f"/v1/workers/{wid}/tasks/{task_id}/complete", {"json": {"generation": 10**30}},
         422, "invalid", "generation"),
        (worker, "POST", f"/v1/workers/{wid}/tasks/{task_id}/complete", {"json": {}}, 422, "invalid", "generation"),
        (worker, "POST", f"/v1/workers/{wid}/tasks/{task_id}/fail", {"json": {"generation": 1, "error": "x",
                                                                               "retry": "yes"}},
         422, "invalid", "retry"),
        (worker, "POST", f"/v1/workers/{wid}/renew", {"json": {"leases": [{"task_id": -4, "generation": 1}]}},
         422, "invalid", "leases.0.task_id"),
        (worker, "POST", "/v1/workers", {"json": {"name": "bad\nname"}}, 422, "invalid", "name"),
        # encoded slashes are decoded before routing: such paths match no route at all
        (worker, "POST", "/v1/workers/..%2F..%2Fetc%2Fpasswd/claim", {"json": {}}, 404, "not_found", None),
        (worker, "POST", f"/v1/workers/{wid}/tasks/..%2F1/complete", {"json": {"generation": 1}}, 404,
         "not_found", None),
        (operator, "GET", "/v1/tasks/..%2F..%2Fetc%2Fpasswd", {}, 404, "not_found", None),
        (worker, "POST", "/v1/workers/..%5C..%5Cwin.ini/claim", {"json": {}}, 422, "invalid", "path.worker_id"),
        (operator, "GET", "/v1/tasks/%2e%2e", {}, 422, "invalid", "path.task_id"),
        (operator, "GET", "/v1/tasks/../../etc/passwd", {}, 404, "not_found", None),
        (operator, "GET", "/v1/tasks/0", {}, 422, "invalid", "path.task_id"),
        (operator, "GET", "/v1/tasks/99999999999999999999999", {}, 422, "invalid", "path.task_id"),
        (operator, "GET", f"/v1/tasks/{task_id + 1000}", {}, 404, "not_found", None),
        (operator, "DELETE", "/v1/tasks/1", {}, 405, "method_not_allowed", None),
        (operator, "POST", f"/v1/tasks/{task_id}/reconcile", {"json": {"outcome": "completed"}}, 422, "invalid",
         "note"),
        (operator, "POST", f"/v1/tasks/{task_id}/reconcile", {"json": {"outcome": "delete", "note": "n"}},
         422, "invalid", "outcome"),
        (operator, "POST", f"/v1/tasks/{task_id}/cancel", {"json": {"reason": "   "}}, 422, "invalid", "reason"),
    ]
    before = snapshot(svc.dsn)
    wrong = []
    for client, method, path, kwargs, status, code, field in cases:
        resp = client.request(method, path, **kwargs)
        try:
            err = resp.json()["error"]
        except (ValueError, KeyError, TypeError):
            wrong.append(f"{method} {path}: not a JSON error: {resp.status_code} {resp.text[:200]}")
            continue
        if resp.status_code != status or err["code"] != code or (field and err.get("field") != field):
            wrong.append(f"{method} {path[:60]}: got {resp.status_code} {json.dumps(err)[:300]}")
        elif not err["message"]:
            wrong.append(f"{method} {path[:60]}: empty message")
    assert wrong == [], "\n".join(wrong)
    assert snapshot(svc.dsn) == before
    assert svc.http(svc.token("viewer")).get(f"/v1/tasks/{task_id}").status_code == 200  # still serving




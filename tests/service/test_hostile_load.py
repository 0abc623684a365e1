"""One hostile token cannot degrade `leaseq serve` on PostgreSQL: the issue's load, in CI.

A ``leaseq serve`` process serves a queue while a client process, with one
worker token, keeps 1,000 waits (``GET /v1/tasks/{id}/wait`` on a task its
worker holds) and 1,000 long-poll claims open at once, asking again as soon
as each is answered (after ``Retry-After`` when refused). It speaks raw
HTTP/1.1, as an attacker would. Meanwhile an honest remote worker, with a
token of its own, drains 2,000 tasks that this test enqueues at 100 a
second. Checked:

* the honest drain finishes, and its pickup (the database's claim time
  minus its enqueue time) stays under 50 ms at the median and at the 99th
  percentile (the issue's target; see P99_LIMIT), measured once the flood's first wave
  (every request opened at once) has been answered; the test is marked
  serial, so nothing else of the suite runs beside it;
* the service's connections to the server (pg_stat_activity, by the
  ``application_name`` its DSN gives) never exceed its pools (the blocking
  one and the event loop's asyncio one, ``max_size`` each) plus one: the
  listener that every wait shares;
* the hostile token was refused (429) past its cap, and no request of its
  failed.

``LEASEQ_LOAD_HOSTILE``, ``LEASEQ_LOAD_TASKS`` and ``LEASEQ_LOAD_P99_MS``
change the load and the bound (a slower machine than CI's).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import leaseq
from leaseq import auth
from leaseq.client import RemoteQueue
from pg_modes import own_connection

#: the hostile token's waits, and as many long-poll claims (the issue's load: 1,000 of each)
HOSTILE = int(os.environ.get("LEASEQ_LOAD_HOSTILE", "1000"))
#: the tasks the honest worker drains
TASKS = int(os.environ.get("LEASEQ_LOAD_TASKS", "2000"))
#: the honest pickup's median and its 99th percentile must stay under these (seconds): the
#: issue's target, a p99 of 50 ms. A run used to meet, about every other time, one stall of 1.1 to
#: 2.4 s (p99 1.1-2.4 s, median 5 to 9 ms): the hundred waits the first wave had opened all ended
#: together at the service's wait_limit, were all asked again at once, and their first
#: transactions queued for the asyncio pool ahead of the honest worker's. Each waiting request's
#: cap is drawn from its last fifth now, and the pool serves the tokens waiting in turn (issue 29):
#: on a quiet machine three runs in a row gave a p99 of 4.6, 2.8 and 3.7 ms. The test is marked
#: serial, as the bound needs the machine: a machine shared with other loads starves the service
#: of CPU for seconds (LEASEQ_LOAD_P99_MS and LEASEQ_LOAD_MEDIAN_MS raise the bounds there).
MEDIAN_LIMIT = float(os.environ.get("LEASEQ_LOAD_MEDIAN_MS", "50")) / 1000
P99_LIMIT = float(os.environ.get("LEASEQ_LOAD_P99_MS", "50")) / 1000
#: tasks enqueued a second
RATE = 100.0
#: the PostgreSQL pool size of the service (leaseq.connect's default): blocking and asyncio pools each
POOL = 10

_HOSTILE_CLIENT = textwrap.dedent('''
    # Raw HTTP/1.1 over asyncio streams, one kept-alive connection per request loop: what an
    # attacker would send, at a fraction of an HTTP library's CPU (the test shares two cores).
    import asyncio, json, sys
    from urllib.parse import urlsplit

    url, token, worker_id, task_id, n, seconds = sys.argv[1:7]
    n, seconds = int(n), float(seconds)
    where = urlsplit(url)
    counts = {"answered": 0, "refused": 0, "errors": 0}
    kinds = {}

    async def ask(reader, writer, method, path, body):
        writer.write((f"{method} {path} HTTP/1.1\\r\\nHost: {where.netloc}\\r\\n"
                      f"Authorization: Bearer {token}\\r\\nContent-Type: application/json\\r\\n"
                      f"Content-Length: {len(body)}\\r\\n\\r\\n").encode() + body)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        length, retry = 0, 1.0
        while (line := await reader.readline()) not in (b"\\r\\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "retry-after":
                retry = float(value)
        await reader.readexactly(length)
        return status, retry

    async def keep_asking(method, path, body=b""):
        loop = asyncio.get_running_loop()
        end, conn = loop.time() + seconds, None
        while loop.time() < end:
            try:
                if conn is None:
                    conn = await asyncio.open_connection(where.hostname, where.port)
                status, retry = await ask(*conn, method, path, body)
            except (OSError, EOFError, ValueError, IndexError) as exc:
                counts["errors"] += 1
                kind = f"{type(exc).__name__}: {exc}"[:120]
                kinds[kind] = kinds.get(kind, 0) + 1
                conn = None
                await asyncio.sleep(0.1)
                continue
            if status == 429:
                counts["refused"] += 1
                await asyncio.sleep(retry)
            elif status >= 400:
                counts["errors"] += 1
                kinds[f"HTTP {status}"] = kinds.get(f"HTTP {status}", 0) + 1
            else:
                counts["answered"] += 1

    async def report():
        while True:
            print(json.dumps({**counts, "kinds": kinds}), flush=True)
            await asyncio.sleep(0.5)

    async def main():
        asyncio.get_running_loop().create_task(report())
        claim = json.dumps({"queue": "bait", "wait": 30}).encode()
        jobs = [keep_asking("GET", f"/v1/tasks/{task_id}/wait?timeout=25") for _ in range(n)]
        jobs += [keep_asking("POST", f"/v1/workers/{worker_id}/claim", claim) for _ in range(n)]
        await asyncio.gather(*jobs)

    asyncio.run(main())
''')


def _serve(dsn: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "leaseq.cli", "serve", "--port", "0", "--log-level", "warning",
                             "--sweep-every", "0"],
                            env={**os.environ, "LEASEQ_DSN": dsn}, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline() if proc.stderr else ""
    m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"leaseq serve did not start: {line}")
    return proc, m.group(1)


def _until_flooded(hostile: subprocess.Popen[str], answered: int, timeout: float = 60.0) -> str:
    """Read the hostile client's reports until ``answered`` of its requests had an answer
    (a refusal counts); returns what it said meanwhile."""
    said, deadline = "", time.monotonic() + timeout
    assert hostile.stdout is not None
    while time.monotonic() < deadline:
        line = hostile.stdout.readline()
        if not line:
            break
        said += line
        counts = json.loads(line)
        if counts["refused"] + counts["answered"] + counts["errors"] >= answered:
            return said
    raise AssertionError(f"the hostile client's first wave was not answered in {timeout:.0f} s: {said[-300:]}")


@pytest.fixture
def q(pg_schema_dsn: str) -> Iterator[leaseq.Queue]:
    """PostgreSQL's connection count is what is bounded here; SQLite's waits are capped the
    same way (test_wait_caps)."""
    queue = leaseq.connect(pg_schema_dsn)
    queue.migrate()
    yield queue
    queue.close()


@pytest.mark.serial
def test_one_hostile_token_cannot_degrade_the_service(q: leaseq.Queue, pg_schema_dsn: str) -> None:
    dsn = pg_schema_dsn
    app_name = f"leaseq-load-{uuid.uuid4().hex[:8]}"
    served_dsn = f"{dsn}{'&' if '?' in dsn else '?'}application_name={app_name}"
    proc, url = _serve(served_dsn)
    most = 0
    sampling = threading.Event()

    def sample() -> None:
        nonlocal most
        with own_connection(dsn, autocommit=True) as conn:
            while not sampling.is_set():
                n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                 (app_name,)).fetchone()[0]
                most = max(most, n)
                time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    p99 = median = float("inf")
    pickup = "no pickups"
    hostile = None
    said = ""
    first_wave = float("nan")
    try:
        hostile_token, _ = auth.create_token(q, name="hostile", role="worker", created_by="test", all_queues=True)
        honest_token, _ = auth.create_token(q, name="honest", role="worker", created_by="test", all_queues=True)
        bad = RemoteQueue(url, hostile_token, timeout=10)
        bad_worker = bad.register_worker("hostile")
        bait = q.enqueue("bait", {}, queue="bait", lease_seconds=300)
        assert bad.claim(bad_worker, queue="bait")  # held by its worker: its token may wait on it
        sampler.start()
        hostile = subprocess.Popen([sys.executable, "-c", _HOSTILE_CLIENT, url, hostile_token, bad_worker.id,
                                    str(bait.id), str(HOSTILE), "600"], stdout=subprocess.PIPE, text=True)

        pickups: list[float] = []
        errors: list[BaseException] = []

        def drain() -> None:  # one of two claim loops: one waits while the other completes
            honest = RemoteQueue(url, honest_token, timeout=40)
            worker = honest.register_worker("honest")
            try:
                while len(pickups) < TASKS:
                    claims = honest.claim(worker, limit=10, wait=5)
                    for c in claims:
                        pickups.append((c.task.claimed_at - c.task.created_at).total_seconds())
                    if claims:
                        honest.complete_many(worker, [(c, None) for c in claims])
            except BaseException as exc:
                errors.append(exc)
            finally:
                honest.close()

        # The flood's first wave, every request opened at once, is answered (its excess refused)
        # before the measure starts: from then on the hostile client keeps a hundred requests
        # waiting and sends the rest again whenever told to retry.
        flood_started = time.monotonic()
        said = _until_flooded(hostile, 2 * HOSTILE - 100)
        first_wave = time.monotonic() - flood_started
        drainers = [threading.Thread(target=drain, daemon=True) for _ in range(2)]
        for d in drainers:
            d.start()
        started = time.monotonic()
        for i in range(TASKS):  # a steady stream, straight into the database (the NOTIFY wakes the workers)
            q.enqueue("job", {"i": i})
            time.sleep(max(0.0, started + (i + 1) / RATE - time.monotonic()))
        for d in drainers:
            d.join(30)
        assert not errors, errors
        assert len(pickups) >= TASKS, f"the honest workers drained {len(pickups)} of {TASKS}"
        pickups.sort()
        p99 = pickups[int(len(pickups) * 0.99) - 1]
        median = pickups[len(pickups) // 2]
        pickup = f"pickup p99 {p99 * 1000:.1f} ms (median {median * 1000:.1f} ms)"
    finally:
        sampling.set()
        if hostile is not None:
            hostile.kill()
            said += hostile.communicate()[0]
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # waits still open: nothing more to check in the process
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    sampler.join(5)
    assert 0 < most <= 2 * POOL + 1, f"the service held {most} connections (pools {2 * POOL}, plus one listener)"
    counts = json.loads(said.strip().splitlines()[-1])
    assert counts["refused"] > 0 and counts["errors"] == 0, counts  # past its cap of waits, refused
    print(f"\nhonest {pickup} under {HOSTILE} hostile waits and claims (their first wave answered in "
          f"{first_wave:.1f} s)")
    assert p99 < P99_LIMIT, pickup
    assert median < MEDIAN_LIMIT, pickup

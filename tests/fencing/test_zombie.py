"""The design note's operational test in its strongest form, with real processes.

Worker A (a real ``leaseq worker`` process) claims a task, records the
intent of ``orders.pay`` and holds its signed action token. A is frozen
(SIGSTOP) past its lease; B recovers the task (generation 2) and has not
written anything to the shop yet. A is resumed (SIGCONT) and calls the shop
(a real uvicorn process running the README's middleware set-up) with the
token it holds. The shop must refuse it:

- ``bound``: the token's expiry is the lease deadline it was issued under,
  so with the documented 1-second leeway it has expired: 403 ``expired``.
- ``exact``: a leeway so large the token alone would pass, but the store
  asks the queue in its own transaction: generation 1 no longer holds the
  lease: 409.
- ``control``: the same large leeway without the exact check: the zombie's
  call is accepted. This is the window the two mechanisms close, shown
  open, so the two tests above cannot pass for another reason.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import leaseq
from leaseq.fencing import ActionSigner, FencedStore, fencing_token

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0
KEYS = "k1:" + base64.b64encode(bytes(range(32))).decode()


def wait_for(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.TransportError:  # the server is not listening yet
            value = None
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["bound", "exact", "control"])
def test_a_resumed_zombie_is_refused_before_the_new_holder_wrote(dsn: str, tmp_path: Path, mode: str):
    q = leaseq.connect(dsn, signer=ActionSigner.from_env(environ={"LEASEQ_ACTION_KEYS": KEYS}))
    q.migrate()
    with FencedStore(dsn) as shop_store:
        shop_store.migrate()
        with shop_store.transaction() as conn:
            conn.execute("CREATE TABLE payments (order_id INTEGER NOT NULL, token TEXT NOT NULL)")
    port = free_port()
    env = dict(os.environ, LEASEQ_DSN=dsn, SHOP_DSN=dsn, LEASEQ_ACTION_KEYS=KEYS, FAULT_DIR=str(tmp_path),
               SHOP_URL=f"http://127.0.0.1:{port}", LEASE=str(LEASE),
               LEASE_CHECK="same" if mode == "exact" else "", LEEWAY="1" if mode == "bound" else "60",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    stop_b = threading.Event()
    try:
        start("shop", "uvicorn", "tests.fencing.zombie_apps:shop", "--host", "127.0.0.1", "--port", str(port),
              "--log-level", "warning")
        task = q.enqueue("pay_order", {"order_id": 17}, effect="idempotent", lease_seconds=LEASE,
                         actions=["orders.pay"], resources=["order:17"])
        a = start("a", "leaseq.cli.main", "worker", "tests.fencing.zombie_apps:worker", "--name", "a",
                  "--concurrency", "1", "--poll-interval", "0.05")
        token = wait_for(lambda: (tmp_path / "token-1").exists() and (tmp_path / "token-1").read_text(),
                         "A's action token")
        os.kill(a.pid, signal.SIGSTOP)
        claims = ActionSigner.from_env(environ={"LEASEQ_ACTION_KEYS": KEYS}).verify(token, now=0)
        assert (claims.task_id, claims.generation, claims.resource) == (task.id, 1, "order:17")
        assert claims.expires_at <= q.get(task.id).lease_expires_at.timestamp() + 0.001  # never past the lease

        # A's lease runs out (the database's clock) and B recovers the task.
        wait_for(lambda: q.get(task.id).lease_expires_at < q.now(), "A's lease to expire")
        b = q.register_worker("b")
        [claim_b] = wait_for(lambda: q.claim(b), "B's claim")
        assert (claim_b.task_id, claim_b.generation) == (task.id, 2)
        # B's lease is the task's (a claim cannot ask for a longer one): B keeps it by renewing
        renewing = threading.Thread(target=_renew_until, args=(q, b, claim_b, stop_b), daemon=True)
        renewing.start()
        time.sleep(1.5)  # past the token's expiry plus the documented 1 s leeway

        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200, "the shop")
        (tmp_path / "go-1").write_text("")
        os.kill(a.pid, signal.SIGCONT)
        status, _, body = wait_for(lambda: (tmp_path / "status-1").exists() and (tmp_path / "status-1").read_text(),
                                   "A's call to the shop").partition(" ")
        with FencedStore(dsn) as shop_store, shop_store.transaction() as conn:
            paid = [tuple(r) for r in conn.execute("SELECT order_id, token FROM payments").fetchall()]
        if mode == "control":
            assert status == "200" and paid == [(17, fencing_token(task.id, 1, claims.epoch))], body
            return
        assert paid == [], f"the zombie's write went through: {status} {body}"
        if mode == "bound":
            assert status == "403" and '"reason": "expired"' in body, body
        else:
            assert status == "409" and "no longer holds its lease" in body, body
        # B, the holder, still gets through (with a fresh token of its own).
        fx = q.begin_effect(b, claim_b, "orders.pay", "pay:17", resource="order:17")
        ok = httpx.post(f"http://127.0.0.1:{port}/orders/17/pay", headers={"Leaseq-Action-Token": fx.token})
        assert ok.status_code == 200, ok.text
    finally:
        stop_b.set()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(10)
        q.close()


def _renew_until(q, worker, claim, stop: threading.Event) -> None:
    """Heartbeats ``claim`` every 0.2 s until ``stop`` is set."""
    while not stop.wait(0.2):
        q.heartbeat(worker, claim)

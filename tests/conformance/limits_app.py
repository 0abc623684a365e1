"""The app two `leaseq worker` processes run in the limits race test: every task
names the limit "shared" and holds its lease a little while."""

from __future__ import annotations

import time

import leaseq

app = leaseq.App()  # $LEASEQ_DSN


@app.task("limited", limits=["shared"])
def limited(ctx: leaseq.TaskContext, n: int) -> int:
    time.sleep(0.05)
    return n

"""Handlers for the worker liveness tests, run by `leaseq worker tests.worker.liveness_app:app`."""

from __future__ import annotations

import leaseq

app = leaseq.App()  # $LEASEQ_DSN


@app.task("summarize", effect="side_effect", actions=["mail.send"], lease_seconds=5.0)
def summarize(ctx: leaseq.TaskContext, doc_id: int, tags: list[str] | None = None) -> dict:
    """Takes a document id (an int) and optional tags."""
    return {"doc_id": doc_id}

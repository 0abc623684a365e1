"""Token operations are engine operations: the blocking functions of :mod:`leaseq.access`
drive them, and asyncio code awaits the same operations (on the event loop on PostgreSQL,
in a thread on SQLite), with the same checks and the same audit entries, on both backends."""

from __future__ import annotations

import asyncio

import pytest

import leaseq
from leaseq import access
from leaseq.engine import adrive


def test_a_token_created_and_revoked_by_the_awaited_operations_is_the_blocking_ones(q: leaseq.Queue) -> None:
    async def scenario() -> None:
        token, record = await adrive(q.store, access.creating_token(name="agent", role="worker", queues=["mail"],
                                                                    created_by="ops"))
        principal = await access.averify_token(q, token)
        assert (principal.token_id, principal.role, principal.queues) == (record["id"], "worker",
                                                                          frozenset({"mail"}))
        worker = q.register_worker("w", token_id=record["id"])
        assert access.worker_token(q, worker.id) == record["id"]
        revoked = await adrive(q.store, access.revoking_token(q.settings, record["id"], by="ops"))
        assert revoked == [worker.id]
        with pytest.raises(access.Unauthorized, match="was revoked"):
            await access.averify_token(q, token)
        # bad input is refused naming the field, before anything is written
        with pytest.raises(leaseq.InvalidInput, match="queues"):
            await adrive(q.store, access.creating_token(name="agent2", role="worker"))

    asyncio.run(scenario())
    entries = [(e["action"], e["actor"]) for e in access.audit_log(q)]
    assert entries[:2] == [("token_revoked", "ops"), ("token_created", "ops")]
    assert [t["name"] for t in access.list_tokens(q)] == ["agent"]

"""The renewer stops when it is cancelled, whatever its call was doing at that moment.

The worker's shutdown cancels the renewer and waits for it. A renewer that
survived its cancellation kept the shutdown waiting forever: on Python 3.11,
``asyncio.wait_for`` answers with the result of a call that ended in the same
turn as the cancellation and drops the cancellation (a full CI run once hung
600 s this way). Here the renewal call itself cancels the renewer as it
returns, the real queue answering: the cancellation must reach the renewer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import leaseq
from leaseq.worker.context import TaskContext
from leaseq.worker.renewer import Renewer


def test_a_renewer_cancelled_as_its_call_returns_stops(q: leaseq.Queue) -> None:
    worker = q.register_worker("w")
    q.enqueue("job")
    [claim] = q.claim(worker)
    ctx = TaskContext(q, worker, claim, logging.LoggerAdapter(logging.getLogger("test"), {}))
    held = {ctx.key: ctx}
    counted: list[int] = []

    async def run() -> None:
        renewer: Renewer | None = None
        runner: asyncio.Task[None] | None = None

        class CancelledAsItReturns:
            async def renew_leases(self, *args: Any) -> Any:
                answer = q.renew_leases(*args)  # the real renewal, on the real queue
                assert runner is not None
                runner.cancel()  # the shutdown's cancellation arrives as the call returns
                return answer

        renewer = Renewer(CancelledAsItReturns(), worker, held, {ctx.key}, lambda *a, **k: None,
                          lambda: counted.append(1))
        runner = asyncio.create_task(renewer.renew_now())
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(runner), 10)

    asyncio.run(run())
    assert not counted  # cancelled before it took the answer in

"""RemoteQueue names what it is: an HTTP transport, not a database dialect."""

from __future__ import annotations

import pytest

from leaseq.client import RemoteQueue


def test_remote_queue_names_its_transport_and_deprecates_dialect() -> None:
    rq = RemoteQueue("http://127.0.0.1:9", "token")  # opens no connection until a call
    try:
        assert rq.transport == RemoteQueue.transport == "http"
        with pytest.warns(DeprecationWarning, match="RemoteQueue.transport"):
            assert rq.dialect == "http"
    finally:
        rq.close()

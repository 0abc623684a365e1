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


@pytest.mark.parametrize("base", ["http://127.0.0.1:9", "http://127.0.0.1:9/", "https://example.test/leaseq/",
                                  "http://[::1]:8765/a%20b"])
@pytest.mark.parametrize("path", ["/v1/workers", "/v1/workers/w-1%2F2/complete", "/v1/tasks/7/effects/3/response"])
def test_the_urls_it_keeps_are_the_ones_httpx_would_build(base: str, path: str) -> None:
    # RemoteQueue parses each path's absolute URL once instead of letting httpx join
    # the relative path to base_url on every request: the two must be the same URL.
    rq = RemoteQueue(base, "token")
    try:
        assert rq._url(path) == rq._client.build_request("POST", path).url
        assert rq._url(path) is rq._url(path)
    finally:
        rq.close()

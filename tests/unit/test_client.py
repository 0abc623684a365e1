"""RemoteQueue names what it is: an HTTP transport, not a database dialect."""

from __future__ import annotations

import httpx
import pytest

from leaseq.client import RemoteQueue, _proxy_for


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
def test_the_urls_it_keeps_are_the_base_joined_with_the_path(base: str, path: str) -> None:
    # RemoteQueue joins each path to the base once and keeps the URL; httpx's joining of a
    # relative path to a base URL is the reference (a path prefix kept, quoting untouched).
    rq = RemoteQueue(base, "token")
    try:
        assert httpx.URL(rq._url(path)) == httpx.Client(base_url=base).build_request("POST", path).url
        assert rq._url(path) is rq._url(path)
    finally:
        rq.close()


def test_proxies_are_taken_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "internal.test")
    assert _proxy_for("http://leaseq.test:8765") == "http://proxy.test:3128"
    assert _proxy_for("http://internal.test:8765") is None
    assert _proxy_for("https://leaseq.test") is None  # no HTTPS_PROXY
    monkeypatch.delenv("HTTP_PROXY")
    assert _proxy_for("http://leaseq.test:8765") is None


def test_plain_http_carries_the_token_only_to_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading

    from leaseq import ConfigError

    monkeypatch.delenv("LEASEQ_ALLOW_INSECURE_HTTP", raising=False)
    for url in ("http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9", "https://leaseq.example.test"):
        RemoteQueue(url, "token").close()
    for url in ("http://leaseq.example.test:8765", "http://10.1.2.3:8765", "http://127.0.0.1.nip.io:8765"):
        with pytest.raises(ConfigError, match="clear text"):
            RemoteQueue(url, "token")
    # opted in, loudly: by the parameter or the environment
    RemoteQueue("http://10.1.2.3:8765", "token", allow_insecure_http=True).close()
    monkeypatch.setenv("LEASEQ_ALLOW_INSECURE_HTTP", "1")
    RemoteQueue("http://10.1.2.3:8765", "token").close()
    monkeypatch.delenv("LEASEQ_ALLOW_INSECURE_HTTP")

    # refused before any byte leaves: a listener on a non-loopback name of this host hears nothing
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    heard: list[bytes] = []

    def accept() -> None:
        try:
            conn, _ = listener.accept()
            heard.append(conn.recv(4096))
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    port = listener.getsockname()[1]
    with pytest.raises(ConfigError):
        RemoteQueue(f"http://127.0.0.1.nip.io:{port}", "lq_secret").whoami()
    thread.join()
    listener.close()
    assert heard == []

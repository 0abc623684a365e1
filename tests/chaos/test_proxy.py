"""The loopback fault proxy against a real echo server: pass, delay, black hole, drop."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from leaseq_chaos.proxy import FaultyProxy


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    faulty = FaultyProxy(server.server_address[1])
    yield faulty
    faulty.close()
    server.shutdown()
    server.server_close()


def connect(proxy: FaultyProxy, link: str = "w0") -> socket.socket:
    port = proxy.add_link(link) if link not in proxy.links else proxy.links[link].port
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> tuple[bytes, float]:
    started = time.monotonic()
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got, time.monotonic() - started


def test_bytes_pass_and_links_listen_on_loopback_only(proxy):
    sock = connect(proxy)
    assert roundtrip(sock)[0] == b"ping"
    assert proxy.links["w0"].server.sockets[0].getsockname()[0] == "127.0.0.1"


def test_delay_holds_each_chunk(proxy):
    sock = connect(proxy)
    proxy.set_delay("w0", 0.3)
    data, took = roundtrip(sock)
    assert data == b"ping" and took >= 0.55  # delayed on the way there and back
    proxy.heal("w0")
    assert roundtrip(sock)[1] < 0.25


def test_black_hole_delivers_nothing_until_healed_then_everything(proxy):
    sock = connect(proxy)
    proxy.blackhole("w0")
    sock.sendall(b"late")
    sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        sock.recv(10)
    proxy.heal("w0")
    sock.settimeout(5)
    assert sock.recv(10) == b"late"


def test_drop_closes_only_that_links_connections(proxy):
    victim, bystander = connect(proxy, "w0"), connect(proxy, "w1")
    assert roundtrip(victim)[0] == roundtrip(bystander)[0] == b"ping"  # both fully connected
    assert proxy.drop("w0") == 1
    victim.settimeout(5)
    try:
        closed = victim.recv(10) == b""
    except ConnectionResetError:
        closed = True
    assert closed
    assert roundtrip(bystander)[0] == b"ping"
    assert roundtrip(connect(proxy, "w0"))[0] == b"ping"  # new connections are let through again


def test_lost_replies_forward_requests_discard_answers_and_healing_closes_those_connections(proxy):
    received: list[bytes] = []

    class Recording(socketserver.BaseRequestHandler):
        def handle(self):
            while data := self.request.recv(4096):
                received.append(data)
                self.request.sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Recording)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    faulty = FaultyProxy(server.server_address[1])
    try:
        sock = connect(faulty)
        faulty.lose_replies("w0")
        sock.sendall(b"commit")
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(10)  # the answer never comes...
        assert received == [b"commit"]  # ...although the request arrived
        faulty.heal("w0")
        sock.settimeout(5)
        try:
            closed = sock.recv(10) == b""
        except ConnectionResetError:
            closed = True
        assert closed, "a connection that lost an answer must not carry on"
        assert roundtrip(connect(faulty))[0] == b"ping"  # new connections flow normally
    finally:
        faulty.close()
        server.shutdown()
        server.server_close()

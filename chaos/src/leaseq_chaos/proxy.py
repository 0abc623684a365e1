"""A loopback TCP proxy that can drop, delay or black-hole a worker's connections.

Each worker reaches PostgreSQL through a listener of its own (a *link*), so
a network fault can hit one worker and leave the others alone. The proxy
runs an asyncio loop on a thread; every control method is thread-safe.
It listens on 127.0.0.1 only.

* ``drop``: close every connection of the link at once (the worker sees a
  broken connection; its pool reconnects).
* ``delay``: hold every chunk, in both directions, for some seconds before
  passing it on (order is kept).
* ``blackhole``: pass nothing in either direction until ``heal``; what was
  sent meanwhile is delivered late, after healing, like a network that
  stalled rather than failed. A late lease renewal or completion arrives at
  a database that has moved on.
* ``lose_replies``: pass what the worker sends, discard what the server
  answers: a renewal or completion commits, and its answer never comes.
  Healing closes the connections that lost bytes (their protocol streams
  are broken); new ones flow normally.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class Link:
    """One listener and the connections made through it."""

    name: str
    port: int = 0
    delay: float = 0.0
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    server: asyncio.AbstractServer | None = None
    connections: int = 0
    #: discard the server's answers (until heal)
    replies_lost: bool = False
    #: client-side writers of the connections that lost an answer
    broken: set[asyncio.StreamWriter] = field(default_factory=set)


class FaultyProxy:
    """Loopback listeners forwarding to ``upstream_port`` on 127.0.0.1, with injectable faults."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.links: dict[str, Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leaseq-chaos-proxy", daemon=True)
        self._thread.start()

    def _call(self, coro_or_fn, timeout: float = 10.0):
        if asyncio.iscoroutine(coro_or_fn):
            return asyncio.run_coroutine_threadsafe(coro_or_fn, self._loop).result(timeout)

        async def wrap():
            return coro_or_fn()
        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(timeout)

    # -- set-up ----------------------------------------------------------------

    def add_link(self, name: str) -> int:
        """Start a listener for ``name`` on a free loopback port; returns the port."""
        return self._call(self._add_link(name))

    async def _add_link(self, name: str) -> int:
        link = Link(name)
        link.flowing.set()
        link.server = await asyncio.start_server(lambda r, w: self._serve(link, r, w), "127.0.0.1", 0)
        link.port = link.server.sockets[0].getsockname()[1]
        self.links[name] = link
        return link.port

    def close(self) -> None:
        """Close every listener and connection and stop the loop."""
        async def shut() -> None:
            for link in self.links.values():
                link.flowing.set()
                if link.server is not None:
                    link.server.close()
                self._drop_now(link)
        try:
            self._call(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # -- faults -------------------------------------------------------------------

    def drop(self, name: str) -> int:
        """Close every current connection of link ``name``; returns how many."""
        return self._call(lambda: self._drop_now(self.links[name]))

    def set_delay(self, name: str, seconds: float) -> None:
        """Delay every chunk through link ``name`` by ``seconds`` (0 turns it off)."""
        self._call(lambda: setattr(self.links[name], "delay", max(0.0, float(seconds))))

    def blackhole(self, name: str) -> None:
        """Stop passing bytes through link ``name`` until :meth:`heal`."""
        self._call(lambda: self.links[name].flowing.clear())

    def lose_replies(self, name: str) -> None:
        """Forward what link ``name``'s clients send, discard the server's answers, until :meth:`heal`."""
        self._call(lambda: setattr(self.links[name], "replies_lost", True))

    def heal(self, name: str) -> None:
        """Undo ``delay``, ``blackhole`` and ``lose_replies`` on link ``name`` (closing the
        connections whose answers were discarded)."""
        def undo() -> None:
            link = self.links[name]
            link.delay = 0.0
            link.replies_lost = False
            for w in link.broken:
                w.transport.abort()
            link.broken.clear()
            link.flowing.set()
        self._call(undo)

    def heal_all(self) -> None:
        """Heal every link."""
        for name in list(self.links):
            self.heal(name)

    @staticmethod
    def _drop_now(link: Link) -> int:
        writers = list(link.writers)
        for w in writers:
            w.transport.abort()
        link.writers.clear()
        return len(writers) // 2

    # -- forwarding -------------------------------------------------------------------

    async def _serve(self, link: Link, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5)
        except (OSError, asyncio.TimeoutError):
            client_w.transport.abort()  # the server is down (restarting): refuse like it would
            return
        link.connections += 1
        link.writers.update((client_w, up_w))
        pumps = [asyncio.create_task(self._pump(link, client_r, up_w)),
                 asyncio.create_task(self._pump(link, up_r, client_w, replies=True))]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        link.broken.discard(client_w)
        for w in (client_w, up_w):
            link.writers.discard(w)
            w.transport.abort()

    @staticmethod
    async def _pump(link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    replies: bool = False) -> None:
        try:
            while True:
                await link.flowing.wait()
                data = await reader.read(65536)
                if not data:
                    return
                if link.delay:
                    await asyncio.sleep(link.delay)
                await link.flowing.wait()  # a black hole opened while we read: hold the bytes
                if replies and link.replies_lost:
                    link.broken.add(writer)  # the answer is gone; the stream cannot be trusted again
                    continue
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            return

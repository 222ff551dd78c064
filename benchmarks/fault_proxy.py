"""A TCP proxy that breaks the network on purpose: what `gieok bench chaos` puts between the
gieok processes and PostgreSQL / Redis for its network faults (bench/chaos_faults.py).

One `FaultProxy` listens on a loopback port and forwards every connection, both ways, to one
upstream (a host and port, or a unix socket such as pgserver's). A process is pointed at it by
its URL (`proxied_url`). The controls, callable from any thread:

- `delay(ms, jitter_ms)`: every chunk the upstream sends is held `ms` ± `jitter_ms` before it is
  forwarded (the order kept, as TCP keeps it): each round trip gains that latency. `delay(0)`
  ends it.
- `drop_midway(window_s)`: each connection open now that receives a response within the window
  gets the first half of it, then both sides are closed — the client sees its connection end in
  the middle of an answer, after the server may have carried the command out.
- `reset()`: every open connection is reset (SO_LINGER 0, then close: an RST to both sides).
- `cut(pid)` / `heal(pid)`: a partition of one process. Its connections (found by their port:
  on loopback the proxy can ask which process owns the other end) stop flowing both ways — what
  they send is held, as the network would hold it, and arrives once healed — and so do the
  connections it opens meanwhile. Every other process's connections go on as before. One port
  serves every process, so the serve workers, which share one URL, can be cut off one at a time.

The proxy runs its own asyncio loop in a daemon thread (`FaultProxies`, one loop for several).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["FaultProxies", "FaultProxy", "Upstream", "proxied_url", "upstream_of"]

Upstream = tuple[str, int] | str  # (host, port), or the path of a unix socket
CHUNK = 65536
CONTROL_TIMEOUT_S = 10.0
T = TypeVar("T")


def upstream_of(url: str) -> Upstream:
    """Where a postgresql:// or redis:// URL connects: a (host, port), or a unix socket path
    (libpq's `?host=/dir`, the socket being `/dir/.s.PGSQL.<port>`)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    postgres = parts.scheme.startswith("postgres")
    port = int(query.get("port") or parts.port or (5432 if postgres else 6379))
    host = query.get("host") or parts.hostname or "127.0.0.1"
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}" if postgres else host
    return (host, port)


def proxied_url(url: str, port: int) -> str:
    """`url` connecting to 127.0.0.1:`port` instead (its user, password, database and other
    parameters kept)."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    kept = [(n, v) for n, v in parse_qsl(parts.query, keep_blank_values=True) if n not in ("host", "port")]
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}", query=urlencode(kept)))


def _ports_of(pid: int, port: int) -> set[int]:
    """The local ports of `pid`'s TCP connections to 127.0.0.1:`port`."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp4")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in connections if c.raddr and c.raddr.port == port}


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Link:
    """One proxied connection."""

    peer_port: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    drop_armed: bool = False
    dropped: bool = False

    def __post_init__(self) -> None:
        self.flowing.set()

    def abort(self, rst: bool = False) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _rst(writer) if rst else writer.transport.abort()


class FaultProxy:
    """One listening port in front of one upstream (module docstring). Made by `FaultProxies.add`."""

    def __init__(self, name: str, upstream: Upstream, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.upstream = upstream
        self.port = 0
        self.connections = 0  # accepted in all
        self._loop = loop
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._delay_s = 0.0
        self._jitter_s = 0.0
        self._cut: set[int] = set()  # pids
        self._rng = random.Random(0)

    # -- the controls (any thread) -------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    def delay(self, ms: float, jitter_ms: float = 0.0) -> None:
        """Hold each chunk the upstream sends `ms` ± `jitter_ms` (0: no delay)."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError("delay and jitter are >= 0")

        def apply() -> None:
            self._delay_s, self._jitter_s = ms / 1000, jitter_ms / 1000

        self._loop.call_soon_threadsafe(apply)

    def drop_midway(self, window_s: float = 1.5) -> int:
        """Arm every open connection to end half-way through its next response within
        `window_s`; returns how many did."""

        async def arm() -> list[_Link]:
            armed = list(self._links)
            for link in armed:
                link.drop_armed = True
            return armed

        armed = self._call(arm())
        time.sleep(window_s)

        async def disarm() -> int:
            for link in armed:
                link.drop_armed = False
            return sum(1 for link in armed if link.dropped)

        return self._call(disarm())

    def reset(self) -> int:
        """RST every open connection, both sides; returns how many."""

        async def reset_all() -> int:
            links = list(self._links)
            for link in links:
                link.abort(rst=True)
            return len(links)

        return self._call(reset_all())

    def cut(self, pid: int) -> int:
        """Partition process `pid` from the upstream: its connections, open and new, stop flowing
        until `heal`. Returns how many open connections were cut."""

        async def cut_off() -> int:
            self._cut.add(pid)
            ports = await asyncio.to_thread(_ports_of, pid, self.port)
            cut = [link for link in self._links if link.peer_port in ports]
            for link in cut:
                link.flowing.clear()
            return len(cut)

        return self._call(cut_off())

    def heal(self, pid: int | None = None) -> None:
        """End the partition of `pid` (None: of every process)."""

        async def heal_all() -> None:
            self._cut.difference_update({pid} if pid is not None else set(self._cut))
            if not self._cut:
                for link in self._links:
                    link.flowing.set()
                return
            held = set().union(*[await asyncio.to_thread(_ports_of, p, self.port) for p in self._cut])
            for link in self._links:
                if link.peer_port not in held:
                    link.flowing.set()

        self._call(heal_all())

    def open_connections(self) -> int:
        async def count() -> int:
            return len(self._links)

        return self._call(count())

    # -- the loop side -------------------------------------------------------------------------
    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer_port = int(client.get_extra_info("peername")[1])
        link = _Link(peer_port, client)
        self._links.add(link)  # before any wait: a `cut` meanwhile finds it
        if self._cut:  # a cut-off process's new connection is held too
            for pid in list(self._cut):
                if peer_port in await asyncio.to_thread(_ports_of, pid, self.port):
                    link.flowing.clear()
                    break
        try:
            if isinstance(self.upstream, str):
                upstream_reader, upstream = await asyncio.open_unix_connection(self.upstream)
            else:
                upstream_reader, upstream = await asyncio.open_connection(*self.upstream)
        except OSError:
            self._links.discard(link)
            _rst(client)  # the nearest a proxy gets to "connection refused"
            return
        link.upstream = upstream
        try:
            await asyncio.gather(self._pump(link, client_reader, upstream, answers=False),
                                 self._pump(link, upstream_reader, client, answers=True))
        finally:
            self._links.discard(link)
            link.abort()

    async def _pump(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    answers: bool) -> None:
        """Forward one direction: a reader that keeps reading (so a held or delayed chunk does not
        stop the next from arriving) and a writer that sends each chunk when it is due."""
        chunks: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            due = 0.0
            try:
                while data := await reader.read(CHUNK):
                    now = self._loop.time()
                    held = 0.0
                    if answers and self._delay_s > 0:
                        held = max(0.0, self._delay_s + self._rng.uniform(-self._jitter_s, self._jitter_s))
                    due = max(due, now + held)  # jitter never reorders: TCP does not
                    chunks.put_nowait((due, data))
            except OSError:
                pass
            finally:
                chunks.put_nowait(None)

        async def write() -> None:
            while (item := await chunks.get()) is not None:
                due, data = item
                if due > self._loop.time():
                    await asyncio.sleep(due - self._loop.time())
                await link.flowing.wait()
                if answers and link.drop_armed:
                    writer.write(data[:max(1, len(data) // 2)])
                    with contextlib.suppress(OSError, ConnectionError):
                        await writer.drain()
                    link.dropped = True
                    link.abort()
                    return
                writer.write(data)
                await writer.drain()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        except (OSError, ConnectionError):
            pass
        finally:
            link.abort()  # one direction ended: the connection is over (neither protocol half-closes)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await reading


class FaultProxies:
    """A loop thread and the proxies on it; a context manager (`close()` stops them all)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxies: dict[str, FaultProxy] = {}

    def add(self, name: str, upstream: Upstream) -> FaultProxy:
        proxy = FaultProxy(name, upstream, self._loop)
        asyncio.run_coroutine_threadsafe(proxy.listen(), self._loop).result(CONTROL_TIMEOUT_S)
        self.proxies[name] = proxy
        return proxy

    def __iter__(self) -> Any:
        return iter(self.proxies.values())

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def close_all() -> None:
            for proxy in self.proxies.values():
                await proxy.aclose()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(CONTROL_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CONTROL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> FaultProxies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""What the client's tests run against: a real `gieok serve` on a free loopback port (warm:
`/readyz` answered 200) — or its app in a thread of the test's process (`InProcessServer`) —,
keys made by the real `gieok keys create --json` on its `--db`, and a
tiny loopback proxy in front of it that drops connections or answers in the server's place —
real sockets and real HTTP bytes, so the client's retries are tested as they run."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from cli_runner import gieok

GIEOK = [sys.executable, "-m", "gieok.cli"]


@functools.cache
def probe() -> httpx.Client:
    """One client for every wait on a server's /readyz or /healthz: each new httpx client builds an
    SSL context (the CA bundle read: ~40 ms of CPU, even for http://), so a loop of `httpx.get`
    every 0.05-0.2 s spent more CPU than the server it waited for (8 % of the suite's CPU in a py-spy
    of the whole run). Thread-safe; a request's `timeout=` still applies."""
    return httpx.Client(timeout=2)


def wait_ready(url: str, gone: Callable[[], str | None], not_ready: Callable[[], str], seconds: float = 180) -> None:
    """Until `url`/readyz answers 200 (warm), for up to `seconds` (generous: a busy machine starts
    `--workers 2` slowly). `gone()` says why the server cannot come any more (None while it may);
    `not_ready()` what to say when the time is up."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (why := gone()) is not None:
            raise RuntimeError(why)
        try:
            if probe().get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{not_ready()} in {seconds:g} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The environment without the developer's GIEOK_* (no key, no settings leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def create_key_with_id(db: Path, tenant: str = "default", role: str = "write") -> tuple[str, int]:
    """A key made by the real `gieok keys create --json` on `db` (run in this process: a fresh
    interpreter would add ~2.4 s a key and test nothing more), and its id."""
    done = gieok("keys", "create", "--tenant", tenant, "--role", role, "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    return str(made["key"]), int(made["id"])


def create_key(db: Path, tenant: str = "default", role: str = "write") -> str:
    return create_key_with_id(db, tenant, role)[0]


class LiveServer:
    """`gieok serve --db db …` on a port (a free one unless given), started and waited on until warm
    (/readyz). Each start logs to a file of its own, so a restart on the same database keeps both logs."""

    def __init__(self, db: Path, *extra: str, port: int | None = None) -> None:
        self.db = db
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = db.with_name(f"{db.stem}-{self.port}-{time.monotonic_ns()}.log")
        with self.log_path.open("wb") as sink:
            self.process = subprocess.Popen([*GIEOK, "serve", "--db", str(db), "--port", str(self.port), *extra],
                                            stdout=sink, stderr=subprocess.STDOUT, env=clean_env(), cwd=db.parent)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self) -> None:
        wait_ready(self.url, lambda: None if self.process.poll() is None else f"gieok serve exited: {self.log}",
                   lambda: f"gieok serve was not ready: {self.log}")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 60 s; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return int(self.process.returncode)


class InProcessServer:
    """`gieok serve`'s own app — the same start-up (`PendingApp`: warming, `/readyz`), routes and
    MCP endpoint — served by uvicorn on a free loopback port, in a thread of this process. For the
    tests of clients (the Python client, the agent frameworks), which need a real HTTP server over
    real sockets but not a process of its own: it shares this process's loaded models (the Korean
    analyser, the embedding engines), which each `gieok serve` process loads again (~3 CPU-s a
    start). The server process itself — signals, workers, restarts, its log — is tested with
    `LiveServer`, as are the clients nobody here wrote (the TypeScript package, the Inspector)."""

    def __init__(self, db: Path) -> None:
        import uvicorn

        from gieok.server.beside import EmbeddedServer
        from gieok.server.run import _pending  # the app `gieok serve` (one worker) runs
        from gieok.server.settings import ServerSettings

        self.db = db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = _pending(ServerSettings.load(db=str(db)), True, "127.0.0.1", "test server", lambda _why: None)
        self._server = EmbeddedServer(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, loop="asyncio",
                                                     log_level="warning", server_header=False,
                                                     timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, name=f"gieok-serve-{self.port}", daemon=True)
        self._thread.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        wait_ready(self.url,
                   lambda: None if self._thread.is_alive() else f"the server's thread ended: {self.app.failure!r}",
                   lambda: "the in-process server was not ready")

    def stop(self) -> None:
        """uvicorn's graceful stop, then the app's shutdown (every memory closed)."""
        self._server.should_exit = True
        self._thread.join(60)
        assert not self._thread.is_alive(), "the in-process server did not stop"


def _read_request(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 request (headers and a Content-Length body) from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    length = int(match.group(1)) if match else 0
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def canned(status: int, reason: str, body: dict[str, object] | None = None, **headers: str) -> bytes:
    """An HTTP answer as bytes, closing its connection (so the client's retry opens a new one)."""
    payload = json.dumps(body or {}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(payload)}",
             "Connection: close", *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


DROP = b""  # a script step: read the request, then close without an answer


class Proxy:
    """A loopback TCP proxy to `target_port`. Connection n (from 0) follows `script[n]` while
    there is one — `DROP`, or canned answer bytes — and every later connection is piped to the
    server. Everything the client sent is kept (`sent`), to read the headers of each attempt."""

    def __init__(self, target_port: int, script: list[bytes] | None = None) -> None:
        self.target_port = target_port
        self.script = list(script or [])
        self._sent: list[bytes] = []
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _keep(self, data: bytes) -> None:
        with self._lock:
            self._sent.append(data)

    @property
    def sent(self) -> bytes:
        with self._lock:
            return b"".join(self._sent)

    def idempotency_keys(self) -> list[str]:
        return [m.decode() for m in re.findall(rb"(?i)\r\nidempotency-key:[ \t]*(\S+)\r\n", self.sent)]

    def requests(self) -> list[str]:
        """The request lines sent ("POST /v1/memories HTTP/1.1"), in order."""
        return [m.decode() for m in re.findall(rb"((?:GET|POST|PUT|DELETE) /\S* HTTP/1\.1)\r\n", self.sent)]

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                step = self.script.pop(0) if self.script else None
            threading.Thread(target=self._serve, args=(conn, step), daemon=True).start()

    def _serve(self, conn: socket.socket, step: bytes | None) -> None:
        if step is not None:
            with conn:
                self._keep(_read_request(conn))
                if step:
                    conn.sendall(step)
            return
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        threading.Thread(target=self._pipe, args=(upstream, conn, False), daemon=True).start()
        self._pipe(conn, upstream, True)

    def _pipe(self, source: socket.socket, sink: socket.socket, keep: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if keep:
                    self._keep(chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

"""A throwaway Redis for the benchmarks and the tests: Debian's `redis-server` (apt-get install
redis-server) started on a free loopback port under a temporary directory, and stopped and
removed afterwards.

`throwaway_redis()` keeps nothing on disk (a cache for tests and the load benchmarks).
`RedisServer(persistent=True)` is configured as docs/scale-out.md asks of a deployment's Redis —
an append-only file fsynced on every write, stopped with SHUTDOWN (SIGTERM) so the file is
complete — and can be stopped and started again on the same port and directory, which is what
`gieok bench chaos` does to it."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.children import stop_child
from gieok.errors import ConfigError

__all__ = ["throwaway_redis", "redis_server_binary", "RedisServer", "PERSISTENCE"]

# What a deployment's Redis needs (docs/scale-out.md): the inboxes, leases and claims survive a
# restart only from an append-only file; "always" loses no acknowledged write even when Redis
# itself is killed (everysec: up to a second of them).
PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "always", "--save", "")
EPHEMERAL = ("--save", "", "--appendonly", "no")


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server on 127.0.0.1 under a temporary directory of its own (module docstring).
    `start()` is called by the constructor; `stop()` / `start()` restart it on the same port
    with the same directory (its append-only file, when persistent); `close()` removes it all."""

    def __init__(self, *, persistent: bool = False, start_seconds: float = 10.0) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise ConfigError("no redis-server on PATH: install it (apt-get install redis-server), "
                              "or give --redis redis://… of a server you run")
        self.binary = binary
        self.persistent = persistent
        self.start_seconds = start_seconds
        self.root = Path(tempfile.mkdtemp(prefix="gieok-redis-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        try:
            for _attempt in range(3):  # a free port can be taken between the probe and the bind
                self.port = _free_port()
                if self._launch():
                    return
            raise ConfigError(f"redis-server did not start: {self.log_tail()}")
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def log_tail(self) -> str:
        log = self.root / "redis.log"
        return log.read_text(errors="replace")[-500:] if log.exists() else ""

    def _launch(self) -> bool:
        options = PERSISTENCE if self.persistent else EPHEMERAL
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", *options, "--dir", str(self.root),
             "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=(self.root / "redis.log").open("ab"))
        deadline = time.monotonic() + self.start_seconds
        while self.process.poll() is None and time.monotonic() < deadline and not _answers(self.port):
            time.sleep(0.02)
        if self.process.poll() is None and _answers(self.port):
            return True
        self.process.kill()
        self.process.wait()
        self.process = None
        return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SHUTDOWN, as a service manager stops Redis: SIGTERM makes it finish and fsync its
        append-only file before it exits (never kill -9 a Redis whose data you keep)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def start(self) -> None:
        """Start again on the same port, loading what the last run left in its directory."""
        if self.running:
            return
        for _attempt in range(50):  # the port is ours, but the kernel may hold it for a moment
            if self._launch():
                return
            time.sleep(0.1)
        raise ConfigError(f"redis-server did not start again on port {self.port}: {self.log_tail()}")

    def close(self) -> None:
        if self.process is not None:
            stop_child(self.process)
            self.process = None
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_redis(start_seconds: float = 10.0) -> Iterator[str]:
    """The URL of a fresh Redis on 127.0.0.1 keeping nothing on disk, for the length of the block."""
    server = RedisServer(start_seconds=start_seconds)
    try:
        yield server.url
    finally:
        server.close()

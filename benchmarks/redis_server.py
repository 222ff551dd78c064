"""A throwaway Redis for the benchmarks and the tests: Debian's `redis-server` (apt-get install
redis-server) started on a free loopback port under a temporary directory, with no persistence,
and stopped and removed afterwards."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.children import stop_child
from gieok.errors import ConfigError

__all__ = ["throwaway_redis", "redis_server_binary"]


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


@contextlib.contextmanager
def throwaway_redis(start_seconds: float = 10.0) -> Iterator[str]:
    """The URL of a fresh Redis on 127.0.0.1, for the length of the block."""
    binary = redis_server_binary()
    if binary is None:
        raise ConfigError("no redis-server on PATH: install it (apt-get install redis-server), "
                          "or give --redis redis://… of a server you run")
    root = Path(tempfile.mkdtemp(prefix="gieok-redis-"))
    for _attempt in range(3):  # a free port can be taken between the probe and the bind
        port = _free_port()
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(root), "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=(root / "redis.log").open("wb"))
        deadline = time.monotonic() + start_seconds
        while process.poll() is None and time.monotonic() < deadline and not _answers(port):
            time.sleep(0.02)
        if process.poll() is None and _answers(port):
            break
        process.kill()
        process.wait()
    else:
        log = (root / "redis.log").read_text(errors="replace")[-500:]
        shutil.rmtree(root, ignore_errors=True)
        raise ConfigError(f"redis-server did not start: {log}")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_child(process)
        shutil.rmtree(root, ignore_errors=True)

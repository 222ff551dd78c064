"""One Redis server, shared by every gieok process of a deployment: the bot's shards and
replicas and the `gieok serve` workers. The `redis` setting (`--redis`, `GIEOK_REDIS`) names it;
`redis_namespace` prefixes every key, so two deployments can share one Redis without meeting.

The client is the `redis` extra (redis-py): only a process given a Redis URL imports it, and a
missing package or an unreachable server is one clear error, never a silent fall back to
in-process state (which would answer the same message from two processes)."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, CoordinationUnavailableError, InvalidInputError

__all__ = ["RedisConnection", "check_redis_url", "display_redis_url", "redis_errors"]

_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str) -> str:
    """`url` if it names a Redis server (redis://, rediss:// or unix://), else InvalidInputError."""
    if not isinstance(url, str) or urlsplit(url).scheme not in _SCHEMES:
        raise InvalidInputError(f"a Redis URL starts with redis://, rediss:// or unix://, "
                                f"got {display_redis_url(url)!r}")
    return url


def display_redis_url(url: Any) -> str:
    """The URL with its password masked: what may appear in logs and errors."""
    if not isinstance(url, str):
        return repr(url)
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def _redis() -> Any:
    try:
        import redis  # the `redis` extra: only a process given a Redis URL needs it
    except ImportError:
        raise ConfigError("a Redis URL needs the redis extra: pip install 'gieok[redis]' "
                          "(the redis package is missing)") from None
    return redis


def redis_errors() -> tuple[type[BaseException], ...]:
    """What redis-py raises when the server is gone or refuses us."""
    redis = _redis()
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.AuthenticationError,
            OSError)


class RedisConnection:
    """The deployment's Redis: a thread-safe synchronous client (pooled), asynchronous clients
    made per event loop on demand, the key namespace, and this process's identity (`owner`:
    what its channel leases are held under)."""

    def __init__(self, url: str, namespace: str = "gieok", *, timeout_seconds: float = 5.0,
                 command_seconds: float = 30.0) -> None:
        self.url = check_redis_url(url)
        if not namespace or any(c.isspace() for c in namespace) or len(namespace) > 64:
            raise InvalidInputError(f"redis_namespace must be 1–64 characters without spaces, got {namespace!r}")
        self.namespace = namespace
        self.timeout_seconds = timeout_seconds  # to connect, and to hear a first answer
        # A command's answer may be read late when the process is starved of CPU (a busy machine,
        # a long GIL hold): a short read timeout would fail a command that Redis already carried
        # out, and a drained inbox would be lost with it. Dead servers are found by the connect
        # timeout and the connection errors, not by this.
        self.command_seconds = max(command_seconds, timeout_seconds)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._module = _redis()
        # Each connection carries the process's identity (CLIENT LIST shows which gieok process it is).
        self.client = self._module.Redis.from_url(url, socket_timeout=self.command_seconds,
                                                  socket_connect_timeout=timeout_seconds, decode_responses=True,
                                                  client_name=self.owner)
        try:
            self.client.ping()
        except redis_errors() as exc:
            self.client.close()
            raise self.unavailable(exc) from None

    def key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def unavailable(self, exc: BaseException) -> CoordinationUnavailableError:
        return CoordinationUnavailableError(f"cannot reach Redis at {display_redis_url(self.url)}: {exc}")

    def async_client(self, *, blocking_seconds: float = 0.0) -> Any:
        """A new asyncio client, for the event loop that calls this (redis-py's asyncio clients
        belong to one loop). `blocking_seconds`: the longest blocking read it will do (XREAD
        BLOCK), added to the socket timeout so the wait itself is not an error."""
        return self._module.asyncio.Redis.from_url(
            self.url, socket_timeout=self.command_seconds + blocking_seconds,
            socket_connect_timeout=self.timeout_seconds, decode_responses=True, client_name=self.owner)

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"RedisConnection({display_redis_url(self.url)!r}, namespace={self.namespace!r})"

"""The dashboard's sessions and its login throttle.

Logging in trades an API key for a session: a random 256-bit id, sent to the browser in the
`gieok_session` cookie and stored only as its SHA-256 (`store.sessions`, in the home store beside
the keys). The cookie is never the key: it opens the dashboard, the REST API and the event
WebSocket for as long as the session lives, and no longer. A session ends

- on logout (its row is deleted),
- after `server_session_idle_seconds` without a request, and `server_session_max_seconds` after
  login whatever happens (absolute),
- when its key is revoked (`gieok keys revoke` deletes the key's sessions; every use also checks
  the key).

Logins are throttled (`LoginThrottle`): after `server_login_attempts` failed logins within
`server_login_window_seconds`, from one client address or against one key prefix, further logins
from there (or for that prefix) are refused with 429 until the oldest failure leaves the window —
a refused login does not even check the key. The counts are per process.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable

from ..errors import AuthenticationError
from ..store.sessions import SessionStore
from .auth import ApiKeys, Principal

__all__ = ["Sessions", "LoginThrottle", "TOUCH_EVERY_SECONDS"]

TOUCH_EVERY_SECONDS = 30.0  # a session's last use is written at most this often
_PREFIX = re.compile(r"^\s*gk_([0-9a-f]{8})_")


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


class Sessions:
    """Open, check and end dashboard sessions (module docstring)."""

    def __init__(self, table: SessionStore, keys: ApiKeys, *, idle_seconds: float, max_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.table, self.keys = table, keys
        self.idle_seconds, self.max_seconds = idle_seconds, max_seconds
        self.clock = clock

    def open(self, key: str) -> tuple[str, Principal]:
        """A new session for a valid key: its id (for the cookie only) and its principal."""
        who = self.keys.verify(key)
        assert who.key_id is not None
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        self.table.purge(idle_before=now - self.idle_seconds, created_before=now - self.max_seconds)
        self.table.create(_digest(session_id), who.key_id, now)
        return session_id, Principal(who.tenant, who.role, who.key_id, who.key_prefix, _digest(session_id))

    def verify(self, session_id: str) -> Principal:
        """The principal of a live session; `AuthenticationError` for an unknown, ended, expired one,
        or one whose key was revoked."""
        digest = _digest(session_id)
        row = self.table.get(digest) if 20 <= len(session_id) <= 100 else None
        if row is None:
            raise AuthenticationError("no such session (logged out, expired or never opened): log in again")
        now = self.clock()
        if now - row.last_seen_at > self.idle_seconds or now - row.created_at > self.max_seconds:
            self.table.delete(digest)
            raise AuthenticationError("the session has expired: log in again")
        key = self.keys.table.by_id(row.key_id)
        if key is None or key.revoked_at is not None:
            self.table.delete(digest)
            raise AuthenticationError("the session's API key has been revoked")
        if now - row.last_seen_at > TOUCH_EVERY_SECONDS:
            self.table.touch(digest, now)
        return Principal(key.tenant, key.role, key.key_id, key.prefix, digest)

    def still_open(self, session: str) -> bool:
        """Whether the session with this digest is live (its key too), without touching it."""
        row = self.table.get(session)
        if row is None:
            return False
        now = self.clock()
        if now - row.last_seen_at > self.idle_seconds or now - row.created_at > self.max_seconds:
            return False
        key = self.keys.table.by_id(row.key_id)
        return key is not None and key.revoked_at is None

    def end(self, session_id: str) -> None:
        self.table.delete(_digest(session_id))


class LoginThrottle:
    """Failed logins per client address and per key prefix, in a sliding window (module docstring)."""

    def __init__(self, attempts: int, window_seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempts, self.window = attempts, window_seconds
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _names(client: str, key: str) -> list[str]:
        match = _PREFIX.match(key)
        return [f"client:{client}", *([f"prefix:{match.group(1)}"] if match else [])]

    def retry_after(self, client: str, key: str) -> float:
        """Seconds until a login from `client` with `key` may be tried; 0 when it may now."""
        now = self.clock()
        wait = 0.0
        with self._lock:
            for name in self._names(client, key):
                failures = self._failures.get(name)
                if failures is None:
                    continue
                while failures and now - failures[0] > self.window:
                    failures.popleft()
                if len(failures) >= self.attempts:
                    wait = max(wait, self.window - (now - failures[0]))
        return wait

    def failed(self, client: str, key: str) -> None:
        now = self.clock()
        with self._lock:
            if len(self._failures) > 100_000:  # bounded: forget the oldest names first
                for name in list(self._failures)[:10_000]:
                    del self._failures[name]
            for name in self._names(client, key):
                self._failures.setdefault(name, deque(maxlen=self.attempts * 2)).append(now)

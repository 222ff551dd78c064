"""API keys: who a caller is comes from their key, never from the request.

A key looks like `gk_<prefix>_<secret>`: the 8-character prefix identifies it in lists and
logs, the secret is 256 bits from `secrets`. Only a SHA-256 of the whole key is stored (a key
is random, so a slow password hash adds nothing), and it is compared in constant time. Each
key carries its tenant and its role; revoking one takes effect on the next request, in every
process, because every request looks the key up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import AuthenticationError, InvalidInputError, InvalidTypeError, PermissionDeniedError
from ..store.base import Store
from ..store.keys import KeyRow, KeyStore
from ..store.sessions import SessionStore

__all__ = ["ROLES", "Principal", "ApiKeys", "check_tenant", "check_role", "TOUCH_EVERY_SECONDS"]

ROLES = ("read", "write", "admin")  # each role may do everything the ones before it may
_KEY = re.compile(r"^gk_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
TOUCH_EVERY_SECONDS = 60.0  # last_used_at is written at most this often per key: not a write per request


def check_tenant(name: object) -> str:
    """Tenant names become file names: lowercase letters, digits, '-' and '_', at most 63."""
    if not isinstance(name, str):
        raise InvalidTypeError(f"tenant must be a string, not {type(name).__name__}")
    if not _TENANT.match(name):
        raise InvalidInputError(f"tenant {name[:70]!r} must be 1–63 lowercase letters, digits, '-' or '_', "
                                "starting with a letter or digit")
    return name


def check_role(role: object) -> str:
    if role not in ROLES:
        raise InvalidInputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant whose memory they see and what their key lets them do."""

    tenant: str
    role: str
    key_id: int | None = None  # None: an unauthenticated loopback server (`--no-auth`)
    key_prefix: str | None = None
    session: str | None = None  # the dashboard session (its digest) the caller came with, if any

    def can(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    def require(self, role: str) -> None:
        if not self.can(role):
            raise PermissionDeniedError(f"this key's role is {self.role}; {role} is needed")


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


class ApiKeys:
    """Create, list, revoke and verify keys kept in the store of the deployment's home memory."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.table: KeyStore = store.keys
        self.sessions: SessionStore = store.sessions  # the dashboard's sessions, ended when their key is revoked
        self.clock = clock
        self._touched: dict[int, float] = {}
        self._lock = threading.Lock()

    def create(self, tenant: str, role: str, name: str = "") -> tuple[str, KeyRow]:
        """A new key for `tenant` with `role`: returns the key (shown once, never stored) and its row."""
        check_tenant(tenant)
        check_role(role)
        if not isinstance(name, str) or len(name) > 100 or "\x00" in name:
            raise InvalidInputError("key name must be a string of at most 100 characters")
        for _ in range(5):  # a prefix collision is a 1-in-4-billion event; try again
            prefix = secrets.token_hex(4)
            if self.table.by_prefix(prefix) is None:
                break
        key = f"gk_{prefix}_{secrets.token_urlsafe(32)}"
        return key, self.table.insert(prefix, _digest(key), tenant, role, name.strip(), self.clock())

    def verify(self, key: object) -> Principal:
        """The principal a key stands for; `AuthenticationError` for anything else (the message
        never says whether a prefix exists)."""
        if not isinstance(key, str) or not (match := _KEY.match(key.strip())):
            raise AuthenticationError("missing or malformed API key (Authorization: Bearer gk_…)")
        key = key.strip()
        row = self.table.by_prefix(match.group(1))
        if row is None or not hmac.compare_digest(row.key_hash, _digest(key)) or row.revoked_at is not None:
            raise AuthenticationError("invalid or revoked API key")
        self._touch(row.key_id)
        return Principal(row.tenant, row.role, row.key_id, row.prefix)

    def _touch(self, key_id: int) -> None:
        now = self.clock()
        with self._lock:
            if now - self._touched.get(key_id, 0.0) < TOUCH_EVERY_SECONDS:
                return
            self._touched[key_id] = now
        self.table.touch(key_id, now)

    def keys(self, tenant: str | None = None) -> list[KeyRow]:
        return self.table.all(tenant)

    def revoke(self, key_id: int, *, tenant: str | None = None) -> bool:
        """Revoke a key (only one of `tenant`, when given). False if no such live key."""
        if isinstance(key_id, bool) or not isinstance(key_id, int):
            raise InvalidTypeError("key id must be an integer")
        return self.table.revoke(key_id, self.clock(), tenant)

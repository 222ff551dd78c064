"""Who is calling, and which memory that lets them reach: one path for REST, the dashboard and MCP.

A caller is their credentials and nothing else: an API key (`Authorization: Bearer gk_…`; an MCP
client's bearer token is a gieok key too) or the dashboard's session cookie (an opaque session id,
never the key: `sessions.py`). `Access.still_valid` says whether a principal resolved earlier still
stands (a stream that stays open re-checks it: a revoked key or an ended session closes it). `Access.principal`
turns credentials into a `Principal` (tenant and role) — the one place that does, for every
route, page and tool — and `Access.tenant` turns a principal into its own tenant's open memory,
the one way anything reaches a memory. No request names a tenant; role gates are router-level
dependencies (`deps.py`), so a route cannot forget one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import AuthenticationError, PermissionDeniedError
from .auth import ApiKeys, Principal
from .sessions import Sessions
from .tenants import DEFAULT_TENANT, Tenant, TenantRegistry

__all__ = ["Access", "Credentials", "NO_AUTH_PRINCIPAL"]

NO_AUTH_PRINCIPAL = Principal(DEFAULT_TENANT, "admin")  # every caller of a `--no-auth` loopback server


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request carries. `unprompted`: a browser could have sent it by itself with the
    session cookie and it could change something (any method but GET, HEAD and OPTIONS, or a
    WebSocket); `same_origin`: its Origin (or Referer) is this server's own; `cross_site`: it
    carries an Origin that is not this server's (a page of another site sent it)."""

    bearer: str | None = None
    session: str | None = None
    unprompted: bool = False
    same_origin: bool = False
    cross_site: bool = False


class Access:
    """The key table and the tenants of one server, and the rules between them."""

    def __init__(self, keys: ApiKeys, tenants: TenantRegistry, *, auth: bool = True,
                 sessions: Sessions | None = None) -> None:
        self.keys = keys
        self.tenants = tenants
        self.auth = auth
        self.sessions = sessions
        self._checked: dict[tuple[int | None, str | None], tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def principal(self, credentials: Credentials) -> Principal:
        """The caller; `AuthenticationError` (401) without valid credentials, `PermissionDeniedError`
        (403) for a state-changing request or a WebSocket sent by another site's page (whatever
        it carries, and on a `--no-auth` server too, where it would need nothing at all), and for
        a session cookie sent with one that does not show this server's origin."""
        if credentials.unprompted and credentials.cross_site:
            raise PermissionDeniedError("a request that changes something, or opens the event stream, may not come "
                                        "from another site's page (Origin check failed)")
        if not self.auth:
            return NO_AUTH_PRINCIPAL
        if credentials.bearer:
            return self.keys.verify(credentials.bearer)
        if credentials.session:
            if self.sessions is None:
                raise AuthenticationError("this server keeps no dashboard sessions")
            who = self.sessions.verify(credentials.session)
            # A browser sends the cookie by itself: what it may change, or the event socket it may open,
            # must come from this server's own pages (SameSite=Strict still lets another port of the same
            # host through). Bearer keys are never sent by a browser on its own.
            if credentials.unprompted and not credentials.same_origin:
                raise PermissionDeniedError("a request with the dashboard's session must come from its own pages "
                                            "(Origin check failed)")
            return who
        raise AuthenticationError("missing API key: send Authorization: Bearer gk_…")

    def still_valid(self, who: Principal, *, within: float = 1.0) -> bool:
        """Whether `who` still stands: their key is not revoked and, for a dashboard session, the
        session is still open. A stream calls this every few seconds; answers are shared for
        `within` seconds (many streams of one key cost one lookup). Does I/O: a worker thread's call."""
        if not self.auth or who.key_id is None:
            return True
        now = time.monotonic()
        slot = (who.key_id, who.session)
        with self._lock:
            cached = self._checked.get(slot)
            if cached is not None and now - cached[0] < within:
                return cached[1]
        if who.session is not None:
            valid = self.sessions is not None and self.sessions.still_open(who.session)
        else:
            row = self.keys.table.by_id(who.key_id)
            valid = row is not None and row.revoked_at is None
        with self._lock:
            if len(self._checked) > 10_000:
                self._checked.clear()
            self._checked[slot] = (now, valid)
        return valid

    @contextmanager
    def tenant(self, who: Principal) -> Iterator[Tenant]:
        """The caller's own tenant, open for the length of the block (opened first if need be: a
        large memory takes seconds, so call this from a worker thread)."""
        with self.tenants.use(who.tenant) as tenant:
            yield tenant

    def tenant_if_open(self, who: Principal) -> Tenant | None:
        """The caller's tenant when it is open already (no I/O: the event loop may call this),
        held until `release`; None when `tenant` must open it."""
        return self.tenants.acquire_open(who.tenant)

    def open_tenant(self, who: Principal) -> Tenant:
        """The caller's tenant, opened if need be, held until `release` (a worker thread's call)."""
        return self.tenants.acquire(who.tenant)

    def release(self, tenant: Tenant) -> None:
        self.tenants.release(tenant)

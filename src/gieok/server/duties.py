"""The server's background duties: with agents writing conversations through it, `gieok serve` is
the long-running process of their memory, so it does on a timer what a bot does on its own.

Every `server_duty_seconds`, for each open tenant: short-term memory's expiry rule (important
expired entries promoted to long-term memory, the rest dropped — what `gieok stm --expire` applies
by hand), and the extraction of conversations that went quiet with messages the extraction has not
seen (their summary brought up to date and their facts extracted, after a restart too). Once per
tenant across every worker: a lease in the tenant's own store decides which process does it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any

import anyio.to_thread

from ..errors import GieokError
from .tenants import Tenant, TenantRegistry

__all__ = ["Duties", "LEASE_PREFIX"]

log = logging.getLogger("gieok.server.duties")

LEASE_PREFIX = "duties:"


class Duties:
    """The timer and what it runs, for one server process."""

    def __init__(self, tenants: TenantRegistry, interval: float) -> None:
        self.tenants = tenants
        self.interval = interval
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.runs: list[dict[str, Any]] = []  # the latest rounds' outcomes (health, tests)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: a round of duties every `interval` seconds (the first after one interval)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.interval)
                return
            except TimeoutError:
                pass
            await self.round()

    async def round(self) -> list[dict[str, Any]]:
        outcomes = []
        for name in self.tenants.open_names():
            try:
                outcome = await self.tenant_duties(name)
            except GieokError as exc:  # a tenant closing or a store gone away: next round
                log.warning("duties of tenant %s: %s", name, exc)
                continue
            if outcome is not None:
                outcomes.append(outcome)
        self.runs = (self.runs + outcomes)[-100:]
        return outcomes

    async def tenant_duties(self, name: str) -> dict[str, Any] | None:
        """One tenant's duties, if this process holds (or takes) its lease; None otherwise."""
        tenant = await anyio.to_thread.run_sync(self.tenants.acquire, name)
        try:
            leases = tenant.memory.store.leases
            # the store's clock, not this process's: another worker's may disagree (docs/scale-out.md)
            held = await anyio.to_thread.run_sync(leases.acquire, LEASE_PREFIX + name, self.holder, self.interval * 3)
            if not held:
                return None
            expired = await anyio.to_thread.run_sync(tenant.memory.stm.expire)
            extracted = await self._extract(tenant)
            return {"tenant": name, "stm": expired, "extracted": extracted, "at": time.time()}
        finally:
            self.tenants.release(tenant)

    @staticmethod
    async def _extract(tenant: Tenant) -> int:
        tables = tenant.memory.store.conversation
        pending = await anyio.to_thread.run_sync(tables.channel_states_pending, time.time())
        if not pending:
            return 0  # nothing to do: do not build a pipeline (its classifiers) just to find that out
        pipeline = await anyio.to_thread.run_sync(lambda: tenant.pipeline)
        return await pipeline.extract_quiet()

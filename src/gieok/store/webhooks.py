"""Webhooks of `gieok serve` (schema v16 on SQLite, v18 on PostgreSQL; in the deployment's home
store, beside the API keys): each tenant's endpoints, and the queue of deliveries to them.

The queue is an outbox: an event is written here, one row per endpoint that wants it, as it is
published, and a serve process's delivery loop (server/webhook_delivery.py) posts it until the
receiver says 2xx. Because the rows are in the store, a delivery survives a restart; because a
process *claims* the rows it is about to post (`claimed_by`, `claimed_until`) in one UPDATE whose
WHERE is checked again on the row it locks, two workers never post the same attempt, and a claim
whose process died lapses and is taken by another. An endpoint whose receiver looks down rests
(`failures` in a row, `resting_until`): meanwhile only events never tried are claimed for it. The
body is kept only while the delivery is pending: once delivered (or given up) it is dropped, so the
queue does not become a second copy of the tenant's memory."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import InvalidInputError
from .sql import SqlSession

__all__ = ["EndpointRow", "DeliveryRow", "ClaimedDelivery", "WebhookStore", "WebhookTable", "MARKS_MAX", "PENDING",
           "DELIVERED", "FAILED"]

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"

_ENDPOINT = ("endpoint_id", "tenant", "url", "events", "secret", "previous_secret", "previous_until", "created_at",
             "disabled_at", "disabled_reason", "failures", "resting_until")
_DELIVERY = ("delivery_id", "endpoint_id", "event_id", "event_type", "status", "attempts", "created_at",
             "next_try_at", "last_try_at", "last_status", "last_error", "delivered_at")
MARKS_MAX = 50  # marks a `pending_bodies(naming=…)` looks for in one statement (one LIKE each)
_DUE = "status = 'pending' AND next_try_at <= ? AND (claimed_until IS NULL OR claimed_until < ?)"
# a resting endpoint (its receiver looks down) gets only events never tried yet: one of those getting through is
# how a receiver that came back is noticed at once
_AWAKE = "(attempts = 0 OR endpoint_id NOT IN (SELECT endpoint_id FROM webhook_endpoints WHERE resting_until > ?))"


@dataclass(frozen=True, slots=True)
class EndpointRow:
    endpoint_id: int
    tenant: str
    url: str
    events: tuple[str, ...]  # event types (or "kind.*"); empty: every event
    secret: str  # whsec_…: the receiver checks signatures with it, so it is kept as it is
    previous_secret: str | None  # after a rotation, also signed with until `previous_until`
    previous_until: float | None
    created_at: float
    disabled_at: float | None
    disabled_reason: str
    failures: int = 0  # attempts in a row without a 2xx: the receiver looks down
    resting_until: float | None = None  # …and is left alone until then (then one delivery probes it)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> EndpointRow:
        values = list(row)
        values[3] = tuple(json.loads(values[3]))
        return cls(*values)

    def wants(self, event_type: str) -> bool:
        if self.disabled_at is not None:
            return False
        return not self.events or any(event_type == name or (name.endswith(".*") and
                                                              event_type.startswith(name[:-1]))
                                      for name in self.events)

    def as_dict(self) -> dict[str, Any]:
        """Everything but the secrets: what the list shows."""
        return {"id": self.endpoint_id, "url": self.url, "events": list(self.events), "created_at": self.created_at,
                "disabled_at": self.disabled_at, "disabled_reason": self.disabled_reason or None,
                "failures": self.failures, "resting_until": self.resting_until}


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    delivery_id: int
    endpoint_id: int
    event_id: int
    event_type: str
    status: str  # pending | delivered | failed
    attempts: int
    created_at: float
    next_try_at: float | None  # None once it is no longer pending
    last_try_at: float | None
    last_status: int | None  # the receiver's HTTP status on the last attempt (None: no answer)
    last_error: str | None
    delivered_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.delivery_id, "event_id": self.event_id, "event_type": self.event_type,
                "status": self.status, "attempts": self.attempts, "created_at": self.created_at,
                "next_try_at": self.next_try_at if self.status == PENDING else None,
                "last_try_at": self.last_try_at, "last_status": self.last_status, "last_error": self.last_error,
                "delivered_at": self.delivered_at}


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A delivery this process claimed: what it posts, and what the next attempt's backoff counts from."""

    delivery_id: int
    endpoint_id: int
    event_id: int
    body: str
    attempts: int
    created_at: float


class WebhookStore(Protocol):
    """Endpoints and their delivery queue, shared by every process of a deployment."""

    def add_endpoint(self, tenant: str, url: str, events: Sequence[str], secret: str, now: float) -> EndpointRow: ...

    def endpoint(self, endpoint_id: int, tenant: str | None = None) -> EndpointRow | None: ...

    def endpoints(self, tenant: str) -> list[EndpointRow]: ...

    def endpoints_by_id(self, endpoint_ids: Iterable[int]) -> dict[int, EndpointRow]: ...

    def delete_endpoint(self, endpoint_id: int, tenant: str) -> bool: ...

    def rotate_secret(self, endpoint_id: int, tenant: str, secret: str, previous_until: float) -> EndpointRow | None:
        ...

    def disable_endpoint(self, endpoint_id: int, reason: str, now: float) -> None: ...

    def rest_endpoint(self, endpoint_id: int, now: float, until: float) -> int: ...

    def wake_endpoint(self, endpoint_id: int) -> None: ...

    def enqueue(self, endpoints: Sequence[EndpointRow], event_id: int, event_type: str, body: str, now: float,
                marks: str | None = None) -> int:
        ...

    def has_due(self, now: float) -> bool: ...

    def claim(self, holder: str, now: float, lease_seconds: float, limit: int,
              skip: Sequence[int] = ()) -> list[ClaimedDelivery]: ...

    def delivered(self, delivery_id: int, holder: str, now: float, status: int) -> bool: ...

    def retry(self, delivery_id: int, holder: str, now: float, next_try_at: float, status: int | None,
              error: str) -> bool: ...

    def give_up(self, delivery_id: int, holder: str, now: float, status: int | None, error: str) -> bool: ...

    def release(self, delivery_ids: Sequence[int], holder: str) -> None: ...

    def drop_orphans(self, endpoint_id: int) -> int: ...

    def deliveries(self, endpoint_id: int, *, before: int | None = None, limit: int = 50) -> list[DeliveryRow]: ...

    def pending_bodies(self, tenant: str, naming: Collection[str] | None = None) -> list[tuple[int, str]]: ...

    def replace_bodies(self, bodies: Mapping[int, str]) -> None: ...

    def purge(self, before: float) -> int: ...


class WebhookTable:
    """`WebhookStore` in SQL that SQLite and PostgreSQL both speak (but for one clause of `claim`:
    `dialect`)."""

    def __init__(self, store: SqlSession, dialect: str = "sqlite") -> None:
        self.store = store
        # PostgreSQL: rows another worker is claiming are skipped, not waited for (it would find them
        # claimed once it got them, and come back with nothing). SQLite writes one transaction at a time.
        self._skip_locked = " FOR UPDATE SKIP LOCKED" if dialect == "postgres" else ""

    # -- endpoints ------------------------------------------------------------------------------
    def add_endpoint(self, tenant: str, url: str, events: Sequence[str], secret: str, now: float) -> EndpointRow:
        with self.store.transaction() as conn:
            endpoint_id = int(conn.execute(
                "INSERT INTO webhook_endpoints(tenant, url, events, secret, created_at) VALUES (?, ?, ?, ?, ?) "
                "RETURNING endpoint_id", (tenant, url, json.dumps(list(events)), secret, now)).fetchone()[0])
            # A new endpoint has no queue. SQLite gives a deleted endpoint's id to the next one: what
            # a process queued for the old one beside its delete must not be sent to this one.
            conn.execute("DELETE FROM webhook_deliveries WHERE endpoint_id = ?", (endpoint_id,))
        return EndpointRow(endpoint_id, tenant, url, tuple(events), secret, None, None, now, None, "")

    def endpoint(self, endpoint_id: int, tenant: str | None = None) -> EndpointRow | None:
        """The endpoint `endpoint_id` — of `tenant` only, when given (another tenant's is not found)."""
        sql = f"SELECT {', '.join(_ENDPOINT)} FROM webhook_endpoints WHERE endpoint_id = ?"
        params: list[Any] = [endpoint_id]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        rows = self.store.fetch(sql, params)
        return EndpointRow.from_row(rows[0]) if rows else None

    def endpoints(self, tenant: str) -> list[EndpointRow]:
        rows = self.store.fetch(f"SELECT {', '.join(_ENDPOINT)} FROM webhook_endpoints WHERE tenant = ? "
                                "ORDER BY endpoint_id", (tenant,))
        return [EndpointRow.from_row(row) for row in rows]

    def endpoints_by_id(self, endpoint_ids: Iterable[int]) -> dict[int, EndpointRow]:
        ids = sorted(set(endpoint_ids))
        if not ids:
            return {}
        rows = self.store.fetch(f"SELECT {', '.join(_ENDPOINT)} FROM webhook_endpoints WHERE endpoint_id IN "
                                f"({', '.join('?' * len(ids))})", ids)
        return {row.endpoint_id: row for row in map(EndpointRow.from_row, rows)}

    def delete_endpoint(self, endpoint_id: int, tenant: str) -> bool:
        """Delete one of `tenant`'s endpoints with its queue (what was not delivered is dropped)."""
        with self.store.transaction() as conn:
            gone = conn.execute("DELETE FROM webhook_endpoints WHERE endpoint_id = ? AND tenant = ?",
                                (endpoint_id, tenant)).rowcount > 0
            if gone:
                conn.execute("DELETE FROM webhook_deliveries WHERE endpoint_id = ?", (endpoint_id,))
            return gone

    def rotate_secret(self, endpoint_id: int, tenant: str, secret: str, previous_until: float) -> EndpointRow | None:
        """A new secret; the one it replaces still signs (beside it) until `previous_until`."""
        with self.store.transaction() as conn:
            changed = conn.execute("UPDATE webhook_endpoints SET previous_secret = secret, previous_until = ?, "
                                   "secret = ? WHERE endpoint_id = ? AND tenant = ?",
                                   (previous_until, secret, endpoint_id, tenant)).rowcount
        return self.endpoint(endpoint_id, tenant) if changed else None

    def disable_endpoint(self, endpoint_id: int, reason: str, now: float) -> None:
        """No more deliveries to it (its receiver said 410 Gone): what is queued fails with `reason`."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE webhook_endpoints SET disabled_at = ?, disabled_reason = ? "
                         "WHERE endpoint_id = ? AND disabled_at IS NULL", (now, reason, endpoint_id))
            conn.execute("UPDATE webhook_deliveries SET status = 'failed', body = NULL, last_error = ?, "
                         "claimed_by = NULL, claimed_until = NULL WHERE endpoint_id = ? AND status = 'pending'",
                         (reason, endpoint_id))

    def rest_endpoint(self, endpoint_id: int, now: float, until: float) -> int:
        """One more failure in a row: until `until` only events never tried are claimed for the
        endpoint. An endpoint resting already is left as it is (a new event failing during the
        rest does not make it longer; only a failed probe after it does). Returns the failures in
        a row, 0 when it was resting already."""
        with self.store.transaction() as conn:
            row = conn.execute("UPDATE webhook_endpoints SET failures = failures + 1, resting_until = ? "
                               "WHERE endpoint_id = ? AND (resting_until IS NULL OR resting_until <= ?) "
                               "RETURNING failures", (until, endpoint_id, now)).fetchone()
        return int(row[0]) if row else 0

    def wake_endpoint(self, endpoint_id: int) -> None:
        """The receiver answered 2xx: its failures in a row are over."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE webhook_endpoints SET failures = 0, resting_until = NULL WHERE endpoint_id = ?",
                         (endpoint_id,))

    # -- the queue ------------------------------------------------------------------------------
    def enqueue(self, endpoints: Sequence[EndpointRow], event_id: int, event_type: str, body: str, now: float,
                marks: str | None = None) -> int:
        """Queue one event for these endpoints (as the caller listed them), due now, with its `marks`
        (`coordination.events.marks_field`: each mark on a line of its own); an event queued
        twice for one endpoint (the same id) is queued once. None is queued for an endpoint deleted
        since the caller listed it (another process's delete): the row would hold the event's body
        with no endpoint to send it to, out of an erasure's reach — or, on SQLite, which gives a
        deleted row's id to the next endpoint, be sent to that one, maybe another tenant's. Returns
        how many rows are new."""
        with self.store.transaction() as conn:
            added = 0
            for endpoint in endpoints:
                added += conn.execute(
                    "INSERT INTO webhook_deliveries(endpoint_id, event_id, event_type, body, status, attempts, "
                    "created_at, next_try_at, marks) SELECT ?, ?, ?, ?, 'pending', 0, ?, ?, ? WHERE EXISTS "
                    "(SELECT 1 FROM webhook_endpoints WHERE endpoint_id = ? AND tenant = ? AND created_at = ?) "
                    "ON CONFLICT(endpoint_id, event_id) DO NOTHING",
                    (endpoint.endpoint_id, event_id, event_type, body, now, now, marks, endpoint.endpoint_id,
                     endpoint.tenant, endpoint.created_at)).rowcount
            return added

    def has_due(self, now: float) -> bool:
        """Whether `claim` would find something (a read: no write lock taken just to find nothing)."""
        return bool(self.store.fetch(f"SELECT 1 FROM webhook_deliveries WHERE {_DUE} AND {_AWAKE} LIMIT 1",
                                     (now, now, now)))

    def claim(self, holder: str, now: float, lease_seconds: float, limit: int,
              skip: Sequence[int] = ()) -> list[ClaimedDelivery]:
        """Claim up to `limit` due deliveries, oldest first, for `lease_seconds` (of a resting
        endpoint only events never tried; none of the endpoints in `skip`: this process is posting
        to them). The condition is repeated outside the subquery, so a row another worker claimed
        meanwhile is never claimed twice (PostgreSQL checks it again on the row version it locks)."""
        skipping = f" AND endpoint_id NOT IN ({', '.join('?' * len(skip))})" if skip else ""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"UPDATE webhook_deliveries SET claimed_by = ?, claimed_until = ? WHERE delivery_id IN "
                f"(SELECT delivery_id FROM webhook_deliveries WHERE {_DUE} AND {_AWAKE}{skipping} "
                f"ORDER BY delivery_id LIMIT ?{self._skip_locked}) AND {_DUE} "
                "RETURNING delivery_id, endpoint_id, event_id, body, attempts, created_at",
                (holder, now + lease_seconds, now, now, now, *skip, limit, now, now)).fetchall()
        return sorted((ClaimedDelivery(int(r[0]), int(r[1]), int(r[2]), str(r[3]), int(r[4]), float(r[5]))
                       for r in rows), key=lambda claimed: claimed.delivery_id)

    def delivered(self, delivery_id: int, holder: str, now: float, status: int) -> bool:
        """Record a 2xx (the claim still this holder's: a lapsed claim's attempt records nothing)."""
        with self.store.transaction() as conn:
            return conn.execute(
                "UPDATE webhook_deliveries SET status = 'delivered', body = NULL, attempts = attempts + 1, "
                "last_try_at = ?, last_status = ?, last_error = NULL, delivered_at = ?, claimed_by = NULL, "
                "claimed_until = NULL WHERE delivery_id = ? AND claimed_by = ? AND status = 'pending'",
                (now, status, now, delivery_id, holder)).rowcount > 0

    def retry(self, delivery_id: int, holder: str, now: float, next_try_at: float, status: int | None,
              error: str) -> bool:
        with self.store.transaction() as conn:
            return conn.execute(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, last_try_at = ?, last_status = ?, "
                "last_error = ?, next_try_at = ?, claimed_by = NULL, claimed_until = NULL "
                "WHERE delivery_id = ? AND claimed_by = ? AND status = 'pending'",
                (now, status, error, next_try_at, delivery_id, holder)).rowcount > 0

    def give_up(self, delivery_id: int, holder: str, now: float, status: int | None, error: str) -> bool:
        with self.store.transaction() as conn:
            return conn.execute(
                "UPDATE webhook_deliveries SET status = 'failed', body = NULL, attempts = attempts + 1, "
                "last_try_at = ?, last_status = ?, last_error = ?, claimed_by = NULL, claimed_until = NULL "
                "WHERE delivery_id = ? AND claimed_by = ? AND status = 'pending'",
                (now, status, error, delivery_id, holder)).rowcount > 0

    def release(self, delivery_ids: Sequence[int], holder: str) -> None:
        """Give back claimed deliveries that were not tried (as they were: due, their attempts unchanged)."""
        if not delivery_ids:
            return
        with self.store.transaction() as conn:
            conn.execute(f"UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until = NULL "
                         f"WHERE claimed_by = ? AND status = 'pending' AND delivery_id IN "
                         f"({', '.join('?' * len(delivery_ids))})", (holder, *delivery_ids))

    def deliveries(self, endpoint_id: int, *, before: int | None = None, limit: int = 50) -> list[DeliveryRow]:
        """An endpoint's deliveries, newest first; `before`: a page after the one ending there."""
        sql = f"SELECT {', '.join(_DELIVERY)} FROM webhook_deliveries WHERE endpoint_id = ?"
        params: list[Any] = [endpoint_id]
        if before is not None:
            sql += " AND delivery_id < ?"
            params.append(before)
        rows = self.store.fetch(sql + " ORDER BY delivery_id DESC LIMIT ?", [*params, limit])
        return [DeliveryRow(*row) for row in rows]

    def drop_orphans(self, endpoint_id: int) -> int:
        """The deliveries queued for an endpoint that no longer exists (queued while another
        process deleted it): removed with their bodies. How many."""
        with self.store.transaction() as conn:
            return conn.execute("DELETE FROM webhook_deliveries WHERE endpoint_id = ? AND NOT EXISTS "
                                "(SELECT 1 FROM webhook_endpoints WHERE endpoint_id = ?)",
                                (endpoint_id, endpoint_id)).rowcount

    def pending_bodies(self, tenant: str, naming: Collection[str] | None = None) -> list[tuple[int, str]]:
        """The bodies still queued for `tenant`'s endpoints (what an erasure must look through); with
        `naming` (at most `MARKS_MAX` marks), only those whose event holds one of them — and maybe a
        few more (`LIKE` reads `%` and `_` in a mark as wildcards: the caller checks each body) — and
        those queued before deliveries recorded their marks."""
        where = ""
        params: list[Any] = [tenant]
        if naming is not None:
            if len(naming) > MARKS_MAX:
                raise InvalidInputError(f"at most {MARKS_MAX} marks at a time, not {len(naming)}")
            wanted = sorted(set(naming))
            where = " AND (d.marks IS NULL" + " OR d.marks LIKE ?" * len(wanted) + ")"
            params += [f"%\n{mark}\n%" for mark in wanted]
        rows = self.store.fetch("SELECT d.delivery_id, d.body FROM webhook_deliveries d JOIN webhook_endpoints e "
                                "ON e.endpoint_id = d.endpoint_id WHERE e.tenant = ? AND d.status = 'pending' "
                                f"AND d.body IS NOT NULL{where}", params)
        return [(int(row[0]), str(row[1])) for row in rows]

    def replace_bodies(self, bodies: Mapping[int, str]) -> None:
        if not bodies:
            return
        with self.store.transaction() as conn:
            for delivery_id, body in bodies.items():
                conn.execute("UPDATE webhook_deliveries SET body = ? WHERE delivery_id = ? AND status = 'pending'",
                             (body, delivery_id))

    def purge(self, before: float) -> int:
        """Forget the delivered and failed deliveries of events older than `before`."""
        with self.store.transaction() as conn:
            return int(conn.execute("DELETE FROM webhook_deliveries WHERE status <> 'pending' AND created_at < ?",
                                    (before,)).rowcount)

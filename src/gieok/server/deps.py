"""Request dependencies: the caller's principal (from their key, and nothing else) and their
tenant's memory. Every route reaches a memory only through `tenant`, so none can name another."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from ..errors import AuthenticationError
from .auth import Principal
from .state import ServerState
from .tenants import DEFAULT_TENANT, Tenant

__all__ = ["server_state", "principal", "reader", "writer", "admin", "tenant", "principal_of", "SESSION_COOKIE"]

SESSION_COOKIE = "gieok_session"


def server_state(connection: HTTPConnection) -> ServerState:
    state: ServerState = connection.app.state.gieok
    return state


def principal_of(connection: HTTPConnection) -> Principal:
    """The caller, from `Authorization: Bearer <key>` (or the dashboard's session cookie)."""
    state = server_state(connection)
    if not state.auth:
        return Principal(DEFAULT_TENANT, "admin")
    header = connection.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return state.keys.verify(key.strip())
    cookie = connection.cookies.get(SESSION_COOKIE)
    if cookie:
        return state.keys.verify(cookie)
    raise AuthenticationError("missing API key: send Authorization: Bearer gk_…")


def principal(request: Request) -> Principal:
    return principal_of(request)


Caller = Annotated[Principal, Depends(principal)]


def reader(who: Caller) -> Principal:
    who.require("read")
    return who


def writer(who: Caller) -> Principal:
    who.require("write")
    return who


def admin(who: Caller) -> Principal:
    who.require("admin")
    return who


def tenant(request: Request, who: Annotated[Principal, Depends(reader)]) -> Iterator[Tenant]:
    """The caller's own tenant, open for the length of the request."""
    with server_state(request).tenants.use(who.tenant) as opened:
        yield opened

"""Which addresses name this machine only (`--no-auth` is allowed there), and which `Host`
names a server answers to: one policy for every route and for MCP's own check.

DNS rebinding: a page on `attacker.example` makes its name resolve to 127.0.0.1, and the browser
then sends that page's requests to the local server with `Host: attacker.example` — same-origin
for the browser, so the page reads the answers. A server without keys (`--no-auth`) must answer
only to the names it was started under: loopback names by default, and any name given with
`--allow-host` (`server_allowed_hosts`). `HostGuard` refuses every other Host with 421 before any
route runs; MCP's transport security is configured from the same names (`mcp.transport_security`).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

__all__ = ["is_loopback", "LOOPBACK_NAMES", "allowed_host_names", "host_name", "HostGuard"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str, *, resolve: bool = True) -> bool:
    """Whether `host` is 127.0.0.0/8, ::1 or `localhost`; with `resolve`, also a name every
    address of which is loopback."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        if not resolve:
            return False
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(name, None))
        except (OSError, ValueError):
            return False


def _bracketed(name: str) -> str:
    name = name.strip().strip("[]").lower()
    return f"[{name}]" if ":" in name else name


def allowed_host_names(listen: str, extra: Iterable[str] = ()) -> list[str] | None:
    """The Host names (without a port) a server listening on `listen` answers to: that address,
    every loopback name when it is a loopback address, and `extra` (`--allow-host`). None when
    they cannot be known: a wildcard address (0.0.0.0, ::) and nothing in `extra` — there every
    request needs a key (`--no-auth` is refused off loopback), which a rebinding page cannot have."""
    added = {_bracketed(name) for name in extra if name.strip()}
    name = listen.strip().strip("[]")
    if name in ("", "0.0.0.0", "::"):
        return sorted(added) or None
    names = {_bracketed(name), *added}
    if is_loopback(name, resolve=False):  # no DNS lookup: this only picks the Host names to accept
        names |= set(LOOPBACK_NAMES)
    return sorted(names)


def host_name(header: str) -> str:
    """The name of a Host header, without its port, lowercased (IPv6 literals keep their brackets)."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HostGuard:
    """ASGI middleware: a request (or WebSocket) whose Host is not one of `names` gets 421
    Misdirected Request with the JSON error body, before any route runs; with `origins`, an HTTP
    request whose Origin names another host gets 403 with it (the MCP endpoint: the SDK's own
    check answered both in plain text)."""

    def __init__(self, app: App, *, names: Iterable[str], origins: bool = False) -> None:
        self.app = app
        self.names = frozenset(names)
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        sent = next((value.decode("latin-1") for key, value in headers if key == b"host"), "")
        origin = next((value.decode("latin-1") for key, value in headers if key == b"origin"), None)
        if host_name(sent) in self.names and (not self.origins or scope["type"] != "http" or origin is None
                                              or host_name(origin.split("://", 1)[-1]) in self.names):
            await self.app(scope, receive, send)
            return
        if host_name(sent) in self.names:  # the Host is ours, the page that sent it is not
            await _json_error(send, 403, "forbidden_origin", f"requests from Origin {str(origin)[:100]!r} are not "
                              f"answered here: it answers to pages of {', '.join(sorted(self.names))}")
            return
        if scope["type"] == "websocket":  # closing before accepting: the handshake is refused (HTTP 403)
            await send({"type": "websocket.close", "code": 4421, "reason": "this Host is not served here"})
            return
        await _json_error(send, 421, "misdirected_request", (
            f"this server does not answer to Host {sent[:100]!r}: it answers to {', '.join(sorted(self.names))} "
            "(start it with --allow-host NAME to add a name)"))


async def _json_error(send: Send, status: int, kind: str, message: str) -> None:
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

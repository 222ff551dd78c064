"""Where a webhook may be sent. A tenant admin names a URL and the server posts to it, so the URL is
a way to make the server call an address of the admin's choosing (server-side request forgery).

Never called: link-local addresses (169.254.0.0/16, fe80::/10) — a cloud's instance metadata
service lives there and hands out credentials — the known metadata names and addresses
(metadata.google.internal, 169.254.169.254, fd00:ec2::254, Alibaba's 100.100.100.200), and
addresses that are not a host (unspecified, multicast, broadcast, reserved). Loopback and private
networks are allowed by default: a self-hosted gieok's receivers usually live beside it. With
`webhook_public_only` only globally routable addresses are (a shared host, where the private
network is the operator's, not the tenant's).

The rules are applied to every address the name resolves to, at registration and again before
every attempt, and the attempt connects to the address that was checked (the Host header and the
TLS server name keep the URL's name), so a name that resolves to something else a moment later
(DNS rebinding) cannot slip through. Only http and https; redirects are never followed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from ..errors import InvalidInputError

__all__ = ["Target", "Resolver", "check_url", "check_address", "resolve_target", "system_resolver", "MAX_URL_CHARS",
           "AddressRefusedError"]

MAX_URL_CHARS = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> its addresses

_METADATA_NAMES = frozenset({
    "metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.internal", "metadata.tencentyun.com"})
_METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "168.63.129.16"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # a v4 address behind the well-known NAT64 prefix
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # Linux connects 0.x.y.z to this host


class AddressRefusedError(InvalidInputError):
    """A webhook URL, or an address its name resolves to, that the server will not call."""


@dataclass(frozen=True, slots=True)
class Target:
    """A checked URL: what to connect to, and what to call the host in Host and TLS."""

    url: str
    scheme: str
    host: str  # as in the URL, lowercase, no brackets
    port: int
    path: str  # path and query, what the request line carries

    @property
    def host_header(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return shown if self.port == default else f"{shown}:{self.port}"

    def url_for(self, address: str) -> str:
        """The URL with the host replaced by one of its checked addresses."""
        shown = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{shown}:{self.port}{self.path}"


def check_url(url: object) -> Target:
    """The URL's shape: http(s), a host, no credentials, no fragment. `AddressRefusedError` (400)
    with what is wrong; the addresses are checked by `resolve_target`."""
    if not isinstance(url, str) or not url.strip():
        raise AddressRefusedError("url must be an http:// or https:// URL")
    if len(url) > MAX_URL_CHARS or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise AddressRefusedError(f"url must be at most {MAX_URL_CHARS} characters, without spaces or control "
                                  "characters")
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AddressRefusedError(f"url is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise AddressRefusedError(f"url must be http:// or https://, not {parts.scheme or 'no scheme'}")
    if parts.username is not None or parts.password is not None:
        raise AddressRefusedError("url must not hold credentials (user:password@): put a token in the path, or "
                                  "check the signature")
    if parts.fragment:
        raise AddressRefusedError("url must not have a #fragment (it is never sent)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise AddressRefusedError("url has no host")
    if not host.isascii():  # an internationalised name: its ASCII form is what DNS and the Host header carry
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise AddressRefusedError(f"url's host {host!r} is not a valid domain name") from None
    if host in _METADATA_NAMES:
        raise AddressRefusedError(f"{host} is a cloud metadata service: webhooks never call it")
    literal = _literal(host)
    if literal is not None:
        check_address(literal, public_only=False)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def check_address(address: str | IPAddress, *, public_only: bool) -> IPAddress:
    """The address, if a webhook may be sent there; `AddressRefusedError` saying why not."""
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    if ip in _METADATA_ADDRESSES:
        raise AddressRefusedError(f"{ip} is a cloud metadata address: webhooks never call it")
    embedded = _embedded_v4(ip)
    where = embedded if embedded is not None else ip  # an IPv6 form of a v4 address: the v4 address decides
    if where in _METADATA_ADDRESSES:
        raise AddressRefusedError(f"{ip} is a cloud metadata address: webhooks never call it")
    if where.is_link_local:
        raise AddressRefusedError(f"{ip} is a link-local address (where cloud metadata services live): "
                                  "webhooks never call it")
    if where.is_unspecified or where.is_multicast or \
            (isinstance(where, ipaddress.IPv4Address) and (where.is_reserved or where in _THIS_NETWORK)):
        raise AddressRefusedError(f"{ip} is not a host address")
    if public_only and not where.is_global:
        raise AddressRefusedError(f"{ip} is not a public address, and this server sends webhooks to public "
                                  "addresses only (webhook_public_only)")
    return ip


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (::ffff:a.b.c.d, NAT64, 6to4, Teredo), if any: it is
    where the connection ends up, so it is checked too."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (getaddrinfo, in a worker thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def resolve_target(target: Target, *, public_only: bool, resolver: Resolver = system_resolver,
                         timeout: float = 5.0) -> str:
    """The address to connect to: every address the host resolves to must pass `check_address`
    (one bad one refuses the URL: which one a client gets is not ours to choose); the first is
    returned. `AddressRefusedError` when the name does not resolve or an address is refused."""
    literal = _literal(target.host)
    if literal is not None:
        return str(check_address(literal, public_only=public_only))
    try:
        addresses = await asyncio.wait_for(resolver(target.host, target.port), timeout)
    except (OSError, TimeoutError, UnicodeError) as exc:
        raise AddressRefusedError(f"{target.host} does not resolve: {exc or type(exc).__name__}") from None
    if not addresses:
        raise AddressRefusedError(f"{target.host} does not resolve")
    for address in addresses:
        try:
            check_address(address, public_only=public_only)
        except AddressRefusedError as exc:
            raise AddressRefusedError(f"{target.host} resolves to {address}, and {exc}") from None
        except ValueError:
            raise AddressRefusedError(f"{target.host} resolves to {address!r}, not an IP address") from None
    return str(ipaddress.ip_address(addresses[0].split("%", 1)[0]))

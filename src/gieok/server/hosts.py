"""Which addresses name this machine only: `--no-auth` is allowed there, and MCP's Host check
accepts every loopback name there."""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["is_loopback"]


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

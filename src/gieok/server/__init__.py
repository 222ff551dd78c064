"""`gieok serve`: the memory over HTTP for other processes, languages and MCP clients.

- `auth.py`: API keys; a caller is who their key says (tenant and role), never what they ask.
- `tenants.py`: one memory per tenant; the only place a tenant becomes a memory.
- `events.py`: the live event stream (per-tenant sequence, ring buffer, resume).
- `app.py`, `routes/`: the FastAPI app, REST v1, thin over the engine's own methods.
- `mcp.py`: the MCP server (tools over the same tenants), stdio and streamable HTTP.

The names below load on first use (PEP 562): `gieok keys` reads `gieok.server.auth` without the
`server` extra (FastAPI, uvicorn, the MCP SDK) installed, and `import gieok.server.auth` must not
pull them in through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app
    from .auth import ROLES, ApiKeys, Principal
    from .events import Event, EventBus
    from .state import ServerState
    from .tenants import DEFAULT_TENANT, TenantRegistry, tenant_location, tenant_path

__all__ = ["create_app", "ServerState", "ApiKeys", "Principal", "ROLES", "EventBus", "Event", "TenantRegistry",
           "tenant_path", "tenant_location", "DEFAULT_TENANT"]

_WHERE = {"create_app": "app", "ServerState": "state", "ApiKeys": "auth", "Principal": "auth", "ROLES": "auth",
          "EventBus": "events", "Event": "events", "TenantRegistry": "tenants", "tenant_path": "tenants",
          "tenant_location": "tenants", "DEFAULT_TENANT": "tenants"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)

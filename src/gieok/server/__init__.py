"""`gieok serve`: the memory over HTTP for other processes, languages and MCP clients.

- `auth.py`: API keys; a caller is who their key says (tenant and role), never what they ask.
- `tenants.py`: one memory file per tenant; the only place a tenant becomes a memory.
- `events.py`: the live event stream (per-tenant sequence, ring buffer, resume).
- `app.py`, `routes/`: the FastAPI app, REST v1, thin over the engine's own methods.
- `mcp.py`: the MCP server (tools over the same tenants), stdio and streamable HTTP.
"""

from .app import create_app
from .auth import ROLES, ApiKeys, Principal
from .events import Event, EventBus
from .state import ServerState
from .tenants import DEFAULT_TENANT, TenantRegistry, tenant_location, tenant_path

__all__ = ["create_app", "ServerState", "ApiKeys", "Principal", "ROLES", "EventBus", "Event", "TenantRegistry",
           "tenant_path", "tenant_location", "DEFAULT_TENANT"]

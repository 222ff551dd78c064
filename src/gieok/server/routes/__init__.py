"""The REST API's routers, one module per area; each route is a thin call into the engine.

Each module's routers are split by the role they need (`reads`, `writes`, `admins`), each with
its role gate as a router-level dependency: a route gets its gate from where it is declared."""

from fastapi import APIRouter

from . import conversation, events, memories, people, system, webhooks

__all__ = ["ROUTERS"]

ROUTERS: list[APIRouter] = [system.public, *memories.ROUTERS, *conversation.ROUTERS, *people.ROUTERS,
                           *system.ROUTERS, *events.ROUTERS, *webhooks.ROUTERS]

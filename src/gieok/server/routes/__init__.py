"""The REST API's routers, one module per area; each route is a thin call into the engine."""

from fastapi import APIRouter

from . import conversation, events, memories, system

__all__ = ["ROUTERS"]

ROUTERS: list[APIRouter] = [system.public, memories.router, conversation.router, system.router, events.router]

"""The tenant's webhook endpoints (server/webhooks.py): register, list, delete, rotate a secret, and
see what was delivered. An admin's: an endpoint receives every event of the tenant, and makes the
server call an address. The tenant is the caller's key's; another tenant's endpoint is not found."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..deps import Caller, admin, server_state
from ..responses import json_response
from ..webhook_addresses import MAX_URL_CHARS
from ..webhooks import MAX_EVENT_NAMES, ROTATION_GRACE_SECONDS

__all__ = ["ROUTERS", "WebhookIn"]

admins = APIRouter(prefix="/v1", tags=["webhooks"], dependencies=[Depends(admin)])
ROUTERS = [admins]

EndpointId = Annotated[int, Path(ge=1, le=2**62)]


class WebhookIn(BaseModel):
    """An endpoint to register: where, and which events (every one when `events` is left out)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(max_length=MAX_URL_CHARS, description="http:// or https:// URL the events are posted to")
    events: list[Annotated[str, Field(max_length=100)]] | None = Field(
        None, max_length=MAX_EVENT_NAMES, description="event types (memory.added) or families (fact.*); all if none")


@admins.post("/webhooks", status_code=201,
             summary="Register a webhook endpoint; its signing secret is in this answer only")
async def register_webhook(request: Request, body: WebhookIn, who: Caller) -> JSONResponse:
    row, secret = await server_state(request).webhooks.register(who.tenant, body.url, body.events)
    return json_response({**row.as_dict(), "secret": secret}, 201)


@admins.get("/webhooks", summary="This tenant's webhook endpoints (never their secrets)")
def list_webhooks(request: Request, who: Caller) -> JSONResponse:
    return json_response({"webhooks": [row.as_dict() for row in server_state(request).webhooks.endpoints(who.tenant)]})


@admins.delete("/webhooks/{webhook_id}", summary="Delete an endpoint; what was not delivered yet is dropped")
def delete_webhook(request: Request, webhook_id: EndpointId, who: Caller) -> JSONResponse:
    server_state(request).webhooks.delete(who.tenant, webhook_id)
    return json_response({"deleted": webhook_id})


@admins.post("/webhooks/{webhook_id}/rotate",
             summary="A new signing secret (shown once); the old one also signs for a day")
def rotate_webhook_secret(request: Request, webhook_id: EndpointId, who: Caller) -> JSONResponse:
    row, secret = server_state(request).webhooks.rotate(who.tenant, webhook_id)
    return json_response({**row.as_dict(), "secret": secret, "previous_secret_valid_until": row.previous_until,
                          "grace_seconds": ROTATION_GRACE_SECONDS})


@admins.get("/webhooks/{webhook_id}/deliveries",
            summary="The endpoint's deliveries, newest first: status, attempts, next try, last status and error")
async def list_deliveries(request: Request, webhook_id: EndpointId, who: Caller,
                          limit: Annotated[int, Query(ge=1, le=200)] = 50,
                          before: Annotated[int | None, Query(ge=1, le=2**62,
                                                              description="next_before of the page before")] = None,
                          ) -> JSONResponse:
    webhooks = server_state(request).webhooks
    rows = await run_in_threadpool(webhooks.deliveries, who.tenant, webhook_id, before=before, limit=limit)
    return json_response({"deliveries": [row.as_dict() for row in rows],
                          "next_before": rows[-1].delivery_id if len(rows) == limit else None})

"""The memory as a whole (stats, verify, export, import), health, and the tenant's own keys."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...errors import ImportFormatError, NotFoundError
from ..deps import Caller, admin, reader, server_state, tenant, writer
from ..idempotency import idempotent
from ..models import KeyIn
from ..responses import json_response
from ..tenants import Tenant

__all__ = ["ROUTERS", "public"]

reads = APIRouter(prefix="/v1", tags=["memory"], dependencies=[Depends(reader)])
writes = APIRouter(prefix="/v1", tags=["memory"], dependencies=[Depends(writer)])
admins = APIRouter(prefix="/v1", tags=["keys"], dependencies=[Depends(admin)])
public = APIRouter(tags=["health"])  # no key: liveness and readiness only
ROUTERS = [reads, writes, admins]  # every route of this module behind its role's gate

TenantDep = Annotated[Tenant, Depends(tenant)]


@public.get("/healthz", summary="Liveness: the process answers (no key needed, nothing about any tenant)")
def healthz() -> JSONResponse:
    return json_response({"status": "ok"})


@public.get("/readyz", summary="Readiness: 200 once the model, the analyser and the tenants' indexes are loaded "
                                "(503 with Retry-After while warming; no key needed)")
def readyz(request: Request) -> JSONResponse:
    readiness = server_state(request).readiness
    if readiness.ready:
        return json_response(readiness.as_dict())
    headers = {"Retry-After": "1"} if readiness.status == "warming" else {}
    return json_response(readiness.as_dict(), 503, headers)


@reads.get("/stats", summary="Counts by kind, channels, embedder, index type, file size, layer counters")
def stats(t: TenantDep) -> JSONResponse:
    payload = t.memory.stats().as_dict()
    payload.pop("path", None)  # where the server keeps files is not the caller's business
    payload["layers"] = t.memory.layer_stats()
    return json_response(payload)


@reads.get("/verify", summary="Walk the hash chain and every content digest")
def verify(t: TenantDep) -> JSONResponse:
    return json_response(t.memory.verify().as_dict())


@reads.get("/export", summary="Every block, tombstones included, as streamed NDJSON (the `gieok export` format)")
def export(request: Request, who: Caller) -> StreamingResponse:
    state = server_state(request)

    def lines() -> Iterator[str]:  # the tenant stays open while the stream runs
        with state.access.tenant(who) as t:
            yield from t.memory.export_lines()

    return StreamingResponse(lines(), media_type="application/x-ndjson",
                             headers={"Content-Disposition": 'attachment; filename="gieok-export.jsonl"'})


@writes.post("/import", summary="Import an export (NDJSON body); nothing is written unless every line checks out; "
                            "blocks the memory holds already are skipped (Idempotency-Key: a retry imports once)")
async def import_(request: Request, t: TenantDep) -> Response:
    raw = await request.body()  # bounded by server_max_import_bytes (server/limits.py)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportFormatError("the body is not UTF-8 text") from None

    def run() -> JSONResponse:
        return json_response({"imported": t.memory.import_jsonl(io.StringIO(text))})

    return await idempotent(request, t, raw, lambda _: run_in_threadpool(run))  # imports skip blocks already there


@reads.get("/health", summary="Engine, embedder and (when a bot runs here) bot and provider health")
def health(request: Request, who: Caller, t: TenantDep) -> JSONResponse:
    state = server_state(request)
    memory = t.memory.stats()
    inner = t.memory.embedder.inner if memory.dimension else None  # not loaded for a memory with no vectors
    queued = getattr(inner, "queued", None)
    payload: dict[str, Any] = {
        "status": "ok", "uptime_s": round(time.time() - state.started, 1),
        "engine": {"blocks": memory.blocks, "vector_index": memory.vector_index},
        "embedder": {"name": memory.embedder, "dimension": memory.dimension,
                     "queued": queued() if callable(queued) else None, "engines": getattr(inner, "engines", None)},
        "events": {"last_seq": state.bus.last_seq(who.tenant), "subscribers": state.bus.subscribers(who.tenant)},
        "bot": None,
    }
    bot = state.bot
    if bot is not None and t.memory is bot.pipeline.memory:  # only the tenant that owns the bot sees it
        llm_health: Any = getattr(bot.llm, "health", None)
        payload["bot"] = {"health": bot.health.as_dict(),
                          "providers": llm_health.as_dict() if hasattr(llm_health, "as_dict") else None}
    return json_response(payload)


@admins.get("/keys", summary="This tenant's API keys (never the keys themselves)")
def list_keys(request: Request, who: Caller) -> JSONResponse:
    return json_response({"keys": [row.as_dict() for row in server_state(request).keys.keys(who.tenant)]})


@admins.post("/keys", status_code=201, summary="A new key for this tenant; shown once")
def create_key(request: Request, body: KeyIn, who: Caller) -> JSONResponse:
    key, row = server_state(request).keys.create(who.tenant, body.role, body.name)
    return json_response({"key": key, **row.as_dict()}, 201)


@admins.delete("/keys/{key_id}", summary="Revoke one of this tenant's keys, at once")
def revoke_key(request: Request, key_id: Annotated[int, Path(ge=1, le=2**62)], who: Caller) -> JSONResponse:
    if not server_state(request).keys.revoke(key_id, tenant=who.tenant):
        raise NotFoundError(f"no live key {key_id} in this tenant")
    return JSONResponse({"revoked": key_id})

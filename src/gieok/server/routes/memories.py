"""Blocks: remember one or a batch, read, list with filters and a cursor, forget, search."""

from __future__ import annotations

import base64
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from ...errors import InvalidInputError
from ...store.conversation import AppendHook
from ...types import Block
from ..deps import reader, tenant, writer
from ..idempotency import idempotent
from ..models import MAX_ID, BatchIn, Kind, MemoryIn, SearchIn
from ..responses import json_response
from ..tenants import Tenant

__all__ = ["ROUTERS"]

reads = APIRouter(prefix="/v1", tags=["memories"], dependencies=[Depends(reader)])
writes = APIRouter(prefix="/v1", tags=["memories"], dependencies=[Depends(writer)])
ROUTERS = [reads, writes]  # every route of this module behind its role\'s gate

TenantDep = Annotated[Tenant, Depends(tenant)]
BlockIndex = Annotated[int, Path(ge=1, le=2**62, description="A block index of the caller's memory")]


def _cursor(block_index: int) -> str:
    return base64.urlsafe_b64encode(f"b{block_index}".encode()).decode().rstrip("=")


def _before(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("b") or not raw[1:].isdigit():
            raise ValueError(raw)
        return int(raw[1:])
    except ValueError:
        raise InvalidInputError("cursor is not one this server gave out") from None


@writes.post("/memories", status_code=201, summary="Remember one block (Idempotency-Key: a retry stores it once)")
async def add_memory(request: Request, body: MemoryIn, t: TenantDep) -> Response:
    def add(within: AppendHook | None) -> JSONResponse:
        return _one([t.memory.add(**body.as_item(), within=within)])

    return await idempotent(request, t, body, lambda within: run_in_threadpool(add, within), answer=_one)


def _one(blocks: list[Block]) -> JSONResponse:
    return json_response(blocks[0].as_dict(), 201)


def _many(blocks: list[Block]) -> JSONResponse:
    return json_response({"blocks": [block.as_dict() for block in blocks]}, 201)


@writes.post("/memories:batch", status_code=201,
             summary="Remember up to 256 blocks in one transaction (Idempotency-Key: a retry stores them once)")
async def add_memories(request: Request, body: BatchIn, t: TenantDep) -> Response:
    def add(within: AppendHook | None) -> JSONResponse:  # every item checked before any write
        return _many(t.memory.add_many([item.as_item() for item in body.items], within=within))

    return await idempotent(request, t, body, lambda within: run_in_threadpool(add, within), answer=_many)


@reads.get("/memories/{block_index}", summary="One block")
def get_memory(block_index: BlockIndex, t: TenantDep) -> JSONResponse:
    return json_response(t.memory.get(block_index).as_dict())


@reads.get("/memories", summary="Blocks, newest first, filtered, a page at a time")
def list_memories(t: TenantDep,
                  guild: Annotated[str | None, Query(max_length=MAX_ID)] = None,
                  channel: Annotated[str | None, Query(max_length=MAX_ID)] = None,
                  user: Annotated[str | None, Query(max_length=MAX_ID)] = None,
                  kind: Annotated[list[Kind] | None, Query()] = None,
                  since: str | None = None, until: str | None = None,
                  cursor: Annotated[str | None, Query(max_length=64)] = None,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50) -> JSONResponse:
    scope = {k: v for k, v in (("guild", guild), ("channel", channel), ("user", user)) if v is not None}
    blocks = t.memory.list_blocks(scope=scope, kinds=kind, since=_time(since), until=_time(until),
                                  before=_before(cursor), limit=limit)
    more = len(blocks) == limit
    return json_response({"items": [b.as_dict() for b in blocks],
                          "next_cursor": _cursor(blocks[-1].block_index) if more else None})


def _time(value: str | None) -> float | str | None:
    """A query-string time: epoch seconds or ISO 8601 (the engine checks it)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return value


@writes.delete("/memories/{block_index}", summary="Forget a block (its content is erased; the chain still verifies)")
def forget_memory(block_index: BlockIndex, t: TenantDep) -> JSONResponse:
    erased = t.memory.forget([block_index])
    return JSONResponse({"forgotten": erased, "already_forgotten": not erased})


@reads.post("/search", summary="Hybrid search; hits with their score breakdown, the answering layer and the time")
def search(body: SearchIn, t: TenantDep) -> JSONResponse:
    result = t.memory.search(body.query, body.k, scope=body.scope.as_mapping() if body.scope else None,
                             kinds=body.kinds, since=body.since, until=body.until, mode=body.mode,
                             neighbours=body.neighbours)
    return json_response(result.as_dict())

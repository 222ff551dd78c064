"""The live event stream, the same events two ways: Server-Sent Events (`GET /v1/events`, easy
with curl) and a WebSocket (`/v1/events/ws`). `?since=SEQ` (or SSE's `Last-Event-ID`) resumes
after the last event seen; `since=0` replays everything the buffer holds; without it only new
events come. A caller sees their own tenant's events and nothing else, for as long as their key
(or dashboard session) stands: an open stream re-checks it every REVALIDATE_SECONDS and ends when it
was revoked (SSE: a last `stream.closed` event, `reason` "revoked"; WebSocket: close code 4401). When
the server stops, an SSE stream ends the same way within a second (`reason` "stopping": reconnect
with Last-Event-ID; server/stopping.py) and a WebSocket closes with 1012."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.websockets import WebSocketState

from ...errors import GieokError, InvalidInputError
from ..deps import Caller, principal_of, reader, server_state
from ..errors import status_of
from ..events import Event, SinceAheadError

__all__ = ["ROUTERS", "HEARTBEAT_SECONDS", "REVALIDATE_SECONDS"]

reads = APIRouter(prefix="/v1", tags=["events"], dependencies=[Depends(reader)])  # SSE
sockets = APIRouter(prefix="/v1", tags=["events"])  # a WebSocket is accepted first, then its key checked (4401/4403)
ROUTERS = [reads, sockets]
HEARTBEAT_SECONDS = 15.0  # an SSE comment now and then keeps proxies from closing an idle stream
REVALIDATE_SECONDS = 1.0  # an open stream re-checks its key (or session) this often: revoked, it is closed
_ENDED = {"type": "stream.closed", "reason": "revoked",
          "message": "this stream's API key was revoked or its session ended"}
_STOPPING = {"type": "stream.closed", "reason": "stopping",
             "message": "the server is stopping: reconnect with Last-Event-ID to resume"}

Since = Annotated[int | None, Query(ge=0, le=2**62, description="Resume after this sequence number")]


async def _erasures_heard(request: Request | WebSocket, tenant: str, since: int | None) -> None:
    """Before a replay (`since`) from this process's own buffer (no shared log: `--workers N`
    without Redis, or `gieok forget` beside the server), the tenant's memory hears of what other
    processes erased, so the replay carries no event of an erased block (`TenantRegistry.refresh`)."""
    state = server_state(request)
    if since is not None and state.bus.holds_blocks_of(tenant):
        await run_in_threadpool(state.tenants.refresh, tenant)


def _since(query: int | None, last_event_id: str | None) -> int | None:
    if query is not None:
        return query
    if last_event_id is None:
        return None
    if not last_event_id.strip().isdigit():
        raise InvalidInputError("Last-Event-ID must be a sequence number")
    return int(last_event_id.strip())


@reads.get("/events", summary="Server-Sent Events of this tenant: memory, search, summary, facts, guard, turns",
            response_class=StreamingResponse)
async def events_sse(request: Request, who: Caller,
                     since: Since = None) -> StreamingResponse:
    start = _since(since, request.headers.get("last-event-id"))
    state = server_state(request)
    bus, access, stopping = state.bus, state.access, state.stopping
    bus.check_since(who.tenant, start)  # 409 before the stream starts, not a silent wait
    await _erasures_heard(request, who.tenant, start)

    async def frames() -> AsyncIterator[str]:
        feed = bus.feed(who.tenant, start)
        yield ": gieok event stream\n\n"
        beat = checked = time.monotonic()
        try:
            while True:
                try:
                    event: Event | bool | None = await asyncio.wait_for(feed.next(), REVALIDATE_SECONDS)
                except TimeoutError:
                    event = False
                if stopping.is_set():  # uvicorn would wait for this stream until its graceful timeout
                    yield f"event: stream.closed\ndata: {json.dumps(_STOPPING)}\n\n"
                    return
                if time.monotonic() - checked >= REVALIDATE_SECONDS:  # revoked, or the session ended: stop
                    checked = time.monotonic()
                    if not await run_in_threadpool(access.still_valid, who):
                        yield f"event: stream.closed\ndata: {json.dumps(_ENDED)}\n\n"
                        return
                if event is False:
                    if time.monotonic() - beat >= HEARTBEAT_SECONDS:
                        beat = time.monotonic()
                        yield ": ping\n\n"
                    continue
                if event is None or event is True:
                    return
                head = f"id: {event.seq}\n" if event.seq else ""
                yield f"{head}event: {event.type}\ndata: {event.to_json()}\n\n"
        finally:
            feed.close()

    return StreamingResponse(frames(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@sockets.websocket("/events/ws")
async def events_ws(websocket: WebSocket, since: Since = None) -> None:
    """The same events as JSON text frames; the key comes in the Authorization header (or the
    dashboard's session cookie); without a valid one the socket closes at once (4401 / 4403)."""
    await websocket.accept()
    try:
        who = principal_of(websocket)
        who.require("read")
    except GieokError as exc:  # close codes 4401 / 4403 mirror the HTTP statuses
        status, _ = status_of(exc)
        await websocket.close(code=4000 + status, reason=str(exc)[:120])
        return
    bus = server_state(websocket).bus
    try:
        bus.check_since(who.tenant, since)
    except SinceAheadError as exc:
        await websocket.close(code=4409, reason=f"since_ahead: latest is {exc.latest}")
        return
    try:
        await _erasures_heard(websocket, who.tenant, since)
    except GieokError as exc:  # the tenant's memory could not be read (4503: its store is away)
        status, _ = status_of(exc)
        await websocket.close(code=4000 + status, reason=str(exc)[:120])
        return
    feed = bus.feed(who.tenant, since)
    access = server_state(websocket).access
    receiver = asyncio.create_task(_until_closed(websocket))
    checked = time.monotonic()
    try:
        next_event: asyncio.Task[Event | None] | None = None
        while True:
            next_event = next_event or asyncio.create_task(feed.next())
            done, _ = await asyncio.wait({next_event, receiver}, timeout=REVALIDATE_SECONDS,
                                         return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:  # the client left
                next_event.cancel()
                break
            if time.monotonic() - checked >= REVALIDATE_SECONDS:  # revoked, or the session ended: close
                checked = time.monotonic()
                if not await run_in_threadpool(access.still_valid, who):
                    next_event.cancel()
                    await websocket.close(code=4401, reason=_ENDED["message"][:120])
                    break
            if next_event not in done:
                continue
            event = next_event.result()
            next_event = None
            if event is None:
                break
            await websocket.send_text(event.to_json())
    except WebSocketDisconnect:
        pass
    finally:
        receiver.cancel()
        feed.close()
        connected = WebSocketState.CONNECTED
        if websocket.client_state is connected and websocket.application_state is connected:
            # the client left first: closing again is not an error (a normal disconnect logs nothing)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close()


async def _until_closed(websocket: WebSocket) -> None:
    """Reads (and ignores) what the client sends, to notice when it goes away."""
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            await websocket.receive_text()

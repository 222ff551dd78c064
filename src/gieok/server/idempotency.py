"""`Idempotency-Key` on the writes that create something: `POST /v1/memories`, `/v1/memories:batch`,
`/v1/import` and `/v1/conversations/messages`.

A client whose connection dropped cannot know whether its write was stored; it sends it again
with the same `Idempotency-Key` (the Python client does, on every retry). The first request with
a key claims it in the caller's own tenant (`store.idempotency`, a row per key, kept 24 h) and
runs; its answer is kept with the key. The same key again, within 24 h:

- with the same request (method, path and body — the JSON body as parsed, so spacing does not
  matter): the first answer, with `Idempotent-Replayed: true`, and nothing written;
- while the first is still running (the retry raced it): waits for it (up to `WAIT_SECONDS`) and
  answers the same; past that, 409 with `Retry-After`;
- with another request: 422 `idempotency_key_reused`.

A request refused or failed (4xx, 5xx: nothing was written) leaves no key behind, so a retry runs
again. The writes that store blocks (`/v1/memories`, `:batch`) record the stored block indices on
the key inside the blocks' own transaction; so a request whose process died mid-way (the key held,
no answer) is, once that process is known to be gone (same machine) or after `STALE_SECONDS`,
either answered from the blocks it stored (they committed) or run again (they did not) — never
stored twice. Each request holds its key under an id of its own, so a key that a failed request
could not give back (the database was down when it tried) does not hold up the retry that this
same process gets once the database is back. (`/v1/import` skips blocks already there and
conversation messages dedupe by id, so running those again stores nothing twice either.)

Keys are the tenant's: the same key sent by two tenants is two keys. Without the header nothing
changes (message ids still dedupe conversation messages)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from ..errors import InvalidInputError
from ..store.conversation import AppendHook
from ..store.idempotency import ORPHANED, IdempotencyRow, IdempotencyStore
from ..types import Block
from .errors import error_response
from .tenants import Tenant

__all__ = ["HEADER", "KEEP_SECONDS", "WAIT_SECONDS", "STALE_SECONDS", "idempotent"]

HEADER = "Idempotency-Key"
KEEP_SECONDS = 24 * 3600.0
WAIT_SECONDS = 60.0  # a retry waits this long for the first request with its key to finish
STALE_SECONDS = 900.0  # a key held this long without an answer, by a process that may be gone, is taken over
_POLL_SECONDS = 0.05
_MAX_KEY = 255
_HOST = socket.gethostname()
HOLDER = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"  # this process; a request holds HOLDER:<its own id>
_running: set[str] = set()  # the holders of the requests this process runs now


def _check_key(value: str) -> str:
    if not 1 <= len(value) <= _MAX_KEY or not all(33 <= ord(ch) <= 126 for ch in value):
        raise InvalidInputError(f"{HEADER} must be 1–{_MAX_KEY} printable ASCII characters without spaces "
                                "(a uuid4 is a good one)")
    return value


def _fingerprint(request: Request, body: BaseModel | bytes) -> str:
    digest = hashlib.sha256(f"{request.method} {request.url.path}\n".encode())
    if isinstance(body, BaseModel):
        digest.update(json.dumps(body.model_dump(mode="json"), sort_keys=True, ensure_ascii=False).encode())
    else:
        digest.update(body)
    return digest.hexdigest()


def _gone(holder: str) -> bool:
    """Whether the request that holds a key is known to be gone: one of this process that is not
    running any more (it failed and could not give its key back, e.g. the database was down), or
    one of another incarnation on this machine (a restart), whose pid is no longer alive or is
    this process's own."""
    if holder.startswith(HOLDER + ":"):
        return holder not in _running
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != _HOST or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    """A process that has exited but was not reaped yet (kill -9 of a `--workers N` worker: the
    supervisor reaps it when it next looks, seconds or a minute later) still answers kill(pid, 0)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (not Linux): alive as far as we can tell
    return stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"])


def _replay(status: int, body: str) -> Response:
    return JSONResponse(json.loads(body), status_code=status, headers={"Idempotent-Replayed": "true"})


Work = Callable[[AppendHook | None], Awaitable[Response]]
"""A write: given the hook to run inside its blocks' transaction (None: no key), its answer."""


async def idempotent(request: Request, tenant: Tenant, body: BaseModel | bytes, work: Work, *,
                     answer: Callable[[list[Block]], JSONResponse] | None = None) -> Response:
    """Run `work` (the write) under the request's `Idempotency-Key`, if it has one (module docstring).
    `answer`: for a write that stores blocks, its answer made from them — `work` passes the hook it
    gets to the append, and a retry of a request that died after its commit is answered by
    `answer` from the blocks the key recorded."""
    sent = request.headers.get(HEADER)
    if sent is None:
        return await work(None)
    key = _check_key(sent.strip())
    table = tenant.memory.store.idempotency
    fingerprint = _fingerprint(request, body)
    deadline = time.monotonic() + WAIT_SECONDS
    holder = f"{HOLDER}:{uuid.uuid4().hex[:12]}"
    _running.add(holder)  # before the claim: a retry in this process must never see it as gone
    try:
        return await _run_held(request, tenant, table, key, fingerprint, holder, deadline, work, answer)
    finally:
        _running.discard(holder)


async def _run_held(request: Request, tenant: Tenant, table: IdempotencyStore, key: str, fingerprint: str,
                    holder: str, deadline: float, work: Work,
                    answer: Callable[[list[Block]], JSONResponse] | None) -> Response:
    while True:
        found = await run_in_threadpool(_claim, table, key, fingerprint, holder)
        if found is None:
            break
        if found.fingerprint != fingerprint:
            return error_response(422, "idempotency_key_reused", f"this {HEADER} was used in the last 24 h with "
                                  "another request (another route or body); use a new key for a new request")
        if found.status is not None and found.response is not None:
            return _replay(found.status, found.response)
        if answer is not None and found.written is not None and _orphaned(found):
            return await run_in_threadpool(_answer_stored, tenant, table, found, answer)
        if time.monotonic() > deadline:
            busy = error_response(409, "idempotency_in_progress", f"a request with this {HEADER} is still "
                                  "running; retry later with the same key to get its answer")
            busy.headers["Retry-After"] = "5"
            return busy
        await asyncio.sleep(_POLL_SECONDS)
    try:
        response = await work(table.written_hook(key, holder) if answer is not None else None)
        if 200 <= response.status_code < 300 and isinstance(response, JSONResponse):
            await run_in_threadpool(table.finish, key, holder, response.status_code, bytes(response.body).decode())
            return response
    except BaseException:
        await run_in_threadpool(table.abandon, key, holder)  # keeps what it stored, for a retry's answer
        raise
    await run_in_threadpool(table.abandon, key, holder)
    return response


def _orphaned(row: IdempotencyRow) -> bool:
    """Whether a pending key's request will never answer: it failed after storing, its process is
    gone, or it has held the key past `STALE_SECONDS`."""
    return row.holder == ORPHANED or _gone(row.holder) or row.created_at < time.time() - STALE_SECONDS


def _answer_stored(tenant: Tenant, table: IdempotencyStore, row: IdempotencyRow,
                   answer: Callable[[list[Block]], JSONResponse]) -> Response:
    """The answer of a request that stored its blocks and died before it answered, made from those
    blocks and kept with the key (so every later retry gets the same)."""
    indices = row.written_indices or []
    found = tenant.memory.store.get_many(indices)
    response = answer([found[i] for i in indices if i in found])
    table.finish(row.key, row.holder, response.status_code, bytes(response.body).decode())
    response.headers["Idempotent-Replayed"] = "true"
    return response


def _claim(table: IdempotencyStore, key: str, fingerprint: str, holder: str) -> IdempotencyRow | None:
    now = time.time()
    return table.claim(key, fingerprint, holder, now, expire_before=now - KEEP_SECONDS,
                       stale_before=now - STALE_SECONDS, dead=_gone)

"""The data about people, in the caller's tenant: its users (list, everything held about one,
erasure) and the facts about them (list, state, correct, forget, history). A user or fact id
names data inside the caller's own memory only: another tenant's ids are simply not there (404).

Roles: reads list users and facts and show a fact's history; writes state, correct and forget
facts and erase a user (what a bot's "forget me" does); an access request — everything held about
one person — is an admin's (docs/privacy.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated
from urllib.parse import quote
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from ...chat.conversation.memory import check_id
from ...validate import check_time
from ..deps import Caller, admin, reader, server_state, tenant, writer
from ..models import MAX_ID, FactCorrectionIn, FactIn
from ..responses import json_response
from ..tenants import Tenant

__all__ = ["ROUTERS"]

reads = APIRouter(prefix="/v1", tags=["people"], dependencies=[Depends(reader)])
writes = APIRouter(prefix="/v1", tags=["people"], dependencies=[Depends(writer)])
admins = APIRouter(prefix="/v1", tags=["people"], dependencies=[Depends(admin)])
ROUTERS = [reads, writes, admins]

TenantDep = Annotated[Tenant, Depends(tenant)]
UserId = Annotated[str, Path(max_length=MAX_ID, description="A user's id in this tenant")]
FactId = Annotated[int, Path(ge=1, le=2**62, description="A fact's block index (any version)")]
Guild = Annotated[str | None, Query(max_length=MAX_ID, description="Only this guild's")]


def _zone(t: Tenant) -> ZoneInfo:
    return ZoneInfo(t.conversation.settings.timezone)


def _moment(value: str | None, what: str, zone: ZoneInfo) -> float | None:
    """A query parameter's time: epoch seconds or ISO 8601 (without a zone: the memory's)."""
    if value is None:
        return None
    try:
        return check_time(float(value), what)
    except ValueError:
        return check_time(value, what, zone=zone)


def _author(who: Caller) -> str:
    return f"key:{who.key_prefix}" if who.key_prefix else "local"


# -- users -------------------------------------------------------------------------------------------

@reads.get("/users", summary="This tenant's users: names seen, messages, facts, conversations, first and last seen")
def users(t: TenantDep, after: Annotated[str | None, Query(max_length=MAX_ID, description=(
              "The page after this user id (the previous page's `next`)"))] = None,
          limit: Annotated[int, Query(ge=1, le=500)] = 100) -> JSONResponse:
    found = t.conversation.tables.users_page(after, limit)
    return json_response({"users": [u.as_dict() for u in found],
                          "next": found[-1].user_id if len(found) == limit else None})


@admins.get("/users/{user}", summary="Everything held about one user (an access request), streamed as JSON")
def user_data(request: Request, who: Caller, user: UserId) -> StreamingResponse:
    """Messages with their conversations and times, the notes copied from them, current facts and
    fact history with sources, the statements of facts their messages made, the summary items made
    from them — written as it is read, so a user with many messages costs no more memory."""
    check_id(user, "user")
    state = server_state(request)

    def parts() -> Iterator[str]:  # the tenant stays open while the stream runs
        with state.access.tenant(who) as t:
            yield from t.conversation.user_data(user)

    # a header is Latin-1: the user id (민지) goes in filename*, an ASCII name beside it
    disposition = f"attachment; filename=\"gieok-user.json\"; filename*=UTF-8''gieok-user-{quote(user)}.json"
    return StreamingResponse(parts(), media_type="application/json", headers={"Content-Disposition": disposition})


async def _erase(request: Request, t: Tenant, who: Caller, user: str) -> JSONResponse:
    check_id(user, "user")
    if t._pipeline is not None:  # a background extraction could write a fact of theirs back
        await t._pipeline.drain()
    resumed = await run_in_threadpool(t.conversation.erasure_unfinished, user)
    receipt = await run_in_threadpool(t.conversation.forget_user, user, reason=_author(who))
    # resumed: an earlier request erased part of it and was cut short (a 503 after the database went
    # away mid-way, which the client retries): these counts are only what was left
    return json_response({"user": user, "erased": receipt, "resumed": resumed})


@writes.delete("/users/{user}", summary="Erase everything of one user: messages, what came from them, facts, "
                                        "summary items (a receipt with counts)")
async def forget_user(request: Request, who: Caller, user: UserId, t: TenantDep) -> JSONResponse:
    """Follows lineage (docs/privacy.md); atomic per store (a crash leaves it to finish on the next
    open); the hash chain still verifies. Other users' messages that name them stay."""
    return await _erase(request, t, who, user)


@writes.delete("/facts/users/{user}", summary="Erase everything of one user (the older name of DELETE /v1/users/…)")
async def forget_user_alias(request: Request, who: Caller, user: UserId, t: TenantDep) -> JSONResponse:
    return await _erase(request, t, who, user)


# -- facts ---------------------------------------------------------------------------------------------

@reads.get("/facts", summary="Facts (L3): current ones, or with history (superseded, with validity)")
def facts(t: TenantDep, user: Annotated[str | None, Query(max_length=MAX_ID)] = None,
          guild: Guild = None, history: bool = False,
          limit: Annotated[int, Query(ge=1, le=1000)] = 200,
          as_of: Annotated[str | None, Query(max_length=40, description=(
              "Only what was true then, on the conversation's clock (ISO 8601 or epoch seconds)"))] = None,
          known_at: Annotated[str | None, Query(max_length=40, description=(
              "As gieok knew it then: only what it had learned by that time (ISO 8601 or epoch seconds)"))] = None,
          ) -> JSONResponse:
    zone = _zone(t)
    found = t.conversation.facts.facts(user_id=check_id(user, "user", optional=True),
                                       guild=check_id(guild, "guild", optional=True), include_history=history,
                                       limit=limit, as_of=_moment(as_of, "as_of", zone),
                                       known_at=_moment(known_at, "known_at", zone))
    return json_response({"facts": [fact.as_dict() for fact in found]})


@writes.post("/facts", status_code=201, summary="State a fact about a user (or a guild): an operator's or agent's")
def add_fact(body: FactIn, who: Caller, t: TenantDep) -> JSONResponse:
    """Judged against the subject's facts as an extracted one is: a repeat is a duplicate, a new
    value of the same thing supersedes the old one. Its source is the key that wrote it."""
    outcome = t.conversation.state_fact(body.text, user=check_id(body.user, "user", optional=True),
                                        guild=check_id(body.guild, "guild", optional=True), author=_author(who),
                                        topic=body.topic, when=check_time(body.valid_from, "valid_from",
                                                                          zone=_zone(t), future=False))
    return json_response({"action": outcome.action, "fact": outcome.fact.as_dict() if outcome.fact else None,
                          "replaced": outcome.replaced.as_dict() if outcome.replaced else None}, 201)


@writes.patch("/facts/{fact_id}", summary="Correct a fact: a new version takes its place in its history")
def correct_fact(fact_id: FactId, body: FactCorrectionIn, who: Caller, t: TenantDep) -> JSONResponse:
    when = check_time(body.valid_from, "valid_from", zone=_zone(t), future=False)
    outcome = t.conversation.correct_fact(fact_id, body.text, author=_author(who), valid_from=when)
    return json_response({"action": "corrected", "fact": outcome.fact.as_dict() if outcome.fact else None,
                          "replaced": outcome.replaced.as_dict() if outcome.replaced else None})


@writes.delete("/facts/{fact_id}", summary="Forget one version of a fact; its history forms again without it")
def forget_fact(fact_id: FactId, t: TenantDep) -> JSONResponse:
    return json_response({"fact": fact_id, "erased": t.conversation.facts.remove(fact_id)})


@reads.get("/facts/{fact_id}/history", summary="Every version of a fact: text, period, sources, when learned")
def fact_history(fact_id: FactId, t: TenantDep) -> JSONResponse:
    versions = t.conversation.facts.history(fact_id)
    return json_response({"fact": fact_id, "versions": [
        {**fact.as_dict(), "sources": [{"said_at": s.said_at, "message_id": s.name, "user": s.user_id,
                                        "author": s.author, "recorded_at": s.recorded_at} for s in sources]}
        for fact, sources in versions]})

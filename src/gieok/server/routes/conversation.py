"""Conversation memory: L1 recent messages (add, delete), L2 summaries (read; set the permanent core),
the context of an agent's next reply, working-memory slots, STM, checkpoints and layer counters (facts
and users: people.py).
A conversation is named by its channel and, outside DMs, its guild — inside the caller's tenant."""

from __future__ import annotations

from typing import Annotated
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from ...chat.agent.agents import agent_context
from ...chat.conversation.memory import check_id
from ...chat.conversation.recent import conversation_of
from ...types import Scope
from ..deps import reader, tenant, writer
from ..idempotency import idempotent
from ..models import MAX_ID, ContextIn, CoreIn, MessagesIn
from ..responses import json_response
from ..tenants import Tenant

__all__ = ["ROUTERS"]

reads = APIRouter(prefix="/v1", tags=["conversation"], dependencies=[Depends(reader)])
writes = APIRouter(prefix="/v1", tags=["conversation"], dependencies=[Depends(writer)])
ROUTERS = [reads, writes]  # every route of this module behind its role's gate

TenantDep = Annotated[Tenant, Depends(tenant)]
Channel = Annotated[str, Query(max_length=MAX_ID, description="The conversation's channel id")]
OptionalChannel = Annotated[str | None, Query(max_length=MAX_ID, description="Only this channel's")]
Guild = Annotated[str | None, Query(max_length=MAX_ID, description="Its guild (server); none in DMs")]


def _conversation(guild: str | None, channel: str) -> Scope:
    return conversation_of(check_id(guild, "guild", optional=True), str(check_id(channel, "channel")))


def _optional(guild: str | None, channel: str | None) -> dict[str, str | None]:
    return {} if channel is None else _conversation(guild, channel).as_dict()


MAX_MESSAGES = 500  # /conversations/messages: at most this many (L1 holds `l1_size`, 50 by default)


@reads.get("/conversations", summary="Conversations with recent messages, most recently active first")
def conversations(t: TenantDep,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSONResponse:
    return json_response({"conversations": t.conversation.channels(limit)})


@reads.get("/conversations/messages", summary="A conversation's recent messages (L1), oldest first")
def messages(t: TenantDep, channel: Channel, guild: Guild = None,
             limit: Annotated[int | None, Query(ge=1, le=MAX_MESSAGES)] = None) -> JSONResponse:
    """Default: every message L1 holds for it (the count `/conversations` shows), up to MAX_MESSAGES."""
    return json_response({"messages": t.conversation.recent_messages(_conversation(guild, channel),
                                                                     limit or MAX_MESSAGES)})


@writes.post("/conversations/messages", status_code=202,
             summary="Add an agent's messages to a conversation (L1, turns, working memory; then summaries, facts)")
async def add_messages(request: Request, body: MessagesIn, t: TenantDep) -> Response:
    """Each message stored as the bot stores its own, once per id (a retry is harmless: `duplicates`;
    with the same Idempotency-Key, the first answer); flagged messages are stored and marked, never
    learned from. 202: summaries and facts are updated in the background when a model is
    configured (`summaries_and_facts` says so). `index: "behind"` answers before the turn blocks are
    written (an agent loop's add, whose next call is the context: docs/agents.md)."""
    async def add() -> JSONResponse:
        pipeline = await run_in_threadpool(lambda: t.pipeline)  # built on first use: the guard's classifiers load
        result = await pipeline.add_messages(body.guild, body.channel, [m.model_dump() for m in body.messages],
                                             index=body.index)
        return json_response(result.as_dict(), 202)

    return await idempotent(request, t, body, lambda _: add())  # message ids dedupe a run after a crash


@writes.delete("/conversations/messages/{message_id:path}",  # an id may hold a "/" (sent as %2F)
               summary="Delete one message and what came from it (its turn, the facts only it stated)")
async def delete_message(message_id: Annotated[str, Path(max_length=MAX_ID)], t: TenantDep, channel: Channel,
                         guild: Guild = None) -> JSONResponse:
    """The message its sender deleted: its recent row, its turn block (forgotten: the hash chain
    still verifies), working memory and cached searches with it, and its statements of facts (a fact
    only it stated is erased; one said elsewhere too stays, dated by the rest). The id stays taken:
    sending it again stores nothing. 404 for an id this conversation never stored."""
    pipeline = await run_in_threadpool(lambda: t.pipeline)
    return json_response(await pipeline.delete_message(guild, channel, message_id))


@reads.post("/conversations/context",
            summary="The context for an agent's next reply: facts, summary, recalled turns, recent messages")
def context(body: ContextIn, t: TenantDep) -> JSONResponse:
    """What to put in the next prompt, within `budget_tokens`: as `parts` and as one `text` block.
    A conversation this memory has never seen answers `"conversation": null` and a warning naming
    the channel and guild it looked for (and the guild that channel is in, if another)."""
    settings = t.gatherer.settings
    found = agent_context(t.gatherer, body.guild, body.channel, user=body.user, query=body.query,
                          budget_tokens=body.budget_tokens, include=body.include, zone=ZoneInfo(settings.timezone),
                          assistant_name=settings.bot_name)
    return json_response(found.as_dict())


@reads.get("/conversations/summary", summary="A conversation's rolling summary (L2)")
def summary(t: TenantDep, channel: Channel, guild: Guild = None) -> JSONResponse:
    return json_response(t.conversation.summary_view(_conversation(guild, channel)))


@writes.put("/conversations/summary/core", summary="Replace a conversation's permanent core")
def set_core(body: CoreIn, t: TenantDep) -> JSONResponse:
    conversation = _conversation(body.guild, body.channel)
    t.conversation.summaries.set_core(conversation, [line for line in body.core if line.strip()])
    return json_response(t.conversation.summary_view(conversation))


@reads.get("/working-memory", summary="Working-memory slots with their priority parts and checkpoints")
def working_memory(t: TenantDep, channel: OptionalChannel = None, guild: Guild = None) -> JSONResponse:
    return json_response({"slots": t.memory.working_slots(_optional(guild, channel)),
            "statistics": t.memory.working.statistics()})


@reads.get("/stm", summary="Live short-term memory entries, newest first")
def stm(t: TenantDep, channel: OptionalChannel = None, guild: Guild = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> JSONResponse:
    return json_response({"entries": t.memory.stm_entries(_optional(guild, channel), limit)})


@reads.get("/checkpoints", summary="Each slot's checkpoints into long-term memory")
def checkpoints(t: TenantDep, channel: OptionalChannel = None, guild: Guild = None) -> JSONResponse:
    return json_response({"checkpoints": [{"conversation": slot["conversation"], "slot": slot["slot"],
                             "checkpoints": slot["checkpoints"]}
                            for slot in t.memory.working_slots(_optional(guild, channel))]})


@reads.get("/layers", summary="Per-layer attempts, answers, hit rate and mean time (this process)")
def layers(t: TenantDep) -> JSONResponse:
    return json_response(t.memory.layer_stats())

"""The MCP server: gieok's memory as tools a model can call, over stdio (`gieok mcp`) and over
streamable HTTP at `/mcp` inside `gieok serve` (mounted by mcp_http.py, which loads this module at the
first MCP request).

Who the caller is never comes from a tool argument. Over HTTP it comes from the bearer key: the
SDK's bearer middleware hands every request's `Authorization` header to `KeyVerifier`, which asks
the key table (so a revoked key is refused from its next request on) and returns an `AccessToken`
whose claims carry the tenant and role; a tool reads them back with the SDK's `get_access_token()`.
Over stdio there is no header: the key is checked once at start-up and its principal is fixed for
the process (its revocation is still checked on every call). Either way the tenant is opened only
through `state.access.tenant(...)`, in a worker thread: embedding and SQLite never block the loop.

`gieok mcp` answers `initialize` and `tools/list` before the memory is loaded: the Korean analyser,
the model and the caller's tenant load in a background thread (`StdioWarmup`) and a tool call waits
for them.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar
from zoneinfo import ZoneInfo

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette

from .. import __version__
from ..chat.agent.agents import agent_context
from ..chat.conversation.memory import check_id
from ..chat.conversation.recent import conversation_of
from ..errors import AuthenticationError, GieokError
from ..text import get_tokenizer
from ..validate import check_time
from . import compact
from .access import Access, Credentials
from .auth import ROLES, Principal
from .hosts import HostGuard, allowed_host_names
from .mcp_http import MCP_PATH
from .settings import ServerSettings
from .state import ServerState
from .tenants import Tenant

__all__ = ["MCP_PATH", "MAX_K", "build_mcp", "KeyVerifier", "principal_of_token", "transport_security",
           "mcp_http_app", "check_stdio_key", "run_stdio", "StdioWarmup", "WARM_AFTER_S"]

log = logging.getLogger("gieok.server.mcp")

MAX_K = 50  # search_memory returns at most this many hits: more would flood a model's context
MAX_FACTS = 200

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

INSTRUCTIONS = """gieok is a long-term memory for conversations (Korean, English or mixed). \
Call search_memory before answering anything that depends on what was said or learned earlier \
(people, preferences, plans, past events); call remember to keep something worth recalling later. \
Every tool works on the memory of the API key you connected with: there is no way, and no need, to \
name a tenant or an owner. Block indexes returned by search_memory and remember are what get_memory \
and forget_memory take.
gieok은 대화의 장기 기억입니다: 답하기 전에 search_memory로 찾고, 남길 만한 것은 remember로 저장하세요."""

# -- tool parameters (module level: the SDK resolves their annotations in this module) -----------
Kind = Literal["turn", "fact", "note", "summary"]
Id = Annotated[str, Field(min_length=1, max_length=100)]
Text = Annotated[str, Field(min_length=1, description=(
    "What to remember: one self-contained statement (who, what, when), in the language it was said. "
    "기억할 내용 (한 문장, 누가·무엇을·언제)."))]
KindArg = Annotated[Kind, Field(description=(
    "note (default): something to keep; fact: a lasting fact about someone or something; "
    "turn: a conversation message; summary: a summary of a conversation."))]
ChannelArg = Annotated[Id | None, Field(description="Channel (conversation) id it belongs to; omit for none. 채널 id.")]
GuildArg = Annotated[Id | None, Field(description="Guild (server / workspace) id; omit in DMs or for none. 서버 id.")]
SpeakerArg = Annotated[Id | None, Field(description="Who said or wrote it (a display name or user id).")]
ImportanceArg = Annotated[float, Field(ge=0.0, le=1.0, description="0–1; higher ranks it higher in searches.")]
TagsArg = Annotated[list[Annotated[str, Field(min_length=1, max_length=100)]] | None,
                    Field(max_length=64, description="Optional labels, e.g. [\"todo\"].")]
QueryArg = Annotated[str, Field(min_length=1, description=(
    "What to look for, in natural language or keywords, Korean or English. 찾을 내용."))]
KArg = Annotated[int, Field(description=f"How many hits (1–{MAX_K}; a larger number is cut to {MAX_K}).")]
SearchChannel = Annotated[Id | None, Field(description="Only this channel's blocks. 이 채널만.")]
SearchGuild = Annotated[Id | None, Field(description="Only this guild's blocks. 이 서버만.")]
KindsArg = Annotated[list[Kind] | None, Field(max_length=4, description="Only these kinds of block.")]
BlockIndexArg = Annotated[int, Field(ge=1, le=2**62, description=(
    "A block_index from search_memory or remember. 블록 번호."))]
UserArg = Annotated[Id | None, Field(description="Only facts about this user id (inside your memory). 이 사용자만.")]
HistoryArg = Annotated[bool, Field(description="Also superseded facts, with when each was valid. 이전 사실 포함.")]
FactGuild = Annotated[Id | None, Field(description="Only facts of this guild. 이 서버만.")]
LimitArg = Annotated[int, Field(ge=1, le=MAX_FACTS, description=f"At most this many facts (1–{MAX_FACTS}).")]
FactText = Annotated[str, Field(min_length=1, max_length=1000, description=(
    "One sentence; people as <user:ID>. 사실 한 문장 (사람은 <user:ID>)."))]
FactUser = Annotated[Id | None, Field(description="Whom it is about (a user id). 누구에 대한 사실인지.")]
FactGuildArg = Annotated[Id | None, Field(description=(
    "The guild where it holds; a fact about the guild itself needs it (and no user). 서버 id."))]
ValidFromArg = Annotated[str | float | None, Field(description=(
    "Since when it is true (ISO 8601 or epoch seconds); default now. 언제부터 사실인지."))]
FactIdArg = Annotated[int, Field(ge=1, le=2**62, description="The fact's block_index. 사실의 블록 번호.")]
MomentArg = Annotated[str | float | None, Field(description=(
    "Only the facts true at this time (ISO 8601 or epoch seconds), on the conversation's clock. 그 시점의 사실."))]
KnownAtArg = Annotated[str | float | None, Field(description=(
    "The facts as gieok knew them at this time (ISO 8601 or epoch seconds). 그 시점에 알던 사실."))]
SummaryChannel = Annotated[Id, Field(description="The conversation's channel id. 채널 id.")]
SummaryGuild = Annotated[Id | None, Field(description="Its guild id; omit for a DM. 서버 id (DM이면 생략).")]
DetailArg = Annotated[bool, Field(description=(
    "false (default): what you need, compactly (text, block_index, speaker, time, score). true: the full "
    "records (hashes, score parts, keywords, metadata): large, only for debugging. 자세히 보기."))]
ConversationChannel = Annotated[Id, Field(description="The conversation's channel (or thread) id. 대화(채널) id.")]


class MessageArg(BaseModel):
    """One message of the conversation, as the agent saw it."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(min_length=1, max_length=200, description=(
        "Your id for this message (stable: a retry with the same id is stored once). 메시지 id.")
    )]
    role: Literal["user", "assistant"]
    text: Annotated[str, Field(min_length=1, description="What was said. 내용.")]
    user: Annotated[Id | None, Field(description="Who wrote it (a user id; required for role user). 쓴 사람.")] = None
    name: Annotated[str | None, Field(max_length=100, description="Their display name. 표시 이름.")] = None
    time: Annotated[str | float | None, Field(description="When: ISO 8601 or epoch seconds; default now.")] = None


MessagesArg = Annotated[list[MessageArg], Field(min_length=1, max_length=256, description=(
    "The new messages, oldest first (up to 256). 새 메시지들 (오래된 것부터)."))]
IndexArg = Annotated[Literal["now", "behind"], Field(description=(
    "now (default): searchable when this answers. behind: answered once stored as recent messages (already "
    "in the next get_context), made searchable just after: faster. 검색 색인 시점."))]
ContextUser = Annotated[Id | None, Field(description=(
    "Who the next reply is for (a user id). In a guild the facts come from the whole guild whoever it is: "
    "about every member (this user and the others), the guild's own, and lore; in a direct conversation "
    "(no guild): this user's own facts and lore only. It also picks the default query. 답할 상대 id."))]
ContextQuery = Annotated[str | None, Field(description=(
    "What the next reply is about; default: the conversation's last user message. 다음 답의 주제."))]
BudgetArg = Annotated[int, Field(ge=100, le=32_000, description="At most this many tokens of context (100–32,000).")]
IncludeArg = Annotated[list[Literal["facts", "summary", "recalled", "recent"]] | None, Field(description=(
    "Which parts (default all): facts, summary, recalled (older turns), recent (the last messages)."))]


def _reads(title: str) -> ToolAnnotations:
    return ToolAnnotations(title=title, read_only_hint=True, open_world_hint=False)


def _writes(title: str, *, destructive: bool) -> ToolAnnotations:
    return ToolAnnotations(title=title, read_only_hint=False, destructive_hint=destructive,
                           idempotent_hint=destructive, open_world_hint=False)  # forgetting twice = once


def principal_of_token(token: AccessToken) -> Principal:
    """The principal `KeyVerifier` put into a token's claims (nothing else writes them)."""
    claims = token.claims or {}
    tenant, role = claims.get("tenant"), claims.get("role")
    if not isinstance(tenant, str) or role not in ROLES:
        raise AuthenticationError("this connection carries no gieok key")
    return Principal(tenant, str(role), claims.get("key_id"), claims.get("key_prefix"))


class KeyVerifier:
    """The SDK's `TokenVerifier` over the server's one access path: a bearer token is a gieok API
    key, resolved by `Access.principal` exactly as a REST request's is.

    Called by the SDK's bearer middleware on every HTTP request to /mcp; returning None makes the
    SDK answer 401. The key lookup (SQLite) runs in a worker thread."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            who = await anyio.to_thread.run_sync(self.access.principal, Credentials(bearer=token))
        except AuthenticationError:
            return None
        granted = list(ROLES[: ROLES.index(who.role) + 1])  # a role may do what the ones before it may
        return AccessToken(token=token, client_id=f"gk_{who.key_prefix}", scopes=granted, subject=who.tenant,
                           claims={"tenant": who.tenant, "role": who.role, "key_id": who.key_id,
                                   "key_prefix": who.key_prefix})


class StrictTool(Tool):
    """A tool whose arguments are exactly its parameters: its input schema says
    `additionalProperties: false` (an unknown argument, such as a tenant, is refused, never
    ignored) and refuses NaN and infinities; a refusal reads `invalid_input: <where>: <problem>`,
    the form of every other refusal (`_tool_error`), not pydantic's report."""

    @classmethod
    def strict(cls, fn: Callable[..., Any], **options: Any) -> StrictTool:
        tool = cls.from_function(fn, **options)
        assert isinstance(tool, StrictTool)
        loose = tool.fn_metadata.arg_model
        config = ConfigDict(**{**loose.model_config, "extra": "forbid", "allow_inf_nan": False})
        strict: type[BaseModel] = type(loose.__name__, (loose,), {"model_config": config,
                                                                  "__module__": loose.__module__})
        tool.fn_metadata.arg_model = strict  # type: ignore[assignment]  # a subclass of the SDK's own model
        tool.parameters = strict.model_json_schema(by_alias=True)
        return tool

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            raise ToolError(f"Error executing tool {self.name}: invalid_input: {self._problems(exc)}") from None
        return await super().run(arguments, context, convert_result=convert_result)

    def _problems(self, exc: ValidationError) -> str:
        taken = ", ".join(self.fn_metadata.arg_model.model_fields)
        said = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
            if error.get("type") == "extra_forbidden":
                said.append(f"{where}: unknown argument (this tool takes {taken})")
            else:
                said.append(f"{where}: {error.get('msg', 'invalid')}")
        return "; ".join(said)


def _author(who: Principal) -> str:
    return f"key:{who.key_prefix}" if who.key_prefix else "local"


def _tool_error(exc: GieokError) -> ToolError:
    """A gieok error as a tool error the model can read: `<type>: <message>`."""
    from .errors import status_of  # it imports FastAPI: loaded on the first error, not at `gieok mcp`'s start

    _, kind = status_of(exc)
    return ToolError(f"{kind}: {exc}")


def build_mcp(state: ServerState, *, fixed: Principal | None = None,
              loaded: Callable[[bool], None] | None = None) -> MCPServer:
    """The MCP server over `state`'s tenants.

    `fixed`: the principal of every call (stdio, where the key was checked at start-up). Without
    it each call's principal is the one of the HTTP request's bearer key (or, on a `--no-auth`
    loopback server, the default tenant's admin); with neither, every tool refuses. `loaded`:
    called in the worker thread of every tool call before it opens a tenant, with whether the call
    needs the conversation pipeline; it returns once what the call needs is loaded (stdio:
    `StdioWarmup.wait`)."""
    http_auth = fixed is None and state.auth
    tools: list[Tool] = []

    def caller() -> Principal:
        if fixed is not None:
            return fixed
        if not state.auth:
            return state.access.principal(Credentials())  # a --no-auth loopback server: the default tenant
        token = get_access_token()  # verified by KeyVerifier (Access.principal) on this HTTP request
        if token is None:
            raise ToolError("unauthenticated: no API key came with this call")
        try:
            return principal_of_token(token)
        except AuthenticationError as exc:
            raise _tool_error(exc) from exc

    def still_valid(who: Principal) -> None:
        """A fixed (stdio) key revoked while the process runs is refused from the next call on."""
        if fixed is None or who.key_prefix is None:
            return
        row = state.keys.table.by_prefix(who.key_prefix)
        if row is None or row.revoked_at is not None or row.key_id != who.key_id:
            raise AuthenticationError("this API key has been revoked")

    def tool(annotations: ToolAnnotations) -> Callable[[F], F]:
        """Register a tool; its description is its docstring without the source indentation."""
        def register(fn: F) -> F:
            tools.append(StrictTool.strict(fn, description=inspect.cleandoc(fn.__doc__ or ""), annotations=annotations))
            return fn

        return register

    async def in_tenant(role: str, work: Callable[[Tenant], T]) -> T:
        """`work` on the caller's own tenant, in a worker thread, once their role allows it."""
        who = caller()
        if not who.can(role):
            raise ToolError(f"forbidden: this key's role is {who.role}; {role} is needed")

        def run() -> T:
            if loaded is not None:
                loaded(False)
            still_valid(who)
            with state.access.tenant(who) as tenant:
                return work(tenant)

        try:
            return await anyio.to_thread.run_sync(run)
        except GieokError as exc:
            raise _tool_error(exc) from exc

    async def in_tenant_async(role: str, work: Callable[[Tenant], Awaitable[T]]) -> T:
        """`work` awaited on this loop (it runs the pipeline's own async steps) on the caller's own
        tenant, opened in a worker thread first."""
        who = caller()
        if not who.can(role):
            raise ToolError(f"forbidden: this key's role is {who.role}; {role} is needed")
        try:
            def open_it() -> Tenant:
                if loaded is not None:
                    loaded(True)  # the pipeline's steps: add_messages
                still_valid(who)
                return state.access.open_tenant(who)

            tenant = await anyio.to_thread.run_sync(open_it)
            try:
                return await work(tenant)
            finally:
                state.access.release(tenant)
        except GieokError as exc:
            raise _tool_error(exc) from exc

    @tool(_writes("Remember", destructive=False))
    async def remember(text: Text, kind: KindArg = "note", channel: ChannelArg = None, guild: GuildArg = None,
                       speaker: SpeakerArg = None, importance: ImportanceArg = 0.5,
                       tags: TagsArg = None, detail: DetailArg = False) -> dict[str, Any]:
        """Store one piece of information in long-term memory so that search_memory finds it later.

        Use it for things worth recalling in a later conversation: facts about people, preferences,
        decisions, plans, events. One idea per call, written so it makes sense on its own. Returns the
        stored block; its `block_index` is what get_memory and forget_memory take. Needs a key with
        the write role. Text is at most the server's max_text_chars (100,000 by default).
        장기 기억에 하나를 저장합니다 (사람·취향·약속·사건처럼 나중에 떠올릴 것, 한 번에 하나씩).
        """
        scope = {name: value for name, value in (("guild", guild), ("channel", channel)) if value is not None}
        def add(t: Tenant) -> dict[str, Any]:
            stored = t.memory.add(text, kind=kind, scope=scope or None, speaker=speaker, importance=importance,
                                  tags=tags)
            return stored.as_dict() if detail else compact.block(stored)

        return await in_tenant("write", add)

    @tool(_reads("Search memory"))
    async def search_memory(query: QueryArg, k: KArg = 5, channel: SearchChannel = None, guild: SearchGuild = None,
                            kinds: KindsArg = None, detail: DetailArg = False) -> dict[str, Any]:
        """Search long-term memory (hybrid: keywords and meaning, Korean and English alike).

        Use it before answering anything that depends on earlier conversations or stored facts.
        Returns `hits` (best first), each with its `block_index`, `text`, `score`, `speaker` and
        `time`; `source` is the layer that answered (working_memory, cache, checkpoint or full) and
        `search_time_ms` how long it took. An empty `hits` means nothing matched. k is 1–50.
        With detail=true each hit is the full record with the score's breakdown (large).
        장기 기억을 검색합니다 (키워드+의미, 한국어·영어). 결과: 점수 내역, 응답한 계층, 검색 시간.
        """
        k = max(1, min(MAX_K, k))
        scope = {name: value for name, value in (("guild", guild), ("channel", channel)) if value is not None}
        def search(t: Tenant) -> dict[str, Any]:
            result = t.memory.search(query, k, scope=scope or None, kinds=kinds)
            return result.as_dict() if detail else compact.search(result)

        return await in_tenant("read", search)

    @tool(_reads("Get a memory block"))
    async def get_memory(block_index: BlockIndexArg, detail: DetailArg = False) -> dict[str, Any]:
        """Read one block of memory by its block_index (from search_memory or remember).

        Returns the block: text, kind, time, speaker, scope (guild, channel, user) and `forgotten`
        (true: its content was erased); detail=true adds importance, keywords, tags, metadata and
        its place in the hash chain. A block index that does not exist in your memory is an error
        saying it was not found.
        블록 번호로 기억 하나를 읽습니다. 없는 번호면 찾을 수 없다는 오류입니다.
        """
        return await in_tenant("read", lambda t: t.memory.get(block_index).as_dict() if detail
                               else compact.block(t.memory.get(block_index)))

    @tool(_writes("Forget a memory block", destructive=True))
    async def forget_memory(block_index: BlockIndexArg) -> dict[str, Any]:
        """Erase the content of one block (its text, speaker, keywords, tags, vector) for good.

        Use it when someone asks for something to be forgotten or a stored memory is wrong. The
        block's place in the hash chain stays, so the memory still verifies. Returns
        `forgotten` (the indexes erased now) and `already_forgotten`. Cannot be undone. Needs a key
        with the write role; an index not in your memory is a not-found error.
        블록 하나의 내용을 영구히 지웁니다 (되돌릴 수 없음, write 권한 필요).
        """
        def forget(t: Tenant) -> dict[str, Any]:
            erased = t.memory.forget([block_index])
            return {"block_index": block_index, "forgotten": erased, "already_forgotten": not erased}

        return await in_tenant("write", forget)

    @tool(_reads("List facts"))
    async def list_facts(user: UserArg = None, history: HistoryArg = False, guild: FactGuild = None,
                         limit: LimitArg = 50, as_of: MomentArg = None, known_at: KnownAtArg = None,
                         detail: DetailArg = False) -> dict[str, Any]:
        """List the facts (L3) learned from conversations: about users, guilds and the world.

        Use it to see what is known about someone (`user`) without a search query. Returns `facts`,
        each with its `block_index` (what correct_fact and forget_fact take), text, type, user and
        guild, validity (`valid_from`, `valid_to`) and whether it is current (detail=true: also topic,
        sources and the rest of the record); with history=true superseded facts are included too;
        `as_of` (a time, ISO 8601 or epoch seconds) gives what was true then, `known_at` what gieok
        knew then. At most `limit` (1–200, default 50).
        대화에서 알게 된 사실(L3) 목록입니다. user로 한 사람의 사실만, history로 지난 사실까지,
        as_of로 그때 사실이던 것, known_at으로 그때 알고 있던 것.
        """
        def facts(t: Tenant) -> dict[str, Any]:
            zone = ZoneInfo(t.conversation.settings.timezone)
            found = t.conversation.facts.facts(user_id=check_id(user, "user", optional=True),
                                               guild=check_id(guild, "guild", optional=True),
                                               include_history=history, limit=limit,
                                               as_of=check_time(as_of, "as_of", zone=zone),
                                               known_at=check_time(known_at, "known_at", zone=zone))
            return {"facts": [fact.as_dict() if detail else compact.fact(fact) for fact in found], "count": len(found)}

        return await in_tenant("read", facts)

    @tool(_writes("Remember a fact", destructive=False))
    async def remember_fact(text: FactText, user: FactUser = None, guild: FactGuildArg = None,
                            valid_from: ValidFromArg = None) -> dict[str, Any]:
        """State a fact about a user (or a guild) that you learned or were told, naming people as <user:ID>.

        It is judged against what is known about them as an extracted fact is: a repeat is a duplicate (nothing
        new stored), a new value of the same thing (a new home, job, pet …) supersedes the old one, which stays
        in the history. `valid_from` (ISO 8601 or epoch seconds) says since when it is true; default now.
        Returns `action` (stored, duplicate, superseded, history) and the fact, whose `block_index` is its id
        for correct_fact and forget_fact. Your key is recorded as its source. Needs the write role.
        사용자(또는 서버)에 대한 사실 하나를 기억합니다. 같은 항목의 새 값은 이전 값을 대체합니다.
        """
        def add(t: Tenant) -> dict[str, Any]:
            when = check_time(valid_from, "valid_from", zone=ZoneInfo(t.conversation.settings.timezone),
                              future=False)
            outcome = t.conversation.state_fact(text, user=user, guild=guild, author=_author(caller()), when=when)
            return {"action": outcome.action, "fact": compact.fact(outcome.fact) if outcome.fact else None,
                    "block_index": outcome.fact.block_index if outcome.fact else None}

        return await in_tenant("write", add)

    @tool(_writes("Correct a fact", destructive=False))
    async def correct_fact(fact_id: FactIdArg, text: FactText) -> dict[str, Any]:
        """Correct a fact that was wrong (from list_facts or get_context's parts: its block_index).

        A new version with the right text takes its place in its history, valid from when the wrong one
        was; the wrong one stays in the history, marked as superseded when it began. Your key is recorded
        as who corrected it. A fact id not in your memory is a not-found error. Needs the write role.
        틀린 사실을 바로잡습니다 (새 버전이 대신하고, 틀린 것은 기록에 남습니다).
        """
        def correct(t: Tenant) -> dict[str, Any]:
            outcome = t.conversation.correct_fact(fact_id, text, author=_author(caller()))
            return {"action": "corrected", "fact": compact.fact(outcome.fact) if outcome.fact else None,
                    "block_index": outcome.fact.block_index if outcome.fact else None}

        return await in_tenant("write", correct)

    @tool(_writes("Forget a fact", destructive=True))
    async def forget_fact(fact_id: FactIdArg) -> dict[str, Any]:
        """Erase one fact (one version, by its block_index); its history forms again without it.

        Use it when a fact is wrong and should not be replaced by another, or someone asks for it to be
        forgotten. Cannot be undone. A fact id not in your memory is a not-found error. Needs the write role.
        사실 하나를 지웁니다 (되돌릴 수 없음).
        """
        return await in_tenant("write", lambda t: {"fact": fact_id, "erased": t.conversation.facts.remove(fact_id)})

    @tool(_reads("Conversation summary"))
    async def conversation_summary(channel: SummaryChannel, guild: SummaryGuild = None,
                                   detail: DetailArg = False) -> dict[str, Any]:
        """The rolling summary (L2) of one conversation, named by its channel (and guild).

        Use it to catch up on a conversation: its topic, key points, open threads and the people in
        it. Returns `markdown` (the whole summary, rendered), `topic` and `updated_at`; detail=true
        returns every field instead (mood, stage, participants, key points, the permanent core lines,
        display names …). A conversation with no summary yet returns empty fields.
        대화 하나(채널)의 요약(L2)입니다: 주제, 요점, 참여자, 마크다운.
        """
        def summary(t: Tenant) -> dict[str, Any]:
            conversation = conversation_of(check_id(guild, "guild", optional=True), str(check_id(channel, "channel")))
            view = t.conversation.summary_view(conversation)
            return view if detail else {"markdown": view["markdown"], "topic": view.get("topic"),
                                        "updated_at": compact.when(view.get("updated_at"))}

        return await in_tenant("read", summary)

    @tool(_writes("Add messages", destructive=False))
    async def add_messages(channel: ConversationChannel, messages: MessagesArg, guild: GuildArg = None,
                           index: IndexArg = "now", detail: DetailArg = False) -> dict[str, Any]:
        """Add the newest messages of a conversation to memory; call it after every exchange.

        Each message: {id, role: user|assistant, text, user (who wrote it; required for role user),
        name, time}. They are stored as the conversation's recent messages and as searchable turns;
        a message whose id was stored before with the same text is not stored again (returned in
        `duplicates`), so sending a message twice is harmless; an id sent again with another text is
        an edit (the message is replaced, returned in `edited`). Summaries and facts about the users
        are then updated in the background when the server has a language model
        (`summaries_and_facts` says whether). Returns how many were stored, the duplicates, the
        edited and the flagged ones (a flagged message is kept but never learned from). Needs the
        write role.
        대화의 새 메시지를 기억에 추가합니다 (매 대화 후). 같은 id는 다시 저장되지 않습니다.
        """
        async def add(t: Tenant) -> dict[str, Any]:
            pipeline = await anyio.to_thread.run_sync(lambda: t.pipeline)
            result = await pipeline.add_messages(guild, channel, [m.model_dump() for m in messages], index=index)
            return result.as_dict() if detail else compact.ingested(result)

        return await in_tenant_async("write", add)

    @tool(_reads("Get context"))
    async def get_context(channel: ConversationChannel, guild: GuildArg = None, user: ContextUser = None,
                          query: ContextQuery = None, budget_tokens: BudgetArg = 2000, include: IncludeArg = None,
                          detail: DetailArg = False) -> dict[str, Any]:
        """The context to put in your next reply's system prompt, within a token budget.

        Returns `text`: one ready-to-use block — facts (with since when), the conversation's summary,
        related earlier messages and the recent messages — in the conversation's language. Call it
        before answering, with `user` set to who you answer. Which facts may come in: in a guild, the
        facts about any member of that guild recorded there (the user's and the other members'), the
        guild's own facts and lore (general facts); in a direct conversation (no guild), only the
        facts about `user` (from anywhere) and lore. Summary, earlier and recent messages come from
        this conversation only. Facts that changed come with their period when the question is about
        the past. A channel this memory has never seen answers `conversation: null` and a warning
        naming where it looked. detail=true adds the structured `parts` (each fact, turn and message
        with its time and score) and the timings.
        다음 답에 넣을 맥락(사실·요약·관련 대화·최근 대화)을 토큰 예산 안에서 돌려줍니다. 서버(길드)에서는
        그 서버 멤버 모두의 사실이, DM에서는 그 사용자의 사실만 들어옵니다.
        """
        def find(t: Tenant) -> dict[str, Any]:
            settings = t.gatherer.settings
            found = agent_context(t.gatherer, guild, channel, user=user, query=query, budget_tokens=budget_tokens,
                                  include=include, zone=ZoneInfo(settings.timezone), assistant_name=settings.bot_name)
            return found.as_dict() if detail else compact.context(found)

        return await in_tenant("read", find)

    server: MCPServer = MCPServer(
        tools=tools,
        name="gieok", title="gieok memory", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING",
        token_verifier=KeyVerifier(state.access) if http_auth else None,
        # AuthSettings wants an OAuth issuer; gieok keys are not OAuth tokens, and with no
        # resource_server_url and no provider nothing advertises it: the verifier alone decides.
        auth=AuthSettings(issuer_url=AnyHttpUrl(_origin(state.settings.server_host, state.settings.server_port)),
                          resource_server_url=None) if http_auth else None,
    )

    return server


# -- streamable HTTP inside `gieok serve` ---------------------------------------------------------

def _origin(host: str, port: int) -> str:
    name = host.strip("[]")
    return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"


def transport_security(host: str, extra: Iterable[str] = ()) -> TransportSecuritySettings:
    """DNS-rebinding protection for the address the server listens on: the Host (and any Origin)
    header must name it (`hosts.allowed_host_names`, the same names every other route of a
    `--no-auth` server answers to). On a loopback address every loopback name is accepted, and
    `extra` (`--allow-host`) everywhere. On a wildcard address (0.0.0.0, ::) with no `extra`, the
    names clients use cannot be known here, so the check is off: there every request needs a key
    anyway (`--no-auth` is refused off loopback), which is what a rebinding page cannot have."""
    hosts = allowed_host_names(host, extra)
    if hosts is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
        allowed_origins=[f"{scheme}://{h}{port}" for scheme in ("http", "https") for h in hosts for port in ("", ":*")],
    )


def mcp_http_app(server: MCPServer, host: str, extra_hosts: Iterable[str] = ()) -> Starlette:
    """The SDK's streamable HTTP app for `server`, answering at MCP_PATH, with the bearer-key
    middleware when the server has a verifier. Its session manager must be run by the host app.

    Stateless, with JSON answers: every tool call is one self-contained POST, authenticated on
    its own, so it works the same in any worker process of `gieok serve --workers N` (a session
    kept in one worker's RAM would be unknown to the others), and there is nothing to expire.
    gieok's tools need no server-to-client requests, the one thing sessions would add."""
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
                                     transport_security=transport_security(host, extra_hosts), host=host)
    names = allowed_host_names(host, extra_hosts)
    if names is not None:  # the same check as the SDK's, first, so that a refusal has the JSON error body
        app.add_middleware(HostGuard, names=names, origins=True)
    return app


# -- stdio: `gieok mcp` ----------------------------------------------------------------------------

def check_stdio_key(state: ServerState, key: str | None) -> Principal:
    """The principal of the key `gieok mcp` was started with (AuthenticationError otherwise)."""
    if key is None or not key.strip():
        raise AuthenticationError("no API key: pass --key or set GIEOK_API_KEY (create one with "
                                  f"`gieok keys create --tenant default --role write --db {state.tenants.shown}`)")
    try:
        return state.keys.verify(key.strip())
    except AuthenticationError as exc:
        message = str(exc).replace(" (Authorization: Bearer gk_…)", "")
        raise AuthenticationError(f"{message}: checked against the keys of {state.tenants.shown} "
                                  f"(gieok keys list --db {state.tenants.shown})") from None


WARM_AFTER_S = 1.0  # a client that calls no tool by then gets the memory loaded anyway, for its first call


class StdioWarmup:
    """What `gieok mcp`'s first tool call needs — the Korean analyser, then the caller's tenant
    opened and warmed (the model, the indexes: `Memory.warm`) and, for a write key on a memory
    holding conversations, its pipeline (the guard's classifiers and their encoder), as `gieok
    serve` warms (`warm.warm_tenants`) — loaded in one background thread, so `initialize` and
    `tools/list` are answered while it is not loaded yet.

    The load starts at the first tool call or `WARM_AFTER_S` after serving began, whichever comes
    first — not at spawn: kiwi's load holds the interpreter lock for most of a second at a time, so
    the event loop could not answer the `tools/list` a client sends right after `initialize`
    meanwhile. The pipeline, likewise, loads at the first add_messages or `WARM_AFTER_S` after the
    memory, not beside a first get_context it would slow down. Loading in several threads gains
    nothing either (each part holds the lock nearly throughout: measured, two threads took as long
    as one). A tool call waits (`wait`) until what it needs has loaded, or the load has failed: a
    failure is logged on stderr and the call then opens the tenant itself, so the client gets the
    error as a tool error of its type and a later call tries again — nothing hangs on it."""

    def __init__(self, state: ServerState, principal: Principal, *, after_s: float = WARM_AFTER_S) -> None:
        self._state, self._principal, self._after_s = state, principal, after_s
        self._go = threading.Event()
        self._go_pipeline = threading.Event()
        self._stop = threading.Event()
        self._memory = threading.Event()  # the analyser and the tenant: what every tool needs
        self._done = threading.Event()  # the pipeline too (add_messages)
        self._thread = threading.Thread(target=self._load, name="gieok-mcp-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, pipeline: bool = False) -> None:
        """Start the load if it has not started, and return once the memory (and with `pipeline`,
        the pipeline) is loaded or the load has ended (a worker thread's call)."""
        self._go.set()
        if pipeline:
            self._go_pipeline.set()
        (self._done if pipeline else self._memory).wait()

    def stop(self) -> None:
        """No load starts from now on; one under way is waited for (the state closes after this)."""
        self._stop.set()
        self._go.set()
        self._go_pipeline.set()
        if self._thread.is_alive():
            self._thread.join()

    def _load(self) -> None:
        readiness = self._state.readiness
        try:
            self._go.wait(self._after_s)
            if self._stop.is_set():
                return
            get_tokenizer().load()  # the Korean analyser first: Memory.warm's first analysis needs it
            with self._state.access.tenant(self._principal) as tenant:  # opened and warmed (Memory.warm)
                readiness.finish()
                self._memory.set()
                if self._principal.can("write") and tenant.memory.store.conversation.l1_count():
                    self._go_pipeline.wait(self._after_s)  # an agent writes conversations here
                    if not self._stop.is_set():
                        tenant.pipeline.warm()
        except Exception as exc:  # any failure: said on stderr, and the call meets it itself
            log.error("gieok mcp: loading the memory failed: %s", exc)
            if not readiness.done.is_set():
                readiness.finish(str(exc))
        finally:
            self._memory.set()
            self._done.set()


def run_stdio(settings: ServerSettings, key: str | None) -> None:
    """Serve MCP over stdin/stdout until the client closes stdin. stdout carries only the
    protocol; logs go to stderr. The memory and the key are checked before anything is served;
    the model and the indexes load beside the running server (`StdioWarmup`)."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    home = settings.db_path()
    if not settings.uses_database_server() and not home.exists():
        raise AuthenticationError(f"no memory at {home}: create it and a key first "
                                  f"(gieok keys create --db {home} --tenant default --role write)")
    state = ServerState.open_without_stream(settings, "gieok mcp", log)  # waits for PostgreSQL or Redis
    warmup: StdioWarmup | None = None
    try:
        principal = check_stdio_key(state, key)
        warmup = StdioWarmup(state, principal)
        server = build_mcp(state, fixed=principal, loaded=warmup.wait)
        warmup.start()
        log.info("serving tenant %s (role %s) over stdio", principal.tenant, principal.role)
        server.run("stdio")
    finally:
        if warmup is not None:
            warmup.stop()
        state.close()

"""gieok inside the OpenAI Agents SDK, through the two extension points it documents: a `Session`
(the run's history) and `instructions` given as a callable (the system prompt of each turn).

    memory = AsyncClient(os.environ.get("GIEOK_URL", "http://127.0.0.1:8420"))
    session = GieokSession("minji-chat", memory, user="u-minji", name="민지")
    agent = Agent(name="비서", instructions=session.instructions("You are a friendly assistant."), …)
    await Runner.run(agent, "우리 고양이 보리는 츄르를 좋아해", session=session)

**The session id is the conversation's channel.** Each user's or assistant's message of a run
becomes a gieok message of that conversation (`add_messages`): recent messages, turns, the
summary and the user's facts come from it as from any conversation. Its id is minted once per
`add_items` call (`oa-<batch>-<n>`) and sent unchanged on every retry of the request, so a retry
stores nothing twice.

**Every item also has a ledger note** (kind `note`) that keeps, in its metadata, what a gieok
message cannot: the item as the SDK gave it — a tool call, a tool's output, a reasoning item, a
system message, an image part — or, for a message, the item without its text (its id, status,
annotations, provider data) and a reference to the message that holds the text. `get_items`
rebuilds each item from the two, equal to what was added, in the order it was added. The notes
live in the channel `gieok:openai-agents:<session id>`: no conversation can have a channel
starting with `gieok:`, so they are never recalled into a context or mixed with one, and their
scope names the user, so erasing the user (`forget_user`) erases them too. A message deleted in
gieok (`delete_message`, `forget_user`) leaves the session with it.

The SDK is async, so this module is: it takes a `gieok.client.AsyncClient`. It imports the SDK and
`gieok.client`, nothing else of gieok's rings (docs/integrations/openai-agents.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from ..client import AsyncClient, Message
from ..errors import GieokError, InvalidInputError, InvalidTypeError, NotFoundError
from ..types import Block

try:
    from agents import Agent, RunContextWrapper
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import resolve_session_limit
except ImportError as exc:  # the extra is not installed
    raise ImportError('gieok.integrations.openai_agents needs the OpenAI Agents SDK: pip install "gieok[openai-agents]"'
                      f" ({exc.name or 'agents'} is not installed)", name=exc.name) from exc

__all__ = ["GieokSession", "GieokInstructions", "LEDGER_PREFIX", "SESSION_PARTS", "latest_user_text"]

LEDGER_PREFIX = "gieok:openai-agents:"  # + the session id: the channel of a session's ledger notes
FORMAT = 1  # the ledger note's layout (metadata["openai_agents"]["format"]): a later one can read older ones
_META = "openai_agents"
_TEXT_TYPES = ("input_text", "output_text")
_CHANNEL = re.compile(r"^[\w.:@#-]{1,100}$")  # the server's rule for a conversation's channel id
_LABEL_CHARS = 500  # a ledger note's text: what an operator browsing blocks reads, not what is replayed
_PAGE = 200  # blocks per list request (the server's most)
_PARALLEL = 8  # deletions at once when a session is cleared
SESSION_PARTS = ("facts", "summary", "recalled")  # a context beside a session: its history is in the input already


@dataclass(frozen=True, slots=True)
class _TextSlot:
    """Where a message item holds its one text: `content` itself, or one part of a content list."""

    role: str
    path: tuple[str | int, ...]
    text: str


def _text_slot(item: Mapping[str, Any]) -> _TextSlot | None:
    """The text of a user's or assistant's message with exactly one text (and any other parts),
    when gieok can store it as a message: not empty, not only whitespace. Anything else (a system
    or developer message, two texts, no text) is kept whole in the ledger note."""
    role = item.get("role")
    if role not in ("user", "assistant") or item.get("type", "message") != "message":
        return None
    content = item.get("content")
    slot: _TextSlot | None = None
    if isinstance(content, str):
        slot = _TextSlot(role, ("content",), content)
    elif isinstance(content, list):
        texts = [i for i, part in enumerate(content) if isinstance(part, dict) and part.get("type") in _TEXT_TYPES]
        if len(texts) == 1 and isinstance(text := content[texts[0]].get("text"), str):
            slot = _TextSlot(role, ("content", texts[0], "text"), text)
    return slot if slot is not None and slot.text.strip() else None


def _set(item: Any, path: Sequence[str | int], value: Any) -> None:
    for step in path[:-1]:
        item = item[step]
    item[path[-1]] = value


def _plain(item: Any, number: int) -> dict[str, Any]:
    """The item as JSON holds it: what is stored is what `get_items` gives back, so an item that
    would not survive the trip (a set, a datetime) is refused now rather than changed."""
    try:
        plain = json.loads(json.dumps(item, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"session item {number} is not JSON: {exc}") from None
    if not isinstance(plain, dict):
        raise InvalidTypeError(f"session item {number} must be a dict, not {type(item).__name__}")
    return plain


def _label(item: Mapping[str, Any], message_id: str | None) -> str:
    """The ledger note's text: one line naming the item, for someone reading the blocks."""
    kind = str(item.get("type") or "message")
    if message_id is not None:
        return f"{item.get('role')} message {message_id}"
    if kind == "function_call":
        detail = f"{item.get('name')}({item.get('arguments', '')})"
    elif "output" in item:
        output = item["output"]
        detail = f"{item.get('call_id', '')}: " + (output if isinstance(output, str) else
                                                   json.dumps(output, ensure_ascii=False))
    elif isinstance(item.get("content"), str):
        detail = f"{item.get('role')}: {item['content']}"
    else:
        texts = [str(part["text"]) for part in item.get("content") or item.get("summary") or ()
                 if isinstance(part, dict) and isinstance(part.get("text"), str)]
        detail = " ".join(texts) if texts else str(item.get("role") or "")
    line = " ".join(f"{kind} {detail}".split())
    return line[:_LABEL_CHARS] or kind


def _message_id(block: Block) -> str | None:
    ref = block.metadata.get(_META, {}).get("message")
    return ref if isinstance(ref, str) else None


def _rebuilt(block: Block, texts: Mapping[str, str]) -> dict[str, Any] | None:
    """The item a ledger note keeps, its text put back from the gieok message it names; None when
    that message is gone (deleted in gieok: the session lets it go too)."""
    kept = block.metadata[_META]
    item: dict[str, Any] = json.loads(json.dumps(kept["item"]))
    ref = _message_id(block)
    if ref is None:
        return item
    if ref not in texts:
        return None
    before, after = kept.get("pad") or ("", "")
    _set(item, kept["slot"], f"{before}{texts[ref]}{after}")
    return item


class _Turns:
    """A conversation's turn blocks, newest first, read a page at a time and only as far as the
    messages asked for go: each message's text as gieok holds it now (an edit's, when edited)."""

    def __init__(self, memory: AsyncClient, guild: str | None, channel: str) -> None:
        self._memory, self._guild, self._channel = memory, guild, channel
        self._texts: dict[str, str] = {}
        self._cursor: str | None = None
        self._done = False

    async def texts(self, ids: set[str]) -> dict[str, str]:
        while not self._done and not ids <= self._texts.keys():
            page = await self._memory.list_blocks(scope={"guild": self._guild, "channel": self._channel},
                                                  kinds="turn", limit=_PAGE, cursor=self._cursor)
            for block in page:  # an unset guild matches any guild: keep this conversation's
                ref = block.metadata.get("external_id")
                if block.scope.guild == self._guild and isinstance(ref, str):
                    self._texts.setdefault(ref, block.text)  # newest first: an edit's text wins
            self._cursor = page.next_cursor
            self._done = page.next_cursor is None
        return {ref: self._texts[ref] for ref in ids if ref in self._texts}


class GieokSession:
    """A `Session` of the OpenAI Agents SDK (the protocol: `get_items`, `add_items`, `pop_item`,
    `clear_session`) kept in a gieok conversation: channel = `session_id`, in `guild` if given.

    `user` is who the run's user messages are from (their facts are learned from them), `name` their
    display name; `assistant_name` the agent's name on its messages (default: the server's
    `bot_name`). `session_settings.limit` caps what `get_items` gives the runner, as for any session.
    `pop_item` and `clear_session` delete the messages from gieok too (with the facts only they
    stated), so a session the SDK rewinds is not remembered twice."""

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, memory: AsyncClient, *, user: str, name: str | None = None,
                 guild: str | None = None, assistant_name: str | None = None,
                 session_settings: SessionSettings | None = None) -> None:
        if not isinstance(session_id, str) or not _CHANNEL.match(session_id) or session_id.startswith("gieok:"):
            raise InvalidInputError(f"session_id is a gieok channel id: 1–100 letters, digits or . : @ # - _, not "
                                    f"starting with 'gieok:' (got {session_id!r})")
        self.session_id = session_id
        self.memory = memory
        self.user, self.name, self.guild, self.assistant_name = user, name, guild, assistant_name
        self.session_settings = session_settings or SessionSettings()
        self._lock = asyncio.Lock()  # one change at a time: a ledger's order is the order of its writes

    def __repr__(self) -> str:
        return f"GieokSession({self.session_id!r}, user={self.user!r}, guild={self.guild!r})"

    @property
    def ledger_scope(self) -> dict[str, str | None]:
        """Where this session's ledger notes are: the channel `gieok:openai-agents:<session id>`."""
        return {"guild": self.guild, "channel": LEDGER_PREFIX + self.session_id, "user": self.user}

    def instructions(self, base: str = "", *, budget_tokens: int = 2000,
                     include: Iterable[str] | None = SESSION_PARTS) -> GieokInstructions:
        """`Agent(instructions=…)` for this session's conversation: `base`, then gieok's context —
        by default without its recent messages, which the session itself gives the model."""
        return GieokInstructions(self.memory, base, channel=self.session_id, user=self.user, guild=self.guild,
                                 budget_tokens=budget_tokens, include=include)

    # -- the Session protocol --------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items in the order they were added; with `limit`, the latest `limit`."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit <= 0:
            return []
        latest = await self._latest(limit)
        return [cast(TResponseInputItem, item) for _, item in reversed(latest)]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store items after the ones stored: messages into the conversation, then every item's
        ledger note in one transaction (256 a request). If the notes cannot be written, the messages
        just stored are deleted again (as far as the server can be reached) before this raises."""
        if not items:
            return
        batch = uuid.uuid4().hex[:12]
        messages: list[Message] = []
        notes: list[dict[str, Any]] = []
        for number, raw in enumerate(items):
            item = _plain(raw, number)
            slot = _text_slot(item)
            kept: dict[str, Any] = {"format": FORMAT, "item": item}
            message_id = None
            if slot is not None:
                message_id = f"oa-{batch}-{number}"
                text = slot.text.strip()  # gieok keeps a message's text stripped: the ends are kept here
                start = len(slot.text) - len(slot.text.lstrip())
                pad = (slot.text[:start], slot.text[start + len(text):])
                mine = slot.role == "user"
                messages.append(Message(id=message_id, role=cast(Literal["user", "assistant"], slot.role), text=text,
                                        user=self.user if mine else None,
                                        name=self.name if mine else self.assistant_name))
                _set(item, slot.path, "")  # the text lives in the message
                kept.update(message=message_id, slot=list(slot.path), **({"pad": list(pad)} if any(pad) else {}))
            notes.append({"text": _label(item if slot is None else {"role": slot.role}, message_id), "kind": "note",
                          "scope": self.ledger_scope, "tags": ["openai-agents"], "metadata": {_META: kept}})
        async with self._lock:
            if messages:
                await self.memory.add_messages(self.session_id, messages, guild=self.guild)
            try:
                await self.memory.add_many(notes)
            except Exception:
                with contextlib.suppress(GieokError):  # the server may be out of reach: the first error says why
                    await self._forget_messages([m.id for m in messages])
                raise

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the latest item and give it back (None when the session is empty): its message
        is deleted from gieok, then its ledger note forgotten."""
        async with self._lock:
            latest = await self._latest(1)
            if not latest:
                return None
            block, item = latest[0]
            await self._erase(block)
            return cast(TResponseInputItem, item)

    async def clear_session(self) -> None:
        """Remove every item: the session's messages are deleted from gieok (with what came from
        them) and its ledger notes forgotten."""
        async with self._lock:
            notes = [block async for block in self._ledger()]
            gate = asyncio.Semaphore(_PARALLEL)

            async def erase(block: Block) -> None:
                async with gate:
                    await self._erase(block)

            await asyncio.gather(*(erase(block) for block in notes))

    # -- the ledger ------------------------------------------------------------------------------
    async def _ledger(self) -> AsyncGenerator[Block, None]:
        """This session's ledger notes, newest first."""
        cursor: str | None = None
        while True:
            where = {"guild": self.guild, "channel": LEDGER_PREFIX + self.session_id}
            page = await self.memory.list_blocks(scope=where, kinds="note", limit=_PAGE, cursor=cursor)
            for block in page:
                if block.scope.guild == self.guild and isinstance(block.metadata.get(_META), dict):
                    yield block
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def _latest(self, limit: int | None) -> list[tuple[Block, dict[str, Any]]]:
        """The latest `limit` items (all when None), newest first, each with its ledger note."""
        turns = _Turns(self.memory, self.guild, self.session_id)
        found: list[tuple[Block, dict[str, Any]]] = []
        page: list[Block] = []
        notes = self._ledger()

        async def resolve() -> bool:
            texts = await turns.texts({ref for block in page if (ref := _message_id(block)) is not None})
            for block in page:
                item = _rebuilt(block, texts)
                if item is not None:
                    found.append((block, item))
                    if limit is not None and len(found) == limit:
                        return True
            page.clear()
            return False

        async for block in notes:
            page.append(block)
            if len(page) == _PAGE and await resolve():
                await notes.aclose()
                return found
        await resolve()
        return found

    async def _erase(self, block: Block) -> None:
        """One item out of gieok: its message first, so that a failure between the two leaves a
        note whose message is gone — an item `get_items` no longer gives — never the reverse."""
        ref = _message_id(block)
        if ref is not None:
            await self._forget_messages([ref])
        await self.memory.forget(block.block_index)

    async def _forget_messages(self, ids: Sequence[str]) -> None:
        for message_id in ids:
            with contextlib.suppress(NotFoundError):  # never stored, or deleted already: what was asked holds
                await self.memory.delete_message(self.session_id, message_id, guild=self.guild)


class GieokInstructions:
    """`Agent(instructions=GieokInstructions(…))`: the agent's instructions for each turn are `base`
    followed by gieok's context of the conversation (`channel`, `guild`) — the user's facts, the
    summary, older turns recalled for the latest user input, the recent messages — fitted to
    `budget_tokens`; `include` picks the parts (None: all). The SDK calls it with the run's context
    and the agent; the query is the latest user message of the turn's input."""

    def __init__(self, memory: AsyncClient, base: str = "", *, channel: str, user: str | None = None,
                 guild: str | None = None, budget_tokens: int = 2000, include: Iterable[str] | None = None) -> None:
        self.memory, self.base = memory, base
        self.channel, self.user, self.guild = channel, user, guild
        self.budget_tokens = budget_tokens
        self.include = None if include is None else tuple(include)

    def __repr__(self) -> str:
        return f"GieokInstructions(channel={self.channel!r}, user={self.user!r}, budget_tokens={self.budget_tokens})"

    async def __call__(self, run_context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        context = await self.memory.context(self.channel, guild=self.guild, user=self.user,
                                            query=latest_user_text(run_context.turn_input),
                                            budget_tokens=self.budget_tokens, include=self.include)
        return "\n\n".join(part for part in (self.base, context.text) if part)


def latest_user_text(items: Sequence[Any]) -> str | None:
    """The text of the last user message among input items (None when there is none): what the
    turn is about, so what gieok recalls for."""
    for item in reversed(items):
        if not isinstance(item, Mapping) or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = " ".join(part["text"] for part in content or () if isinstance(part, Mapping)
                            and part.get("type") in _TEXT_TYPES and isinstance(part.get("text"), str))
        if text.strip():
            return text.strip()
    return None

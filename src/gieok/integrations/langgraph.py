"""gieok as LangGraph's long-term memory and LangChain's chat history, over `gieok serve`.

- `GieokStore` is a LangGraph `BaseStore` (`StateGraph(...).compile(store=GieokStore(client))`):
  namespaced items with put / get / search / delete / list_namespaces, searched with gieok's
  hybrid search (BM25 over Korean-aware tokens + the server's embedder).
- `GieokChatMessageHistory` is LangChain's `BaseChatMessageHistory` over a gieok conversation
  (`RunnableWithMessageHistory`, or any code that keeps a session's messages), and `context()`
  gives gieok's context text (facts, summary, recalled turns, recent messages) for a prompt.

How items map onto gieok (docs/integrations/langgraph.md): an item is one `note` block whose
scope is {guild: "langgraph:" + the namespace's labels joined by ".", channel: that path + "/" +
the key} — LangGraph forbids "." inside a label, so the join names one namespace only — and
whose metadata `langgraph` holds the namespace, key, value and creation time. The server filters
on that scope, so a get, a put and a search of one namespace are exact on the server. The tenant
is whatever the client's API key says; nothing here names one.

Both classes run every method as a plan of client calls (`_Ask` steps), driven by a `Client` or,
for the async methods, an `AsyncClient`: one implementation, two ways of waiting.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        get_text_at_path,
        tokenize_path,
        validate_op_namespace,
    )
except ImportError as exc:  # the extra is not installed
    raise ImportError(f'gieok.integrations.langgraph needs LangGraph and LangChain ({exc.name} is missing): '
                      'pip install "gieok[langgraph]"') from exc

from gieok.client import AsyncClient, Client, Message

__all__ = ["GieokStore", "GieokChatMessageHistory", "UnsupportedMessageError", "namespace_scope", "item_scope"]

KIND = "note"  # an item is a note: not a turn of a conversation, not an L3 fact
MARK = "langgraph"  # the block metadata key that holds an item (and tells it from other notes)
SCOPE_PREFIX = "langgraph:"  # the guild of an item's scope starts with it
MAX_SCOPE = 200  # the server's limit for a scope value
MAX_K = 100  # the server's limit for one search's hits
PAGE = 200  # the server's limit for one page of list_blocks
_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})

T = TypeVar("T")


class UnsupportedMessageError(ValueError):
    """A message gieok's conversations cannot hold: gieok keeps what users and the assistant said
    (`HumanMessage`, `AIMessage` with text), not system prompts, tool results or tool calls alone."""


# -- plans: the client calls a method makes, run by a blocking or an async client ------------------

@dataclass(frozen=True, slots=True)
class _Ask:
    """A plan's step: call the client's method `name` with these arguments; the answer is sent back."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


_Plan = Generator[_Ask, Any, T]


def _ask(name: str, *args: Any, **kwargs: Any) -> _Ask:
    return _Ask(name, args, kwargs)


def _run(client: Client, plan: _Plan[T]) -> T:
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            answer = getattr(client, step.name)(*step.args, **step.kwargs)
    except StopIteration as done:
        return done.value
    finally:
        plan.close()


async def _arun(client: AsyncClient, plan: _Plan[T]) -> T:
    answer: Any = None
    try:
        while True:
            step = plan.send(answer)
            answer = await getattr(client, step.name)(*step.args, **step.kwargs)
    except StopIteration as done:
        return done.value
    finally:
        plan.close()


class _Block(Protocol):
    """What this module reads of a block (`gieok.Block`, as the client returns it)."""

    block_index: int
    text: str
    metadata: dict[str, Any]
    event_time: float
    insert_time: float
    forgotten: bool

    @property
    def scope(self) -> Any: ...


# -- the mapping: namespace and key → scope ---------------------------------------------------------

def _fits(value: str, limit: int) -> bool:
    """A scope value the server takes and keeps as it is: not empty, not too long, no NUL, no
    whitespace at either end (stripped values would name another item)."""
    return 0 < len(value) <= limit and "\x00" not in value and value == value.strip()


def _digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()


def namespace_scope(namespace: Sequence[str]) -> str:
    """The scope guild of a namespace's items: "langgraph:" + its labels joined by "."
    (`("users", "민지")` → `"langgraph:users.민지"`); a path longer than a scope value may be
    becomes "langgraph:sha256:…" of it (the metadata keeps the namespace itself)."""
    path = ".".join(namespace)
    return SCOPE_PREFIX + (path if _fits(path, MAX_SCOPE - len(SCOPE_PREFIX)) else _digest(path))


def item_scope(namespace: Sequence[str], key: str) -> dict[str, str]:
    """The scope of an item's block: the guild of its namespace (`namespace_scope`) and the channel
    "<labels joined by '.'>/<key>" (`("users", "민지")`, `"food"` → `"users.민지/food"`). The "/" keeps
    an item out of every conversation (a channel id has none), whose scope may leave the guild
    open; a channel longer than a scope value may be becomes "sha256:…" of the namespace and key."""
    channel = ".".join(namespace) + "/" + key
    if not _fits(channel, MAX_SCOPE):
        channel = _digest(json.dumps([list(namespace), key], ensure_ascii=False))
    return {"guild": namespace_scope(namespace), "channel": channel}


@dataclass(frozen=True, slots=True)
class _Stored:
    """An item as one block holds it."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: float
    updated_at: float
    block_index: int


def _stored(block: _Block) -> _Stored | None:
    """The item a block holds, or None for any other block (another program's note)."""
    mark = block.metadata.get(MARK) if isinstance(block.metadata, Mapping) else None
    if block.forgotten or not isinstance(mark, Mapping):
        return None
    namespace, key, value = mark.get("namespace"), mark.get("key"), mark.get("value")
    if not (isinstance(namespace, list) and all(isinstance(label, str) for label in namespace)
            and isinstance(key, str) and isinstance(value, dict)):
        return None
    created = mark.get("created_at")
    created_at = float(created) if isinstance(created, int | float) else block.insert_time
    return _Stored(tuple(namespace), key, value, created_at, block.insert_time, block.block_index)


def _moment(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _item(stored: _Stored) -> Item:
    return Item(value=stored.value, key=stored.key, namespace=stored.namespace,
                created_at=_moment(stored.created_at), updated_at=_moment(stored.updated_at))


def _search_item(stored: _Stored, score: float | None) -> SearchItem:
    return SearchItem(stored.namespace, stored.key, stored.value, _moment(stored.created_at),
                      _moment(stored.updated_at), score)


# -- what an item's text is, and LangGraph's filters ------------------------------------------------

def _strings(value: Any) -> Iterable[str]:
    """Every string inside a JSON value, in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter rule (as its InMemoryStore and PostgresStore apply it): nested mappings
    match field by field, lists element by element, `{"$gt": 3}` … compare, anything else is equal."""
    if isinstance(wanted, Mapping):
        if any(name.startswith("$") for name in wanted):
            return all(_compare(value, name, operand) for name, operand in wanted.items())
        return isinstance(value, Mapping) and all(_matches(value.get(name), part) for name, part in wanted.items())
    if isinstance(wanted, list | tuple):
        return (isinstance(value, list | tuple) and len(value) == len(wanted)
                and all(_matches(v, w) for v, w in zip(value, wanted)))
    return bool(value == wanted)


def _compare(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field is not greater or smaller than anything
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right, "$lte": left <= right}[operator]


def _check_filter(wanted: Any) -> None:
    if isinstance(wanted, Mapping):
        for name, part in wanted.items():
            if not isinstance(name, str):
                raise TypeError(f"a filter's field names are strings, not {type(name).__name__}")
            if name.startswith("$") and name not in _OPERATORS:
                raise ValueError(f"unsupported filter operator {name!r}; use one of {', '.join(sorted(_OPERATORS))}")
            _check_filter(part)
    elif isinstance(wanted, list | tuple):
        for part in wanted:
            _check_filter(part)


def _path_matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    if condition.match_type not in ("prefix", "suffix"):
        raise ValueError(f"unsupported namespace match type {condition.match_type!r}")
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    ends = namespace[: len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(want == "*" or have == want for have, want in zip(ends, path))


def _json_value(value: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The value as JSON gives it back (what a get will return), or a TypeError before anything is sent."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: an item's value is a mapping, not {type(value).__name__}")
    try:
        copied = json.loads(json.dumps(dict(value), ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: an item's value must be JSON (string keys, no NaN): {exc}") from None
    if not isinstance(copied, dict):  # pragma: no cover - a mapping always dumps to an object
        raise TypeError(f"{where}: an item's value is a mapping")
    return copied


# -- the store --------------------------------------------------------------------------------------

class GieokStore(BaseStore):
    """LangGraph's long-term memory in `gieok serve`, under the tenant of the client's API key.

        store = GieokStore(Client(os.environ.get("GIEOK_URL", "http://127.0.0.1:8420")))
        graph = builder.compile(store=store)       # nodes take `store: BaseStore` or `runtime.store`

    `index`: LangGraph's index config; gieok embeds with the server's own model, so only `fields`
    counts (the paths whose text an item is searched by, in LangGraph's path syntax; `["$"]`: the
    whole value as JSON). Without fields an item's text is every string in its value; a `put` with
    `index=[…]` picks its own paths and `index=False` leaves only its key as text.
    `nested`: gieok's scope filters match whole values, not prefixes. By default a search whose
    prefix names a namespace holding items searches that namespace, on the server, in one request;
    a prefix holding none itself (a parent such as `("users",)`, or `()`) is searched across the
    tenant, keeping what lies below it. `nested=True` does the latter always, so a namespace that
    holds items *and* namespaces below it is searched with them (LangGraph's prefix rule), at the
    price of ranking the tenant's whole memory (a query search keeps its 100 best hits) or, without
    a query, reading its notes a page at a time.
    `async_client`: an `AsyncClient` for `abatch` (else `abatch` runs the blocking client in a thread).
    """

    supports_ttl = False

    def __init__(self, client: Client | None = None, *, async_client: AsyncClient | None = None,
                 index: Mapping[str, Any] | None = None, nested: bool = False) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else Client()
        self.async_client = async_client
        self.nested = nested
        self.fields: list[str] | None = None
        if index is not None:
            unknown = sorted(set(index) - {"fields"})
            if unknown:
                raise ValueError(f"GieokStore's index takes only 'fields' (got {', '.join(unknown)}): the gieok "
                                 "server embeds every item with its own model")
            fields = index.get("fields")
            if fields is not None:
                self.fields = [str(path) for path in fields]
                for path in self.fields:
                    if path != "$":
                        tokenize_path(path)  # a malformed path fails here, not at the first put

    def __repr__(self) -> str:
        return f"GieokStore({self.client.base_url!r})"

    def close(self) -> None:
        """Close the client this store made (a client given to it stays the caller's)."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> GieokStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    # -- BaseStore -----------------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return _run(self.client, self._batch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        listed = list(ops)
        if self.async_client is None:
            return await asyncio.to_thread(self.batch, listed)
        return await _arun(self.async_client, self._batch(listed))

    def _batch(self, ops: list[Op]) -> _Plan[list[Result]]:
        """Reads in order, then the writes (the last put of a key wins), as LangGraph's own stores
        do: a get in the same batch as a put of its key sees the item as it was."""
        for number, op in enumerate(ops, start=1):
            self._check(op, f"op {number}")  # every op checked before the first request
        results: list[Result] = [None] * len(ops)
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for position, op in enumerate(ops):
            if isinstance(op, GetOp):
                versions = yield from self._versions(tuple(op.namespace), op.key)
                results[position] = _item(versions[0]) if versions else None
            elif isinstance(op, SearchOp):
                results[position] = yield from self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[position] = yield from self._namespaces(op)
            else:
                puts[(tuple(op.namespace), op.key)] = op
        if puts:
            yield from self._write(list(puts.values()))
        return results

    def _check(self, op: Op, where: str) -> None:
        if not isinstance(op, GetOp | SearchOp | ListNamespacesOp | PutOp):
            raise TypeError(f"{where}: unknown store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, SearchOp):
            _check_filter(op.filter)
            if op.query is not None and not isinstance(op.query, str):
                raise TypeError(f"{where}: a search query is a string, not {type(op.query).__name__}")
        if isinstance(op, GetOp | PutOp) and not isinstance(op.key, str):
            raise TypeError(f"{where}: a key is a string, not {type(op.key).__name__}")
        if isinstance(op, PutOp):
            if not op.namespace:
                raise InvalidNamespaceError("Namespace cannot be empty.")
            if op.namespace[0] == "langgraph":
                raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {op.namespace}')
            if op.ttl is not None:
                raise NotImplementedError("GieokStore keeps items until they are deleted: it has no TTL (ttl=None)")
            if op.value is not None:
                _json_value(op.value, where)

    # -- plans -------------------------------------------------------------------------------------
    def _versions(self, namespace: tuple[str, ...], key: str) -> _Plan[list[_Stored]]:
        """The blocks that hold this item, newest first: one, but for a put interrupted between
        writing the new block and forgetting the old (the next put of the key forgets both)."""
        scope = item_scope(namespace, key)
        found: list[_Stored] = []
        cursor: str | None = None
        while True:
            page = yield _ask("list_blocks", scope=scope, kinds=KIND, limit=20, cursor=cursor)
            found += [s for block in page.items
                      if (s := _stored(block)) is not None and s.namespace == namespace and s.key == key]
            cursor = page.next_cursor
            if cursor is None:
                return found

    def _write(self, puts: list[PutOp]) -> _Plan[None]:
        """New blocks first (one request, one transaction per 256), then the versions they replace
        are forgotten: an item is never missing in between, and a delete forgets them all."""
        replaced: list[list[_Stored]] = []
        for op in puts:
            replaced.append((yield from self._versions(tuple(op.namespace), op.key)))
        items = [self._block_of(op, old) for op, old in zip(puts, replaced) if op.value is not None]
        if items:
            yield _ask("add_many", items)
        for old in replaced:
            for version in old:
                yield _ask("forget", version.block_index)

    def _block_of(self, op: PutOp, replaced: list[_Stored]) -> dict[str, Any]:
        namespace = tuple(op.namespace)
        value = _json_value(op.value or {}, "put")
        mark: dict[str, Any] = {"namespace": list(namespace), "key": op.key, "value": value}
        if replaced:  # an update keeps the item's first creation time; updated_at is this block's
            mark["created_at"] = min(version.created_at for version in replaced)
        return {"text": self._text(namespace, op.key, value, op.index), "kind": KIND,
                "scope": item_scope(namespace, op.key),
                "metadata": {MARK: mark}}

    def _text(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], index: Any) -> str:
        """What gieok embeds and indexes for an item (the search finds it by this text)."""
        paths = self.fields if index is None else (None if index is False else [str(p) for p in index])
        if index is False:
            texts: list[str] = []
        elif paths:
            texts = [text for path in paths for text in get_text_at_path(value, path)]
        else:
            texts = list(_strings(value)) or ([json.dumps(value, ensure_ascii=False)] if value else [])
        text = "\n".join(t.strip() for t in texts if t.strip())
        return text or key.strip() or ".".join(namespace)

    def _search(self, op: SearchOp) -> _Plan[list[SearchItem]]:
        if op.limit <= 0:
            return []
        if op.query:
            return (yield from self._ranked(op))
        return (yield from self._listed(op))

    def _ranked(self, op: SearchOp) -> _Plan[list[SearchItem]]:
        """gieok's hybrid search: in the namespace the prefix names, on the server; across the
        tenant, kept to the prefix, when the prefix is a parent (it holds no item itself), empty,
        or `nested` is on. Then the newest version of each item, the filter, offset and limit.
        One request ranks the hits (its best scores 1.0), and reaches its 100 best."""
        prefix = tuple(op.namespace_prefix)
        want = op.offset + op.limit
        hits: list[tuple[float, _Stored]] | None = None
        if prefix and not self.nested:
            k = MAX_K if op.filter else max(1, min(MAX_K, want))
            result = yield _ask("search", op.query, k, scope={"guild": namespace_scope(prefix)}, kinds=KIND,
                                neighbours=False)
            if result.hits:
                hits = [(hit.score, s) for hit in result.hits
                        if (s := _stored(hit.block)) is not None and s.namespace == prefix]
        if hits is None:
            result = yield _ask("search", op.query, MAX_K, kinds=KIND, neighbours=False)
            hits = [(hit.score, s) for hit in result.hits
                    if (s := _stored(hit.block)) is not None and s.namespace[: len(prefix)] == prefix]
        newest: dict[tuple[tuple[str, ...], str], tuple[float, _Stored]] = {}
        for score, stored in hits:
            held = newest.get((stored.namespace, stored.key))
            if held is None or stored.block_index > held[1].block_index:
                newest[(stored.namespace, stored.key)] = (score, stored)
        ranked = sorted(newest.values(), key=lambda pair: (-pair[0], -pair[1].block_index))
        chosen = [pair for pair in ranked if not op.filter or _matches(pair[1].value, op.filter)]
        return [_search_item(stored, score) for score, stored in chosen[op.offset:want]]

    def _listed(self, op: SearchOp) -> _Plan[list[SearchItem]]:
        """Without a query: items under the prefix, most recently updated first (as PostgresStore
        orders them). The namespace the prefix names is listed on the server; a parent prefix, an
        empty one or `nested` reads the tenant's notes a page at a time until offset + limit match."""
        prefix = tuple(op.namespace_prefix)
        if prefix and not self.nested:
            chosen, held = yield from self._scan(op, {"guild": namespace_scope(prefix)})
            if held:
                return chosen
        chosen, _ = yield from self._scan(op, None)
        return chosen

    def _scan(self, op: SearchOp, scope: dict[str, str] | None) -> _Plan[tuple[list[SearchItem], bool]]:
        """The items under `op`'s prefix among the blocks of `scope`, newest first, and whether
        the scope held any item at all."""
        prefix = tuple(op.namespace_prefix)
        want = op.offset + op.limit
        seen: set[tuple[tuple[str, ...], str]] = set()
        chosen: list[_Stored] = []
        cursor: str | None = None
        while len(chosen) < want:
            page = yield _ask("list_blocks", scope=scope, kinds=KIND, limit=PAGE, cursor=cursor)
            for block in page.items:
                stored = _stored(block)
                if stored is None or (stored.namespace, stored.key) in seen:
                    continue
                seen.add((stored.namespace, stored.key))  # its newest version: an older one is history
                if stored.namespace[: len(prefix)] == prefix and (not op.filter or _matches(stored.value, op.filter)):
                    chosen.append(stored)
            cursor = page.next_cursor
            if cursor is None:
                break
        return [_search_item(stored, None) for stored in chosen[op.offset:want]], bool(seen)

    def _namespaces(self, op: ListNamespacesOp) -> _Plan[list[tuple[str, ...]]]:
        """Every namespace holding an item, read from the tenant's notes a page at a time (gieok
        has no list of scopes), filtered, cut to max_depth, sorted, offset and limit."""
        found: set[tuple[str, ...]] = set()
        cursor: str | None = None
        while True:
            page = yield _ask("list_blocks", kinds=KIND, limit=PAGE, cursor=cursor)
            found.update(s.namespace for block in page.items if (s := _stored(block)) is not None)
            cursor = page.next_cursor
            if cursor is None:
                break
        chosen = {namespace for namespace in found
                  if all(_path_matches(namespace, condition) for condition in op.match_conditions or ())}
        if op.max_depth is not None:
            chosen = {namespace[: op.max_depth] for namespace in chosen}
        return sorted(chosen)[op.offset: op.offset + op.limit]


# -- the chat history -------------------------------------------------------------------------------

class GieokChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept as a gieok conversation: the session is the conversation's
    channel (`guild`, if given, the guild it is in; none: a direct conversation, where a user's
    context holds only their own facts), each message one message of it — a recent message, a
    turn that search recalls, and with a model on the server the summary and facts learned from it.

        history = GieokChatMessageHistory("session-1", user="u-minji", client=Client())
        RunnableWithMessageHistory(chain, lambda session: GieokChatMessageHistory(session, …))

    `user`: the user id of the human messages (default: the session id); `assistant_name`: the
    name the assistant's messages carry (default: each message's `name`). A message is sent with
    its `id`, and one without an id gets a new one written onto it, so adding the same messages
    again (a retry) stores nothing twice. `max_messages`: `messages` returns the last this many.
    `async_client`: an `AsyncClient` for the async methods (else they run the blocking client in
    a thread)."""

    def __init__(self, session_id: str, *, user: str | None = None, guild: str | None = None,
                 client: Client | None = None, async_client: AsyncClient | None = None,
                 assistant_name: str | None = None, max_messages: int | None = None) -> None:
        super().__init__()
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string (it is the conversation's channel)")
        if max_messages is not None and (isinstance(max_messages, bool) or not isinstance(max_messages, int)
                                         or max_messages < 1):
            raise ValueError(f"max_messages must be a positive integer or None, not {max_messages!r}")
        self.session_id = session_id
        self.user = user if user is not None else session_id
        self.guild = guild
        self._owns_client = client is None
        self.client = client if client is not None else Client()
        self.async_client = async_client
        self.assistant_name = assistant_name
        self.max_messages = max_messages

    def __repr__(self) -> str:
        return f"GieokChatMessageHistory({self.session_id!r}, guild={self.guild!r})"

    def close(self) -> None:
        """Close the client this history made (a client given to it stays the caller's)."""
        if self._owns_client:
            self.client.close()

    # -- reading ---------------------------------------------------------------------------------
    # LangChain declares `messages` an attribute; here it is read from the server each time
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's messages, oldest first (the last `max_messages` when set)."""
        return _run(self.client, self._read(self.max_messages))

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_client is None:
            return await asyncio.to_thread(lambda: self.messages)
        return await _arun(self.async_client, self._read(self.max_messages))

    def _read(self, most: int | None) -> _Plan[list[BaseMessage]]:
        turns = yield from self._turns(most)
        # in the order they were said (an edit writes its turn anew, a backfill may come late), not as written
        said = sorted(turns, key=lambda block: (block.event_time, block.block_index))
        return [message for block in said if (message := _chat_message(block)) is not None]

    def _turns(self, most: int | None) -> _Plan[list[_Block]]:
        """The session's turn blocks, newest first (gieok keeps every message as a turn)."""
        scope = {"channel": self.session_id, **({"guild": self.guild} if self.guild is not None else {})}
        found: list[_Block] = []
        cursor: str | None = None
        while most is None or len(found) < most:
            page = yield _ask("list_blocks", scope=scope, kinds="turn", limit=PAGE, cursor=cursor)
            # A scope without a guild matches the channel in any guild: keep this conversation's own.
            found += [block for block in page.items if block.scope.guild == self.guild
                      and isinstance(block.metadata.get("role"), str)]
            cursor = page.next_cursor
            if cursor is None:
                break
        return found if most is None else found[:most]

    # -- writing ---------------------------------------------------------------------------------
    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store the messages in order (one request per 256); ids already stored are not stored again."""
        _run(self.client, self._add(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_client is None:
            await asyncio.to_thread(self.add_messages, messages)
            return
        await _arun(self.async_client, self._add(messages))

    def _add(self, messages: Sequence[BaseMessage]) -> _Plan[None]:
        wire = [self._wire(message, number) for number, message in enumerate(messages)]  # all checked, from 0
        if wire:
            yield _ask("add_messages", self.session_id, wire, guild=self.guild)

    def _wire(self, message: BaseMessage, number: int) -> Message:
        if isinstance(message, HumanMessage):
            role = "user"
        elif isinstance(message, AIMessage):
            role = "assistant"
        else:
            raise UnsupportedMessageError(
                f"message {number} is a {type(message).__name__}: a gieok conversation keeps what the user and the "
                "assistant said (HumanMessage, AIMessage); keep system prompts and tool messages out of the history")
        text = str(message.text)
        if not text.strip():
            raise UnsupportedMessageError(f"message {number} ({type(message).__name__}) has no text: gieok keeps "
                                          "what was said, not a tool call alone")
        if not message.id:  # written onto the message, so sending it again (a retry) sends the same id
            message.id = f"lc-{uuid.uuid4().hex}"
        if role == "user":
            return Message(id=message.id, role="user", text=text, user=self.user, name=message.name)
        return Message(id=message.id, role="assistant", text=text, name=self.assistant_name or message.name)

    def clear(self) -> None:
        """Delete every message of the session, and what came from each (its turn, the facts only
        it stated). Their ids stay taken: a message sent again with one of them is not stored."""
        _run(self.client, self._clear())

    async def aclear(self) -> None:
        if self.async_client is None:
            await asyncio.to_thread(self.clear)
            return
        await _arun(self.async_client, self._clear())

    def _clear(self) -> _Plan[None]:
        turns = yield from self._turns(None)
        for block in turns:
            message_id = block.metadata.get("external_id")
            if isinstance(message_id, str) and message_id:
                yield _ask("delete_message", self.session_id, message_id, guild=self.guild)

    # -- context ---------------------------------------------------------------------------------
    def context(self, query: str | None = None, *, budget_tokens: int = 2000,
                include: Iterable[str] | None = None) -> str:
        """gieok's context for the next reply, as text for a system prompt: the user's facts, the
        summary, recalled older turns and recent messages within `budget_tokens` (`include` picks
        parts: facts, summary, recalled, recent). `query`: what the reply is about (default: the
        session's last user message)."""
        return _run(self.client, self._context(query, budget_tokens, include))

    async def acontext(self, query: str | None = None, *, budget_tokens: int = 2000,
                       include: Iterable[str] | None = None) -> str:
        if self.async_client is None:
            return await asyncio.to_thread(self.context, query, budget_tokens=budget_tokens, include=include)
        return await _arun(self.async_client, self._context(query, budget_tokens, include))

    def _context(self, query: str | None, budget_tokens: int, include: Iterable[str] | None) -> _Plan[str]:
        context = yield _ask("context", self.session_id, guild=self.guild, user=self.user, query=query,
                             budget_tokens=budget_tokens, include=include)
        return str(context.text)


def _chat_message(block: _Block) -> BaseMessage | None:
    """A turn block as the LangChain message it was (its text, and the id it was sent with)."""
    role = block.metadata.get("role")
    message_id = block.metadata.get("external_id")
    ident = message_id if isinstance(message_id, str) and message_id else None
    if role == "user":
        return HumanMessage(content=block.text, id=ident)
    if role == "assistant":
        return AIMessage(content=block.text, id=ident)
    return None

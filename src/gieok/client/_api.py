"""Every client method once, as a plan: the requests it makes (`yield from exchange(...)`), the
checks it makes before sending anything, and how the answers become results. `Client` and
`AsyncClient` only run these plans, so a method behaves the same in both.

Checks made here are the ones that must hold before the first request, because a long list is
sent in several: a message without an id in the third request must not leave two requests'
worth stored. Everything else is the server's to refuse (its answer becomes the engine's
exception, `_errors.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ..errors import InvalidInputError, InvalidTypeError, ServerError, ServerUnavailableError
from ..store.base import VerifyReport
from ..types import Block, Scope, SearchResult
from ._http import Call, Connection, Plan, Sleep, exchange, json_of, mapping_of
from .types import BlockPage, Context, Fact, Message, MessagesResult, ServerStats, When, wire_time

__all__ = ["Api", "MAX_BATCH", "MAX_MESSAGES"]

MAX_BATCH = 256  # blocks per POST /v1/memories:batch (the server's limit: one transaction)
MAX_MESSAGES = 256  # messages per POST /v1/conversations/messages

T = TypeVar("T")
ScopeLike = Scope | Mapping[str, Any] | None


def _decoded(response: httpx.Response, build: Callable[[Any], T]) -> T:
    """`build` over the JSON answer; an answer of another shape is the server's failure."""
    data = json_of(response)
    try:
        return build(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        request = response.request
        raise ServerError(f"{request.method} {request.url.path}: the server's answer is not what this client "
                          f"expects ({type(exc).__name__}: {exc})", response.status_code) from None


def _scope(scope: ScopeLike) -> dict[str, str] | None:
    if scope is None:
        return None
    return {k: v for k, v in Scope.of(scope).as_dict().items() if v is not None}


def _block_index(block_index: int) -> int:
    if isinstance(block_index, bool) or not isinstance(block_index, int):
        raise InvalidTypeError(f"block index must be an integer, not {type(block_index).__name__}")
    return block_index


def _kinds(kinds: Iterable[str] | str | None) -> list[str] | None:
    if kinds is None:
        return None
    return [kinds] if isinstance(kinds, str) else [str(k) for k in kinds]


def _item(item: str | Mapping[str, Any]) -> dict[str, Any]:
    """One block for the wire, as `Memory.add_many` takes it: a text, or a mapping."""
    if isinstance(item, str):
        return {"text": item}
    if not isinstance(item, Mapping):
        raise InvalidTypeError(f"an item must be a text or a mapping, not {type(item).__name__}")
    out = {k: v for k, v in item.items() if v is not None}
    if "scope" in out:
        out["scope"] = _scope(out["scope"])
    if "event_time" in out:
        out["event_time"] = wire_time(out["event_time"])
    for name in ("tags", "keywords"):
        if name in out and not isinstance(out[name], str):
            out[name] = list(out[name])
    return out


def _segment(value: Any, what: str) -> str:
    """An id as one segment of a path: every character but letters, digits and `-._~` escaped (a
    "/" is %2F), and an id of dots alone escaped whole — httpx reads /v1/users/.. as /v1 (such ids
    are refused now; a memory from before may hold one)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-empty string, not {value!r}")
    return value.replace(".", "%2E") if not value.strip(".") else quote(value, safe="")


def _message(message: Message | Mapping[str, Any], number: int) -> dict[str, Any]:
    """One message for the wire. An id is never made up: the server keeps each id once, which
    is what makes a resent message harmless; an invented one would store it twice."""
    if isinstance(message, Message):
        wire = message.as_dict()
    elif isinstance(message, Mapping):
        wire = dict(message)
        wire["time"] = wire_time(wire.get("time"))
    else:
        raise InvalidTypeError(f"message {number} must be a Message or a mapping, not {type(message).__name__}")
    if wire.get("id") is None or wire.get("id") == "":
        raise InvalidInputError(f"message {number} has no id: the server needs the transport's message id "
                                "(it is what makes sending a message twice store it once)")
    return wire


def _chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


class Api:
    """The plans of every method, over one connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def _send(self, call: Call) -> Plan[httpx.Response]:
        return exchange(self.connection, call)

    # -- blocks ----------------------------------------------------------------------------------
    def add(self, text: str, *, kind: str, scope: ScopeLike, speaker: str | None, importance: float,
            event_time: When | None, tags: Iterable[str] | None, keywords: Iterable[str] | None,
            metadata: Mapping[str, Any] | None) -> Plan[Block]:
        body = _item({"text": text, "kind": kind, "scope": scope, "speaker": speaker, "importance": importance,
                      "event_time": event_time, "tags": tags, "keywords": keywords,
                      "metadata": None if metadata is None else dict(metadata)})
        response = yield from self._send(Call("POST", "/v1/memories", body, write=True))
        return _decoded(response, Block.from_dict)

    def add_many(self, items: Iterable[str | Mapping[str, Any]]) -> Plan[list[Block]]:
        wire = [_item(item) for item in items]  # every item checked before the first request
        blocks: list[Block] = []
        for chunk in _chunks(wire, MAX_BATCH):  # each chunk its own transaction and idempotency key
            response = yield from self._send(Call("POST", "/v1/memories:batch", {"items": list(chunk)}, write=True))
            blocks += _decoded(response, lambda data: [Block.from_dict(b) for b in data["blocks"]])
        return blocks

    def get(self, block_index: int) -> Plan[Block]:
        index = _block_index(block_index)
        response = yield from self._send(Call("GET", f"/v1/memories/{index}", block=index))
        return _decoded(response, Block.from_dict)

    def forget(self, block_index: int) -> Plan[list[int]]:
        index = _block_index(block_index)
        response = yield from self._send(Call("DELETE", f"/v1/memories/{index}", write=True, block=index))
        return _decoded(response, lambda data: [int(i) for i in data["forgotten"]])

    def list_blocks(self, *, scope: ScopeLike, kinds: Iterable[str] | str | None, since: When | None,
                    until: When | None, limit: int, cursor: str | None) -> Plan[BlockPage]:
        params = [(k, v) for k, v in (_scope(scope) or {}).items()]
        params += [("kind", kind) for kind in _kinds(kinds) or ()]
        params += [(name, str(wire_time(value))) for name, value in (("since", since), ("until", until))
                   if value is not None]
        params.append(("limit", str(limit)))
        if cursor is not None:
            params.append(("cursor", cursor))
        response = yield from self._send(Call("GET", "/v1/memories", params=params))
        return _decoded(response, lambda data: BlockPage([Block.from_dict(b) for b in data["items"]],
                                                         data.get("next_cursor")))

    def search(self, query: str, k: int, *, scope: ScopeLike, kinds: Iterable[str] | str | None,
               since: When | None, until: When | None, mode: str, neighbours: bool) -> Plan[SearchResult]:
        body = {"query": query, "k": k, "scope": _scope(scope), "kinds": _kinds(kinds), "since": wire_time(since),
                "until": wire_time(until), "mode": mode, "neighbours": neighbours}
        response = yield from self._send(Call("POST", "/v1/search", {n: v for n, v in body.items() if v is not None}))
        return _decoded(response, SearchResult.from_dict)

    # -- the memory as a whole -------------------------------------------------------------------
    def stats(self) -> Plan[ServerStats]:
        response = yield from self._send(Call("GET", "/v1/stats"))
        return _decoded(response, ServerStats.from_dict)

    def verify(self) -> Plan[VerifyReport]:
        response = yield from self._send(Call("GET", "/v1/verify"))
        return _decoded(response, VerifyReport.from_dict)

    def ready(self) -> Plan[bool]:
        """One try, no retries: a probe answers now (False while warming or unreachable)."""
        try:
            response = yield from self._send(Call("GET", "/readyz", auth=False, accept=frozenset({503}), retries=0))
        except ServerUnavailableError:
            return False
        return response.status_code == 200

    def wait_ready(self, timeout: float, interval: float) -> Plan[None]:
        deadline = time.monotonic() + timeout
        while not (yield from self.ready()):
            if time.monotonic() >= deadline:
                raise ServerUnavailableError(f"the gieok server at {self.connection.base_url} was not ready "
                                             f"within {timeout:g} s (GET /readyz)")
            yield Sleep(interval)

    # -- conversations ---------------------------------------------------------------------------
    def facts(self, *, user: str | None, guild: str | None, history: bool, limit: int, as_of: When | None = None,
              known_at: When | None = None) -> Plan[list[Fact]]:
        params = [(k, v) for k, v in (("user", user), ("guild", guild)) if v is not None]
        params += [("history", "true" if history else "false"), ("limit", str(limit))]
        params += [(name, str(wire_time(value))) for name, value in (("as_of", as_of), ("known_at", known_at))
                   if value is not None]
        response = yield from self._send(Call("GET", "/v1/facts", params=params))
        return _decoded(response, lambda data: [Fact.from_dict(f) for f in data["facts"]])

    def add_fact(self, text: str, *, user: str | None, guild: str | None, valid_from: When | None,
                 topic: str) -> Plan[dict[str, Any]]:
        body = {"text": text, "user": user, "guild": guild, "topic": topic, "valid_from": wire_time(valid_from)}
        response = yield from self._send(Call("POST", "/v1/facts", body, write=True))
        return dict(mapping_of(response))

    def correct_fact(self, fact_id: int, text: str, *, valid_from: When | None) -> Plan[dict[str, Any]]:
        body = {"text": text, "valid_from": wire_time(valid_from)}
        response = yield from self._send(Call("PATCH", f"/v1/facts/{_block_index(fact_id)}", body, write=True))
        return dict(mapping_of(response))

    def forget_fact(self, fact_id: int) -> Plan[list[int]]:
        response = yield from self._send(Call("DELETE", f"/v1/facts/{_block_index(fact_id)}", write=True))
        return _decoded(response, lambda data: [int(i) for i in data["erased"]])

    def fact_history(self, fact_id: int) -> Plan[list[dict[str, Any]]]:
        response = yield from self._send(Call("GET", f"/v1/facts/{_block_index(fact_id)}/history"))
        return _decoded(response, lambda data: [dict(v) for v in data["versions"]])

    def users(self, *, after: str | None, limit: int) -> Plan[dict[str, Any]]:
        params = [("limit", str(limit)), *([("after", after)] if after is not None else [])]
        response = yield from self._send(Call("GET", "/v1/users", params=params))
        return dict(mapping_of(response))

    def user_data(self, user: str) -> Plan[dict[str, Any]]:
        response = yield from self._send(Call("GET", f"/v1/users/{_segment(user, 'user')}"))
        return dict(mapping_of(response))

    def forget_user(self, user: str) -> Plan[dict[str, Any]]:
        response = yield from self._send(Call("DELETE", f"/v1/users/{_segment(user, 'user')}", write=True))
        return dict(mapping_of(response))

    def summary(self, channel: str, *, guild: str | None) -> Plan[dict[str, Any]]:
        params = [("channel", channel), *([("guild", guild)] if guild is not None else [])]
        response = yield from self._send(Call("GET", "/v1/conversations/summary", params=params))
        return dict(mapping_of(response))

    def add_messages(self, channel: str, messages: Iterable[Message | Mapping[str, Any]], *,
                     guild: str | None, index: str = "now") -> Plan[MessagesResult]:
        if index not in ("now", "behind"):
            raise InvalidInputError(f"index must be 'now' or 'behind', not {index!r}")
        # all checked first; numbered from 0, as the server numbers them in its errors
        wire = [_message(m, number) for number, m in enumerate(messages)]
        if not wire:
            raise InvalidInputError("add_messages needs at least one message")
        result: MessagesResult | None = None
        for chunk in _chunks(wire, MAX_MESSAGES):  # in order: each request's messages follow the last's
            body = {"channel": channel, "guild": guild, "messages": list(chunk)}
            if index != "now":  # the default is not sent: a server from before `index` takes the request
                body["index"] = index
            response = yield from self._send(Call("POST", "/v1/conversations/messages", body, write=True))
            part = _decoded(response, MessagesResult.from_dict)
            result = part if result is None else result.merged(part)
        assert result is not None
        return result

    def delete_message(self, channel: str, message_id: str, *, guild: str | None) -> Plan[dict[str, Any]]:
        params = [("channel", channel), *([("guild", guild)] if guild is not None else [])]
        path = f"/v1/conversations/messages/{_segment(message_id, 'message id')}"
        response = yield from self._send(Call("DELETE", path, params=params, write=True))
        return dict(mapping_of(response))

    def context(self, channel: str, *, guild: str | None, user: str | None, query: str | None, budget_tokens: int,
                include: Iterable[str] | None) -> Plan[Context]:
        if isinstance(include, str):  # include="facts": one part, not its letters
            include = [include]
        parts = None if include is None else [str(part) for part in include]  # the server names a wrong one
        body = {"channel": channel, "guild": guild, "user": user, "query": query, "budget_tokens": budget_tokens,
                "include": parts}
        response = yield from self._send(Call("POST", "/v1/conversations/context", body))
        return _decoded(response, Context.from_dict)

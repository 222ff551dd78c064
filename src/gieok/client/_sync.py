"""`Client`: the blocking client. Each method runs its plan (`_api.py`) with `httpx.Client`
and `time.sleep`; what is sent, retried and raised is decided there, not here."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx

from ..store.base import VerifyReport
from ..types import Block, SearchResult
from ._api import Api, ScopeLike
from ._http import CONNECT_TIMEOUT, Outcome, Plan, Sleep, connect, tls_context
from .types import BlockPage, Context, Fact, Message, MessagesResult, ServerStats, When

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A blocking client for `gieok serve`'s REST API, with the `Memory` methods' names and
    results (`Block`, `SearchResult` …) and the engine's exceptions.

        with Client("http://127.0.0.1:8420", api_key="gk_…") as memory:
            memory.add("민지: 고양이 이름은 보리야", scope={"channel": "general"})
            hits = memory.search("민지 고양이 이름", k=3).hits

    `base_url` defaults to `$GIEOK_URL`, else http://127.0.0.1:8420. `api_key` defaults to
    `$GIEOK_API_KEY`, else `$GIEOK_KEY`; a call that needs one without it
    raises `AuthenticationError` (`ready()` needs none). Connection failures and 503s are retried
    `retries` times with exponential backoff (`backoff` seconds, doubling, with jitter; a 503's
    Retry-After wins); each write carries an Idempotency-Key that stays the same across its
    retries. `timeout`: seconds to wait for an answer (a write is answered once its texts are
    embedded: a batch of 256 takes tens of seconds, more on a busy server); connecting gives up
    after 10 s. `transport`: an `httpx.BaseTransport` (a proxy, a test's `MockTransport`)."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 300.0,
                 retries: int = 3, backoff: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        self._api = Api(connect(base_url, api_key, retries=retries, backoff=backoff))
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT), transport=transport,
                                 verify=tls_context())

    @property
    def base_url(self) -> str:
        return self._api.connection.base_url

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _run(self, plan: Plan[T]) -> T:
        outcome: Outcome = None
        try:
            while True:
                step = plan.send(outcome)
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    outcome = None
                    continue
                try:
                    outcome = self._http.send(step.request)
                except httpx.RequestError as exc:
                    outcome = exc
        except StopIteration as done:
            return done.value
        finally:
            plan.close()

    # -- blocks ----------------------------------------------------------------------------------
    def add(self, text: str, *, kind: str = "turn", scope: ScopeLike = None, speaker: str | None = None,
            importance: float = 0.5, event_time: When | None = None, tags: Iterable[str] | None = None,
            keywords: Iterable[str] | None = None, metadata: Mapping[str, Any] | None = None) -> Block:
        """Remember one block (`POST /v1/memories`); the block as stored."""
        return self._run(self._api.add(text, kind=kind, scope=scope, speaker=speaker, importance=importance,
                                       event_time=event_time, tags=tags, keywords=keywords, metadata=metadata))

    def add_many(self, items: Iterable[str | Mapping[str, Any]]) -> list[Block]:
        """Remember many blocks (texts or mappings of `add`'s arguments), 256 per request, each
        request one transaction: if one fails, the requests before it stay stored."""
        return self._run(self._api.add_many(items))

    def get(self, block_index: int) -> Block:
        """One block; `BlockNotFoundError` if the key's memory has none with this index."""
        return self._run(self._api.get(block_index))

    def forget(self, block_index: int) -> list[int]:
        """Erase a block's content (the chain still verifies); the indices erased, [] if it
        was already forgotten."""
        return self._run(self._api.forget(block_index))

    def list_blocks(self, *, scope: ScopeLike = None, kinds: Iterable[str] | str | None = None,
                    since: When | None = None, until: When | None = None, limit: int = 50,
                    cursor: str | None = None) -> BlockPage:
        """Live blocks, newest first, a page at a time (`limit` ≤ 200; `cursor` from the last page)."""
        return self._run(self._api.list_blocks(scope=scope, kinds=kinds, since=since, until=until, limit=limit,
                                               cursor=cursor))

    def search(self, query: str, k: int = 10, *, scope: ScopeLike = None,
               kinds: Iterable[str] | str | None = None, since: When | None = None, until: When | None = None,
               mode: str = "hybrid", neighbours: bool = True) -> SearchResult:
        """Hybrid (or `bm25`, `vector`) search; hits with their score breakdown."""
        return self._run(self._api.search(query, k, scope=scope, kinds=kinds, since=since, until=until, mode=mode,
                                          neighbours=neighbours))

    # -- the memory as a whole -------------------------------------------------------------------
    def stats(self) -> ServerStats:
        """Counts, embedder, index, size and each layer's counters."""
        return self._run(self._api.stats())

    def verify(self) -> VerifyReport:
        """Walk the hash chain on the server."""
        return self._run(self._api.verify())

    def ready(self) -> bool:
        """Whether the server is warm (`GET /readyz`, no key): False while it warms or when it
        cannot be reached. One try: a probe answers now."""
        return self._run(self._api.ready())

    def wait_ready(self, timeout: float = 60.0, *, interval: float = 0.25) -> None:
        """Wait until `ready()`; `ServerUnavailableError` naming the URL after `timeout` seconds."""
        self._run(self._api.wait_ready(timeout, interval))

    # -- conversations ---------------------------------------------------------------------------
    def facts(self, user: str | None = None, guild: str | None = None, history: bool = False, *,
              limit: int = 200, as_of: When | None = None, known_at: When | None = None) -> list[Fact]:
        """L3 facts, current ones (with `history`, superseded ones too); `as_of` those true then (the
        conversation's clock), `known_at` as the server knew them then."""
        return self._run(self._api.facts(user=user, guild=guild, history=history, limit=limit, as_of=as_of,
                                        known_at=known_at))

    def add_fact(self, text: str, *, user: str | None = None, guild: str | None = None,
                 valid_from: When | None = None, topic: str = "") -> dict[str, Any]:
        """State a fact about `user` (or `guild`): judged as an extracted one is (a repeat is a
        duplicate, a new value supersedes); this key is its source. `{action, fact, replaced}`."""
        return self._run(self._api.add_fact(text, user=user, guild=guild, valid_from=valid_from, topic=topic))

    def correct_fact(self, fact_id: int, text: str, *, valid_from: When | None = None) -> dict[str, Any]:
        """Correct a wrong fact: a new version takes its place in its history (`{action, fact, replaced}`)."""
        return self._run(self._api.correct_fact(fact_id, text, valid_from=valid_from))

    def forget_fact(self, fact_id: int) -> list[int]:
        """Erase one version of a fact; returns the fact blocks erased."""
        return self._run(self._api.forget_fact(fact_id))

    def fact_history(self, fact_id: int) -> list[dict[str, Any]]:
        """Every version of a fact's attribute, oldest first, each with its sources."""
        return self._run(self._api.fact_history(fact_id))

    def users(self, *, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        """A page of the tenant's users (`users`, and `next`: the `after` of the next page, or None)."""
        return self._run(self._api.users(after=after, limit=limit))

    def user_data(self, user: str) -> dict[str, Any]:
        """Everything the server holds about one user (an access request; an admin key)."""
        return self._run(self._api.user_data(user))

    def forget_user(self, user: str) -> dict[str, Any]:
        """Erase everything of one user; the receipt counts what went (`resumed`: a request cut short
        before this one erased part of it, so the counts are only what was left)."""
        return self._run(self._api.forget_user(user))

    def summary(self, channel: str, guild: str | None = None) -> dict[str, Any]:
        """A conversation's L2 summary as the server sends it (with `markdown`)."""
        return self._run(self._api.summary(channel, guild=guild))

    def add_messages(self, channel: str, messages: Iterable[Message | Mapping[str, Any]], *,
                     guild: str | None = None, index: str = "now") -> MessagesResult:
        """Record a conversation's messages (each with its transport's `id`), 256 per request in
        order; the server keeps each id once, so sending a message again stores nothing. `index="behind"`:
        the answer comes once they are stored as recent messages, their turn blocks are written just
        after (faster; what an agent loop whose next call is the context wants)."""
        return self._run(self._api.add_messages(channel, messages, guild=guild, index=index))

    def delete_message(self, channel: str, message_id: str, *, guild: str | None = None) -> dict[str, Any]:
        """Delete one message sent with `add_messages` and what came from it (its turn, the facts only it
        stated); the receipt counts them. Sending a message id again with another text edits it instead."""
        return self._run(self._api.delete_message(channel, message_id, guild=guild))

    def context(self, channel: str, *, guild: str | None = None, user: str | None = None,
                query: str | None = None, budget_tokens: int = 2000,
                include: Iterable[str] | None = None) -> Context:
        """The conversation's memory fitted to `budget_tokens`: `.text` for a system prompt,
        `.parts` (facts, summary, recalled, recent; `include` picks, None for all)."""
        return self._run(self._api.context(channel, guild=guild, user=user, query=query,
                                           budget_tokens=budget_tokens, include=include))

"""`gieok.client` against `gieok serve`'s app on a real port: every method's typed results, the server's refusals
as the engine's exceptions, tenant isolation through the client, retries over real sockets with
one Idempotency-Key per logical call, and the async client doing the same.

One server for the module (warming loads the model); the keys are made by `gieok keys create`."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gieok import (
    AuthenticationError,
    Block,
    BlockNotFoundError,
    EmbedderError,
    GieokError,
    Hit,
    InvalidInputError,
    LLMError,
    Memory,
    PermissionDeniedError,
    ScoreBreakdown,
    SearchResult,
    ServerError,
    ServerUnavailableError,
    StoreError,
    VerifyReport,
)
from gieok.client import AsyncClient, BlockPage, Client, Fact, ServerStats
from gieok.types import Scope
from live_server import DROP, InProcessServer, Proxy, canned, create_key, free_port

FAST = {"retries": 3, "backoff": 0.01}  # retries without the default's waits


@dataclass
class Served:
    server: InProcessServer
    write: str  # the default tenant's write key
    read: str  # the default tenant's read key
    other: str  # tenant "acme"'s write key

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    db = tmp_path_factory.mktemp("client") / "chat.db"
    keys = (create_key(db, "default", "write"), create_key(db, "default", "read"), create_key(db, "acme", "write"))
    server = InProcessServer(db)
    try:
        yield Served(server, *keys)
    finally:
        server.stop()


def unique(label: str) -> str:
    """A channel no other test writes to, so counts are exact."""
    return f"{label}-{uuid.uuid4().hex[:8]}"


class Recorder:
    """An httpx transport in front of the real one: keeps each request (method, path, headers, body)
    and can fail the first `fail` sends with a connection error before the request leaves."""

    def __init__(self, fail: int = 0, error: type[httpx.TransportError] = httpx.ConnectError) -> None:
        self.real = httpx.HTTPTransport()
        self.fail, self.error = fail, error
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.fail > 0:
            self.fail -= 1
            raise self.error("[Errno 111] Connection refused (the test's transport)", request=request)
        return self.real.handle_request(request)

    def keys(self) -> list[str | None]:
        return [r.headers.get("Idempotency-Key") for r in self.requests]


# -- the engine's types rebuilt from JSON ------------------------------------------------------------

def test_the_engine_types_round_trip_their_as_dict(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "m.db") as memory:
        memory.add_many([{"text": "민지: 고양이 입양했어! 이름은 보리야", "speaker": "민지", "importance": 0.8,
                          "scope": {"guild": "g1", "channel": "general"}, "tags": ["pet"], "metadata": {"lang": "ko"}},
                         {"text": "Alex: I got the offer from Nuvola Labs", "scope": {"channel": "general"}}])
        result = memory.search("민지 고양이 이름", k=5, scope={"channel": "general"})
        memory.forget(2)
        forgotten = memory.get(2)
        report = memory.verify()
    assert result.hits
    for hit in result.hits:
        assert Block.from_dict(hit.block.as_dict()) == hit.block
        assert Hit.from_dict(hit.as_dict()).as_dict() == hit.as_dict()
        assert ScoreBreakdown.from_dict(hit.breakdown.as_dict()).as_dict() == hit.breakdown.as_dict()
    assert Block.from_dict(forgotten.as_dict()) == forgotten and forgotten.forgotten
    assert SearchResult.from_dict(result.as_dict()).as_dict() == result.as_dict()
    assert VerifyReport.from_dict(report.as_dict()) == report


def test_every_client_of_a_process_verifies_https_with_one_context() -> None:
    """A client is cheap to make (a framework may make one per turn): the certificates are read
    once per process, not by each client (~40 ms of CPU each), and https:// is still verified."""
    import ssl

    from gieok.client._http import tls_context

    sync, asynchronous = Client("https://memory.example", api_key="gk_x"), AsyncClient("https://memory.example",
                                                                                        api_key="gk_x")
    try:
        for client in (sync, asynchronous):
            assert client._http._transport._pool._ssl_context is tls_context()  # httpx's pool, as built
    finally:
        sync.close()
        asyncio.run(asynchronous.aclose())
    assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
    assert tls_context().cert_store_stats()["x509_ca"] > 0  # the certificates themselves, loaded


def test_the_async_client_has_the_sync_clients_methods_and_arguments() -> None:
    public = [name for name, _ in inspect.getmembers(Client, inspect.isfunction) if not name.startswith("_")]
    assert {"add", "add_many", "search", "get", "forget", "list_blocks", "stats", "verify", "facts", "summary",
            "ready", "wait_ready", "add_messages", "context", "close"} <= set(public)
    for name in public:
        mine, theirs = inspect.signature(getattr(Client, name)), inspect.signature(getattr(AsyncClient, name))
        assert mine.parameters == theirs.parameters, name
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name


# -- every method, typed ---------------------------------------------------------------------------

def test_every_block_method_returns_the_engines_types(served: Served) -> None:
    channel = unique("general")
    when = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
    with Client(served.url, served.write) as client:
        assert client.ready() is True
        block = client.add("민지: 고양이 입양했어! 이름은 보리야", scope={"guild": "g1", "channel": channel},
                           speaker="민지", importance=0.8, event_time=when, tags=["pet"], keywords=["보리"],
                           metadata={"lang": "ko"})
        assert isinstance(block, Block) and block.block_index >= 1
        assert block.scope == Scope("g1", channel) and block.speaker == "민지" and block.importance == 0.8
        assert block.event_time == when.timestamp() and "pet" in block.tags and block.metadata == {"lang": "ko"}
        assert client.get(block.block_index) == block

        more = client.add_many(["Alex: I got the offer from Nuvola Labs",
                                {"text": "지우: 다음 주에 부산 가", "scope": {"channel": channel}, "speaker": "지우"},
                                {"text": "Alex: the offer is from Nuvola Labs in Berlin", "scope": {"channel": channel},
                                 "kind": "note"}])
        assert [b.block_index for b in more] == list(range(block.block_index + 1, block.block_index + 4))
        assert all(isinstance(b, Block) for b in more) and more[1].scope.channel == channel

        korean = client.search("민지가 키우는 고양이 이름", k=3, scope={"channel": channel})
        assert isinstance(korean, SearchResult) and korean.source and korean.search_time_ms > 0
        assert isinstance(korean.hits[0], Hit) and isinstance(korean.hits[0].breakdown, ScoreBreakdown)
        assert korean.hits[0].block == block and korean.hits[0].breakdown.final > 0
        english = client.search("which company made Alex an offer", k=2, scope={"channel": channel},
                                kinds=["note"], mode="bm25", neighbours=False)
        assert [hit.block.text for hit in english] == ["Alex: the offer is from Nuvola Labs in Berlin"]

        first = client.list_blocks(scope={"channel": channel}, limit=2)
        assert isinstance(first, BlockPage) and [b.block_index for b in first] == [more[2].block_index,
                                                                                  more[1].block_index]
        rest = client.list_blocks(scope={"channel": channel}, limit=2, cursor=first.next_cursor)
        assert [b.text for b in rest.items] == [block.text]
        assert [b.kind for b in client.list_blocks(scope={"channel": channel}, kinds="note")] == ["note"]

        stats = client.stats()
        assert isinstance(stats, ServerStats) and stats.live_blocks >= 4 and stats.dimension > 0
        assert stats.embedder and stats.layers
        assert stats.passages and stats.passages == stats.passages_configured
        report = client.verify()
        assert isinstance(report, VerifyReport) and report.ok and report.checked >= 4

        facts = client.facts(user="minji", history=True)
        assert isinstance(facts, list) and all(isinstance(f, Fact) for f in facts)
        summary = client.summary(channel, guild="g1")
        assert isinstance(summary, dict) and "markdown" in summary

        assert client.forget(more[0].block_index) == [more[0].block_index]
        assert client.forget(more[0].block_index) == []  # already forgotten: nothing more to erase
        gone = client.get(more[0].block_index)
        assert gone.forgotten and gone.text == ""
        assert client.verify().ok


def test_add_many_sends_more_than_256_items_in_several_batches(served: Served) -> None:
    channel = unique("batch")
    recorder = Recorder()
    items = [{"text": f"메모 {i}: 오늘의 단어는 number {i}", "scope": {"channel": channel}} for i in range(300)]
    with Client(served.url, served.write, transport=recorder.transport) as client:
        blocks = client.add_many(items)
        assert [b.text for b in blocks] == [item["text"] for item in items]
        indices = [b.block_index for b in blocks]
        assert indices == list(range(indices[0], indices[0] + 300))
        assert client.add_many([]) == []
    posts = [r for r in recorder.requests if r.url.path == "/v1/memories:batch"]
    keys = [r.headers.get("Idempotency-Key") for r in posts]
    assert all(keys) and len(set(keys)) == 2  # two logical writes (a retry on a busy machine keeps its key)
    sizes = {key: {len(json.loads(r.content)["items"]) for r in posts if r.headers.get("Idempotency-Key") == key}
             for key in keys}
    assert sorted(size for sent in sizes.values() for size in sent) == [44, 256]  # a retry resends the same batch


# -- refusals as the engine's exceptions ---------------------------------------------------------------

def count_in(client: Client, channel: str) -> int:
    return len(client.list_blocks(scope={"channel": channel}, limit=200))


def test_no_key_is_a_clear_authentication_error_before_anything_is_sent(served: Served) -> None:
    recorder = Recorder()
    with Client(served.url, transport=recorder.transport) as client:
        assert client.ready()  # /readyz needs no key
        with pytest.raises(AuthenticationError, match="GIEOK_API_KEY"):
            client.search("민지 고양이")
    assert [r.url.path for r in recorder.requests] == ["/readyz"]
    assert "Authorization" not in recorder.requests[0].headers


def test_the_key_comes_from_the_environment(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIEOK_KEY", served.read)
    with Client(served.url) as client:
        assert client.verify().ok
    monkeypatch.setenv("GIEOK_API_KEY", "gk_wrong_key")  # GIEOK_API_KEY wins over GIEOK_KEY
    with Client(served.url) as client, pytest.raises(AuthenticationError):
        client.verify()


def test_refusals_map_to_the_engines_exceptions_and_store_nothing(served: Served) -> None:
    channel = unique("refused")
    with Client(served.url, "gk_not_a_real_key", **FAST) as wrong, pytest.raises(AuthenticationError):
        wrong.stats()
    with Client(served.url, served.read, **FAST) as reader:
        with pytest.raises(PermissionDeniedError, match="write"):
            reader.add("민지: 읽기 키로 쓰기", scope={"channel": channel})
        with pytest.raises(PermissionDeniedError):
            reader.forget(1)
    with Client(served.url, served.write, **FAST) as client:
        with pytest.raises(BlockNotFoundError, match="no block with index"):
            client.get(10**9)
        with pytest.raises(BlockNotFoundError):
            client.forget(10**9)
        with pytest.raises(InvalidInputError, match="empty"):
            client.add("   ", scope={"channel": channel})
        with pytest.raises(InvalidInputError):  # one bad item: the whole batch is refused
            client.add_many([{"text": "Alex: fine", "scope": {"channel": channel}},
                             {"text": "bad\x00text", "scope": {"channel": channel}}])
        with pytest.raises(InvalidInputError, match="100"):  # 422: k over 100
            client.search("고양이", k=1000)
        with pytest.raises(InvalidInputError):  # 422: a field the server does not know
            client.add_many([{"text": "Alex: hi", "colour": "blue"}])
        with pytest.raises(InvalidInputError, match="too large"):  # 413: over server_max_body_bytes
            client.add("가" * 600_000, scope={"channel": channel})
        with pytest.raises(InvalidInputError, match="scope"):  # refused before sending, as Memory does
            client.add("hello", scope={"room": channel})
        assert count_in(client, channel) == 0


def test_two_tenants_do_not_see_each_others_blocks(served: Served) -> None:
    channel = unique("secret")
    with Client(served.url, served.write) as home, Client(served.url, served.other) as acme:
        acme.add("acme: the launch code is 7788", scope={"channel": channel})
        mine = home.add_many([f"민지: 우리끼리 비밀 {i}번 — 보리는 간식을 좋아해" for i in range(3)])
        top = max(b.block_index for b in mine)
        assert top > len(acme.list_blocks(limit=200)), "the test needs an index only the home tenant has"
        with pytest.raises(BlockNotFoundError):
            acme.get(top)
        with pytest.raises(BlockNotFoundError):
            acme.forget(top)
        assert home.get(top).text == mine[-1].text and not home.get(top).forgotten
        assert all("비밀" not in hit.block.text for hit in acme.search("우리끼리 비밀 보리 간식", k=20))
        assert all("launch code" not in hit.block.text for hit in home.search("the launch code", k=20))
        assert all("비밀" not in b.text for b in acme.list_blocks(limit=200))
        assert count_in(acme, channel) == 1 and count_in(home, channel) == 0


# -- retries ---------------------------------------------------------------------------------------

def test_connection_failures_are_retried_with_the_same_idempotency_key(served: Served) -> None:
    channel = unique("retry")
    recorder = Recorder(fail=2)
    with Client(served.url, served.write, transport=recorder.transport, **FAST) as client:
        block = client.add("민지: 재시도해도 한 번만 저장돼야 해", scope={"channel": channel})
        keys = recorder.keys()
        assert len(keys) == 3 and keys[0] and len(set(keys)) == 1  # three sends, one logical call
        client.add("Alex: a second call is a second write", scope={"channel": channel})
        assert recorder.keys()[3] not in (None, keys[0])
        hits = client.search("search is a read", k=1)
        assert recorder.requests[-1].headers.get("Idempotency-Key") is None and isinstance(hits, SearchResult)
        assert [b.text for b in client.list_blocks(scope={"channel": channel})] == [
            "Alex: a second call is a second write", block.text]


def test_a_dropped_connection_and_a_503_with_retry_after_are_retried_over_real_sockets(served: Served) -> None:
    channel = unique("proxy")
    busy = canned(503, "Service Unavailable", {"error": {"type": "unavailable", "message": "warming"}},
                  Retry_After="1")
    proxy = Proxy(served.server.port, [DROP, busy])
    try:
        with Client(proxy.url, served.write, **FAST) as client:
            started = time.monotonic()
            block = client.add("지우: 다음 주에 부산 가", scope={"channel": channel})
            assert time.monotonic() - started >= 1.0  # the 503's Retry-After was honoured
            assert proxy.requests() == ["POST /v1/memories HTTP/1.1"] * 3
            keys = proxy.idempotency_keys()
            assert len(keys) == 3 and len(set(keys)) == 1
            assert [b.block_index for b in client.list_blocks(scope={"channel": channel})] == [block.block_index]
    finally:
        proxy.close()


def test_503s_that_outlast_the_retries_name_what_is_unavailable(served: Served) -> None:
    store = canned(503, "Service Unavailable",
                   {"error": {"type": "store_unavailable", "message": "database is locked"}})
    embedder = canned(503, "Service Unavailable",
                      {"error": {"type": "embedder_unavailable", "message": "the model failed to load"}})
    other = canned(503, "Service Unavailable", {"error": {"type": "warming", "message": "not yet"}})
    llm = canned(502, "Bad Gateway", {"error": {"type": "llm_unavailable", "message": "every provider failed"}})
    proxy = Proxy(served.server.port, [store, store, embedder, embedder, other, other, llm])
    try:
        with Client(proxy.url, served.write, retries=1, backoff=0.01) as client:
            with pytest.raises(StoreError, match="database is locked"):
                client.stats()
            with pytest.raises(EmbedderError, match="the model failed to load"):
                client.search("고양이", k=1)
            with pytest.raises(ServerUnavailableError, match=proxy.url) as unavailable:
                client.verify()
            assert "503" in str(unavailable.value) and "not yet" in str(unavailable.value)
            with pytest.raises(LLMError, match="every provider failed"):  # a 502 is not retried
                client.stats()
            assert client.stats().live_blocks >= 0  # the proxy's script is spent: through to the server
        assert len(proxy.requests()) == 8
    finally:
        proxy.close()


def test_a_refused_connection_after_the_retries_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens here
    with Client(url, "gk_any", retries=2, backoff=0.01) as client:
        started = time.monotonic()
        with pytest.raises(ServerUnavailableError, match=f"cannot reach the gieok server at {url}") as refused:
            client.add("민지: 아무도 없어?")
        assert "tried 3 times" in str(refused.value) and isinstance(refused.value, ServerError)
        assert isinstance(refused.value, GieokError) and time.monotonic() - started < 5
        assert client.ready() is False
        with pytest.raises(ServerUnavailableError, match=url):
            client.wait_ready(timeout=0.3, interval=0.1)


# -- the async client ------------------------------------------------------------------------------

class AsyncRecorder:
    """`Recorder` for the async client."""

    def __init__(self, fail: int = 0) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.fail = fail
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.fail > 0:
            self.fail -= 1
            raise httpx.ConnectError("[Errno 111] Connection refused (the test's transport)", request=request)
        return await self.real.handle_async_request(request)


def test_the_async_client_does_the_same(served: Served) -> None:
    channel = unique("async")

    async def scenario() -> None:
        recorder = AsyncRecorder()
        async with AsyncClient(served.url, served.write, transport=recorder.transport, **FAST) as client:
            assert await client.ready()
            recorder.fail = 1  # the add's first send fails to connect
            block = await client.add("민지: 비동기로도 보리 얘기", scope={"channel": channel}, speaker="민지")
            keys = [r.headers.get("Idempotency-Key") for r in recorder.requests if r.method == "POST"]
            assert len(keys) == 2 and keys[0] and keys[0] == keys[1]
            assert await client.get(block.block_index) == block
            more = await client.add_many(["Alex: async works in English too",
                                          {"text": "Alex: Nuvola Labs again", "scope": {"channel": channel}}])
            result = await client.search("비동기 보리", k=2, scope={"channel": channel})
            assert isinstance(result, SearchResult) and result.hits[0].block == block
            page = await client.list_blocks(scope={"channel": channel})
            assert [b.block_index for b in page] == [more[1].block_index, block.block_index]
            assert isinstance(await client.stats(), ServerStats) and (await client.verify()).ok
            assert isinstance(await client.facts(), list) and "markdown" in await client.summary(channel)
            assert await client.forget(block.block_index) == [block.block_index]
            with pytest.raises(BlockNotFoundError):
                await client.get(10**9)
            with pytest.raises(InvalidInputError):
                await client.add("", scope={"channel": channel})
        async with AsyncClient(served.url, served.read) as reader:
            with pytest.raises(PermissionDeniedError):
                await reader.add("읽기 키", scope={"channel": channel})
        async with AsyncClient(served.url, "gk_wrong") as wrong:
            with pytest.raises(AuthenticationError):
                await wrong.stats()
        async with AsyncClient(served.url, served.other) as acme:
            with pytest.raises(BlockNotFoundError):
                await acme.get(more[1].block_index)
        url = f"http://127.0.0.1:{free_port()}"
        async with AsyncClient(url, "gk_any", retries=1, backoff=0.01) as nowhere:
            with pytest.raises(ServerUnavailableError, match=url):
                await nowhere.stats()
            assert await nowhere.ready() is False

    asyncio.run(scenario())

"""gieok's MCP server through the official MCP client (the `mcp` SDK), nothing mocked:

- in process (`Client(server)`): every tool, in Korean and English, roles, bad input, revocation;
- over stdio against a real `gieok mcp --db … --key …` subprocess;
- over streamable HTTP against a real `gieok serve` subprocess: no key, a read key, a revoked key,
  and two tenants where the second tries every tool on the first one's data.

Real SQLite files in tmp_path and the real packaged embedder. Every subprocess and every wait is
bounded; servers are stopped in `finally`.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from cli_runner import Ran, gieok
from gieok import Memory
from gieok.chat.conversation.recent import conversation_of
from gieok.server import Principal, ServerState
from gieok.server.mcp import MAX_K, build_mcp, transport_security
from gieok.server.mcp_http import MCP_PATH, LazyMcpEndpoint, create_app_with_mcp
from gieok.server.settings import ServerSettings
from live_server import probe

TOOLS = {"remember", "search_memory", "get_memory", "forget_memory", "list_facts", "conversation_summary",
         "add_messages", "get_context", "remember_fact", "correct_fact", "forget_fact"}
HANGUL = re.compile(r"[가-힣]")
CALL_SECONDS = 120  # a first call loads the embedder in the server process
MARKER = "ALPHA-SECRET-7731"  # every piece of tenant alpha's data carries it
ALPHA_CHANNEL = "alpha-cafe"
ALPHA_GUILD = "g-alpha"
ALPHA_USER = "4242"
ALPHA_FACT = 6  # alpha's fact: its block after the five filler blocks


def run(scenario: Callable[[], Awaitable[Any]], seconds: float = 300) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(seconds):
            return await scenario()

    return anyio.run(bounded)


def text_of(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def ok(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, tool: str, arguments: dict[str, Any], *words: str) -> str:
    result = await client.call_tool(tool, arguments)
    message = text_of(result)
    assert result.is_error, f"{tool} should have failed: {message[:300]}"
    for word in words:
        assert word in message, message
    return message


def _subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return {**env, **extra}


# -- in process ------------------------------------------------------------------------------------

@pytest.fixture
def state(tmp_path: Path) -> Iterator[ServerState]:
    opened = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db")))
    try:
        yield opened
    finally:
        opened.close()


def _principal(state: ServerState, tenant: str, role: str) -> tuple[Principal, int]:
    key, row = state.keys.create(tenant, role, f"{tenant} {role}")
    return state.keys.verify(key), row.key_id


def test_tools_are_described_for_a_model(state: ServerState) -> None:
    server = build_mcp(state, fixed=_principal(state, "default", "read")[0])

    async def scenario() -> None:
        async with Client(server) as client:
            assert "search_memory" in (client.instructions or "")
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            for tool in tools.values():
                assert tool.description and len(tool.description) > 150, tool.name
                assert HANGUL.search(tool.description), f"{tool.name} has no Korean line"
                assert "tenant" not in tool.input_schema["properties"]
                for field in tool.input_schema["properties"].values():
                    assert field.get("description"), tool.name
            read_only = {name for name, tool in tools.items() if tool.annotations and tool.annotations.read_only_hint}
            assert read_only == {"search_memory", "get_memory", "list_facts", "conversation_summary", "get_context"}
            assert tools["forget_memory"].annotations.destructive_hint
            assert tools["forget_fact"].annotations.destructive_hint
            assert tools["search_memory"].input_schema["properties"]["k"]["default"] == 5

    run(scenario)


def test_the_docs_tool_table_lists_every_tool(state: ServerState) -> None:
    """docs/server.md's MCP tool table names every tool `build_mcp` registers, no other, each with
    the role it needs (read: the read-only ones)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "server.md").read_text(encoding="utf-8")
    table = page.split("### Tools", 1)[1].split("\n\n", 2)[1]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    documented = {row[0].strip("`"): row[-1] for row in rows}
    server = build_mcp(state, fixed=_principal(state, "default", "read")[0])

    async def scenario() -> None:
        async with Client(server) as client:
            tools = (await client.list_tools()).tools
            assert set(documented) == {tool.name for tool in tools} == TOOLS
            for tool in tools:
                read_only = bool(tool.annotations and tool.annotations.read_only_hint)
                assert documented[tool.name] == ("read" if read_only else "write"), tool.name

    run(scenario)


def test_every_tool_in_process_korean_and_english(state: ServerState) -> None:
    who, _ = _principal(state, "default", "write")
    cafe = conversation_of("g1", "cafe")
    with state.tenants.use("default") as tenant:
        facts = tenant.conversation.facts
        facts.add("<user:1>의 고양이 이름은 나비다.", fact_type="user_fact", topic="반려동물", guild="g1", user_id="1")
        facts.add("<user:2> has a golden retriever named Max.", fact_type="user_fact", topic="pets", guild="g1",
                  user_id="2")
        facts.add("<user:3>는 24살이다.", fact_type="user_fact", topic="나이", guild="g1", user_id="3", when=100.0)
        facts.add("<user:3>는 25살이다.", fact_type="user_fact", topic="나이", guild="g1", user_id="3", when=200.0)
        tenant.conversation.summaries.update(cafe, {"topic": "고양이 나비 이야기", "new_point": "민지가 나비 소개"})
    server = build_mcp(state, fixed=who)
    told: dict[str, Any] = {}

    async def scenario() -> None:
        async with Client(server) as client:
            korean = await ok(client, "remember", {"text": "민지는 고양이 나비를 키워", "channel": "cafe",
                                                   "guild": "g1", "speaker": "민지", "importance": 0.8,
                                                   "tags": ["pet"]})
            assert korean["kind"] == "note" and korean["scope"] == {"guild": "g1", "channel": "cafe"}
            assert korean["speaker"] == "민지" and "tags" not in korean and "hash" not in korean  # compact
            full = await ok(client, "get_memory", {"block_index": korean["block_index"], "detail": True})
            assert full["tags"] == ["pet"] and full["importance"] == 0.8 and len(full["hash"]) == 64
            english = await ok(client, "remember", {"text": "Alice adopted a golden retriever named Max last week",
                                                    "kind": "fact", "channel": "lounge"})
            assert english["kind"] == "fact" and english["block_index"] == korean["block_index"] + 1
            await ok(client, "remember", {"text": "다음 주 화요일에 Python 스터디 모임이 있어", "kind": "turn"})

            found = await ok(client, "search_memory", {"query": "민지 고양이 이름"})
            assert found["hits"] and "나비" in found["hits"][0]["text"]
            assert set(found["hits"][0]) <= {"block_index", "text", "score", "time", "speaker"}  # compact
            detailed = await ok(client, "search_memory", {"query": "민지 고양이 이름", "detail": True})
            assert {"score", "breakdown", "block"} <= set(detailed["hits"][0])
            assert {"bm25", "vector", "fused", "final"} <= set(detailed["hits"][0]["breakdown"])
            # what a model pays for: three compact hits are a fraction of three full ones
            three = await client.call_tool("search_memory", {"query": "민지 고양이 이름", "k": 3})
            three_full = await client.call_tool("search_memory", {"query": "민지 고양이 이름", "k": 3, "detail": True})
            small, large = len(json.dumps(three.structured_content)), len(json.dumps(three_full.structured_content))
            assert small * 3 < large and small < 1500, (small, large)
            assert found["source"] in ("working_memory", "cache", "checkpoint", "full")
            assert isinstance(found["search_time_ms"], float)
            dog = await ok(client, "search_memory", {"query": "What is the name of Alice's dog?", "k": 3})
            assert "Max" in dog["hits"][0]["text"]
            scoped = await ok(client, "search_memory", {"query": "고양이", "channel": "lounge", "detail": True})
            assert all(hit["block"]["scope"]["channel"] == "lounge" for hit in scoped["hits"])
            kinds = await ok(client, "search_memory", {"query": "golden retriever", "kinds": ["fact"], "detail": True})
            assert kinds["hits"] and all(hit["block"]["kind"] == "fact" for hit in kinds["hits"])

            block = await ok(client, "get_memory", {"block_index": korean["block_index"]})
            assert block["text"] == "민지는 고양이 나비를 키워" and "forgotten" not in block
            await refused(client, "get_memory", {"block_index": 9999}, "not_found", "9999")
            await refused(client, "get_memory", {"block_index": 0})

            gone = await ok(client, "forget_memory", {"block_index": english["block_index"]})
            assert gone == {"block_index": english["block_index"], "forgotten": [english["block_index"]],
                            "already_forgotten": False}
            erased = await ok(client, "get_memory", {"block_index": english["block_index"]})
            assert erased["forgotten"] is True and "Max" not in json.dumps(erased)
            again = await ok(client, "forget_memory", {"block_index": english["block_index"]})
            assert again["already_forgotten"] is True
            await refused(client, "forget_memory", {"block_index": 9999}, "not_found")
            after = await ok(client, "search_memory", {"query": "Alice adopted a golden retriever"})
            assert english["block_index"] not in [hit["block_index"] for hit in after["hits"]]

            listed = await ok(client, "list_facts")
            texts = [fact["text"] for fact in listed["facts"]]
            assert listed["count"] == len(texts) == 3  # the superseded age is history
            assert any("나비" in text for text in texts) and any("Max" in text for text in texts)
            minji = await ok(client, "list_facts", {"user": "1"})
            assert [fact["text"] for fact in minji["facts"]] == ["<user:1>의 고양이 이름은 나비다."]
            age = await ok(client, "list_facts", {"user": "3"})
            assert [fact["text"] for fact in age["facts"]] == ["<user:3>는 25살이다."]
            history = await ok(client, "list_facts", {"user": "3", "history": True})
            assert sorted(fact["text"] for fact in history["facts"]) == ["<user:3>는 24살이다.", "<user:3>는 25살이다."]
            assert [fact["valid_to"] for fact in history["facts"] if "24살" in fact["text"]] == ["1970-01-01T00:03:20Z"]
            full_history = await ok(client, "list_facts", {"user": "3", "history": True, "detail": True})
            assert [fact["valid_to"] for fact in full_history["facts"] if "24살" in fact["text"]] == [200.0]
            assert (await ok(client, "list_facts", {"limit": 1}))["count"] == 1

            summary = await ok(client, "conversation_summary", {"channel": "cafe", "guild": "g1"})
            assert summary["topic"] == "고양이 나비 이야기" and "고양이 나비 이야기" in summary["markdown"]
            empty = await ok(client, "conversation_summary", {"channel": "lounge"})
            assert empty["topic"] == "" and "key_points" not in empty
            assert (await ok(client, "conversation_summary", {"channel": "lounge", "detail": True}))["key_points"] == []

            await refused(client, "remember", {"text": "x", "kind": "rumour"})
            await refused(client, "remember", {"text": "x", "importance": 2})
            await refused(client, "remember", {"text": "   "}, "invalid_input")
            await refused(client, "conversation_summary", {"channel": "no spaces allowed"}, "invalid_input")
            await refused(client, "list_facts", {"user": "gieok:lore"}, "invalid_input")

            # facts by hand: stated, repeated, changed, corrected, forgotten — the key is their source
            told.update(await ok(client, "remember_fact", {"text": "<user:5>는 대전에 산다.", "user": "5",
                                                           "guild": "g1", "valid_from": "2026-01-01T00:00:00+09:00"}))
            assert told["action"] == "stored" and told["fact"]["valid_from"].startswith("2025-12-31T15:00")
            again = await ok(client, "remember_fact", {"text": "<user:5>는 대전에 산다", "user": "5", "guild": "g1"})
            assert again["action"] == "duplicate" and again["block_index"] == told["block_index"]
            moved = await ok(client, "remember_fact", {"text": "<user:5>는 광주에 산다.", "user": "5", "guild": "g1"})
            assert moved["action"] == "superseded"
            fixed = await ok(client, "correct_fact", {"fact_id": moved["block_index"], "text": "<user:5>는 광주 근처 "
                                                                                              "나주에 산다."})
            assert fixed["action"] == "corrected" and fixed["fact"]["current"]
            now = await ok(client, "list_facts", {"user": "5"})
            assert [f["text"] for f in now["facts"]] == ["<user:5>는 광주 근처 나주에 산다."]
            gone = await ok(client, "forget_fact", {"fact_id": fixed["block_index"]})
            assert gone["erased"] == [fixed["block_index"]]
            await refused(client, "correct_fact", {"fact_id": 99999, "text": "x y z w"}, "not_found")
            await refused(client, "forget_fact", {"fact_id": 99999}, "not_found")
            await refused(client, "remember_fact", {"text": "누구에 대한 사실인지 모름"}, "invalid_input")
            await refused(client, "remember_fact", {"text": "x", "user": "5", "tenant": "other"}, "invalid_input")

    run(scenario)
    with state.tenants.use("default") as tenant:
        sources = tenant.conversation.facts.sources([told["block_index"]])[told["block_index"]]
        assert sources[0].author and sources[0].author.startswith("key:")


def test_search_k_is_capped(state: ServerState) -> None:
    with state.tenants.use("default") as tenant:
        tenant.memory.add_many([f"고양이 메모 {i}번: cat note number {i}" for i in range(MAX_K + 10)])
    server = build_mcp(state, fixed=_principal(state, "default", "read")[0])

    async def scenario() -> None:
        async with Client(server) as client:
            many = await ok(client, "search_memory", {"query": "고양이 cat note", "k": 1000})
            assert len(many["hits"]) == MAX_K
            one = await ok(client, "search_memory", {"query": "고양이 cat note", "k": 0})
            assert len(one["hits"]) == 1

    run(scenario)


def test_roles_and_revocation_in_process(state: ServerState) -> None:
    reader, _ = _principal(state, "default", "read")
    writer, writer_id = _principal(state, "default", "write")
    with state.tenants.use("default") as tenant:
        index = tenant.memory.add("준호는 주말마다 북한산에 등산을 가").block_index

    async def scenario() -> None:
        async with Client(build_mcp(state, fixed=reader)) as client:
            await refused(client, "remember", {"text": "읽기 전용 키로 쓰기"}, "forbidden", "write")
            await refused(client, "remember_fact", {"text": "<user:1>는 읽기 전용이다.", "user": "1"}, "forbidden")
            await refused(client, "correct_fact", {"fact_id": index, "text": "읽기 전용"}, "forbidden")
            await refused(client, "forget_fact", {"fact_id": index}, "forbidden")
            await refused(client, "forget_memory", {"block_index": index}, "forbidden")
            assert "forgotten" not in (await ok(client, "get_memory", {"block_index": index}))
            assert (await ok(client, "search_memory", {"query": "준호 등산"}))["hits"]
        async with Client(build_mcp(state, fixed=writer)) as client:
            await ok(client, "search_memory", {"query": "등산"})
            assert state.keys.revoke(writer_id)
            await refused(client, "search_memory", {"query": "등산"}, "revoked")
            await refused(client, "remember", {"text": "after revocation"}, "revoked")

    run(scenario)
    with state.tenants.use("default") as tenant:
        assert tenant.memory.stats().blocks == 1  # neither the reader nor the revoked key wrote


def test_a_block_with_an_integer_beyond_64_bits_is_read_through_the_tools(state: ServerState) -> None:
    """Metadata may hold any JSON integer (the REST routes write it back as sent): the tools that
    show the block answer, not fail."""
    reader, _ = _principal(state, "default", "read")
    with state.tenants.use("default") as tenant:
        index = tenant.memory.add("지수의 회원 번호는 아주 길어", metadata={"big": 2**70}).block_index

    async def scenario() -> None:
        async with Client(build_mcp(state, fixed=reader)) as client:
            shown = await ok(client, "get_memory", {"block_index": index})
            assert shown["text"] == "지수의 회원 번호는 아주 길어" and shown["block_index"] == index
            full = await ok(client, "get_memory", {"block_index": index, "detail": True})
            assert full["metadata"] == {"big": 2**70}
            found = await ok(client, "search_memory", {"query": "지수 회원 번호"})
            assert found["hits"][0]["block_index"] == index
            detailed = await ok(client, "search_memory", {"query": "지수 회원 번호", "detail": True})
            assert detailed["hits"][0]["block"]["block_index"] == index

    run(scenario)


def test_without_identity_every_tool_refuses(state: ServerState) -> None:
    """An HTTP-style server (no fixed principal) reached without the bearer middleware — the
    in-memory client — has no caller: nothing is served, rather than the default tenant."""
    server = build_mcp(state)
    calls = {"remember": {"text": "x"}, "search_memory": {"query": "x"}, "get_memory": {"block_index": 1},
             "forget_memory": {"block_index": 1}, "list_facts": {}, "conversation_summary": {"channel": "c"},
             "add_messages": {"channel": "c", "messages": [{"id": "1", "role": "user", "user": "u", "text": "x"}]},
             "get_context": {"channel": "c"}, "remember_fact": {"text": "<user:u> is here.", "user": "u"},
             "correct_fact": {"fact_id": 1, "text": "x"}, "forget_fact": {"fact_id": 1}}
    assert set(calls) == TOOLS

    async def scenario() -> None:
        async with Client(server) as client:
            for tool, arguments in calls.items():
                await refused(client, tool, arguments, "unauthenticated")

    run(scenario)


def test_no_auth_loopback_server_is_the_default_tenants_admin(tmp_path: Path) -> None:
    """`gieok serve --no-auth` (loopback only): like REST, every caller is the default tenant's admin."""
    opened = ServerState.open(ServerSettings.load(db=str(tmp_path / "open.db")), auth=False)
    try:
        async def scenario() -> None:
            async with Client(build_mcp(opened)) as client:
                block = await ok(client, "remember", {"text": "Dave meets the study group at 7pm"})
                assert (await ok(client, "forget_memory", {"block_index": block["block_index"]}))["forgotten"]

        run(scenario)
        with opened.tenants.use("default") as tenant:
            assert tenant.memory.get(1).forgotten
    finally:
        opened.close()

def test_serve_loads_the_mcp_sdk_at_the_first_mcp_request_once(tmp_path: Path) -> None:
    """`gieok serve` imports no MCP SDK at start (mcp_http.py); the first /mcp requests build it once,
    two arriving together included, and the app's shutdown ends its session manager."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, gieok.server.run; print('mcp' in sys.modules)"],
                            capture_output=True, text=True, env=_subprocess_env(), timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "False", (loaded.stdout, loaded.stderr)
    opened = ServerState.open(ServerSettings.load(db=str(tmp_path / "lazy.db")), auth=False)
    app = create_app_with_mcp(opened, host="127.0.0.1")
    gate = next(route.endpoint for route in app.router.routes if getattr(route, "path", None) == MCP_PATH)
    endpoint = gate.app
    assert isinstance(endpoint, LazyMcpEndpoint) and not endpoint.loaded
    built: list[int] = []
    original = endpoint._build

    def counted() -> tuple[Any, Any]:
        built.append(1)
        return original()

    endpoint._build = counted  # type: ignore[method-assign]
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "test", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1"}

    async def scenario() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                answers = await asyncio.gather(*(http.post(MCP_PATH, json=initialize, headers=headers)
                                                 for _ in range(2)))
                tools = await http.post(MCP_PATH, headers=headers,
                                        json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
                return [*answers, tools]

    answers = asyncio.run(asyncio.wait_for(scenario(), 120))  # the lifespan's end must not hang
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert answers[0].json()["result"]["serverInfo"]["name"] and answers[2].json()["result"]["tools"]
    assert endpoint.loaded and built == [1]


def test_transport_security_names_the_listening_host() -> None:
    loopback = transport_security("127.0.0.1")
    assert loopback.enable_dns_rebinding_protection
    assert {"127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1"} <= set(loopback.allowed_hosts)
    named = transport_security("memory.example.com")
    assert named.allowed_hosts == ["memory.example.com", "memory.example.com:*"]
    assert "https://memory.example.com" in named.allowed_origins
    assert "[2001:db8::1]:*" in transport_security("2001:db8::1").allowed_hosts
    assert not transport_security("0.0.0.0").enable_dns_rebinding_protection


# -- stdio: a real `gieok mcp` -----------------------------------------------------------------------

def _keyed_home(tmp_path: Path, *keys: tuple[str, str]) -> tuple[Path, list[tuple[str, int]]]:
    home = tmp_path / "home.db"
    opened = ServerState.open(ServerSettings.load(db=str(home)))
    try:
        made = [opened.keys.create(tenant, role, f"{tenant} {role}") for tenant, role in keys]
        return home, [(key, row.key_id) for key, row in made]
    finally:
        opened.close()


@pytest.mark.slow
def test_stdio_subprocess(tmp_path: Path) -> None:
    home, [(key, _)] = _keyed_home(tmp_path, ("default", "write"))
    params = StdioServerParameters(command=sys.executable, args=["-m", "gieok.cli", "mcp", "--db", str(home)],
                                   env={"GIEOK_API_KEY": key, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=str(tmp_path))

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=CALL_SECONDS) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            block = await ok(client, "remember", {"text": "민지는 고양이 나비를 키워", "channel": "cafe"})
            await ok(client, "remember", {"text": "Bob goes hiking in the mountains every Saturday"})
            found = await ok(client, "search_memory", {"query": "민지 고양이 이름"})
            assert found["hits"][0]["block_index"] == block["block_index"]
            hiking = await ok(client, "search_memory", {"query": "Who goes hiking?"})
            assert "Bob" in hiking["hits"][0]["text"]

    run(scenario)
    memory = Memory(home)  # the default tenant is the --db file itself
    try:
        assert memory.get(1).text == "민지는 고양이 나비를 키워"
    finally:
        memory.close()


@pytest.mark.slow
def test_stdio_stdout_carries_only_the_protocol(tmp_path: Path) -> None:
    """Raw JSON-RPC lines in, and every line out is JSON-RPC: loading the embedder, opening the
    memory and logging print nothing on stdout."""
    home, [(key, _)] = _keyed_home(tmp_path, ("default", "write"))
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "remember", "arguments": {"text": "Carol studies Python on Tuesdays"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "get_memory", "arguments": {"block_index": 42}}},
    ]
    process = subprocess.Popen([sys.executable, "-m", "gieok.cli", "mcp", "--db", str(home), "--key", key],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=_subprocess_env(), cwd=tmp_path)
    stdout = process.stdout
    assert process.stdin is not None and stdout is not None
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:  # readline has no timeout: a thread reads, the test waits on the queue
        for line in stdout:
            out.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    lines: list[str] = []
    try:
        process.stdin.write("".join(json.dumps(message) + "\n" for message in messages))
        process.stdin.flush()
        while len(lines) < 3:  # stdin stays open until the three answers are in: EOF ends the server
            lines.append(out.get(timeout=CALL_SECONDS))
        process.stdin.close()
        process.wait(timeout=60)
        reader.join(timeout=10)
        while not out.empty():
            lines.append(out.get_nowait())
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    answers = [json.loads(line) for line in lines if line.strip()]
    assert all(answer.get("jsonrpc") == "2.0" for answer in answers)
    by_id = {answer["id"]: answer for answer in answers if "id" in answer}
    assert by_id[1]["result"]["serverInfo"]["name"] == "gieok"
    assert by_id[2]["result"]["structuredContent"]["text"] == "Carol studies Python on Tuesdays"
    assert by_id[3]["result"]["isError"] and "not_found" in by_id[3]["result"]["content"][0]["text"]
    assert process.returncode == 0

def test_stdio_refuses_a_missing_or_bad_key_before_starting(tmp_path: Path) -> None:
    home, [(key, key_id)] = _keyed_home(tmp_path, ("default", "write"))

    def gieok_mcp(*args: str, **env: str) -> Ran:  # in process: refused before anything starts
        return gieok("mcp", *args, env=env, columns=300, stdin="")

    missing = gieok_mcp("--db", str(home))
    bad = gieok_mcp("--db", str(home), "--key", "gk_00000000_" + "x" * 43)
    garbage = gieok_mcp("--db", str(home), GIEOK_API_KEY="not-a-key")
    nowhere = gieok_mcp("--db", str(tmp_path / "absent.db"), "--key", key)
    for result, words in ((missing, ("no API key", "GIEOK_API_KEY")), (bad, ("invalid or revoked",)),
                          (garbage, ("malformed",)), (nowhere, ("no memory at",))):
        assert result.returncode == 1, result.stderr
        assert result.stdout == ""  # stdout is the protocol stream
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
        for word in words:
            assert word in lines[0]
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "absent.db").exists()

    revoked = gieok("keys", "revoke", str(key_id), "--db", str(home))
    assert revoked.returncode == 0, revoked.stderr
    after = gieok_mcp("--db", str(home), "--key", key)
    assert after.returncode == 1 and "revoked" in after.stderr and after.stdout == ""


def test_mcp_help_has_an_example() -> None:
    result = gieok("mcp", "--help")
    assert result.returncode == 0 and "Example:" in result.stdout and "GIEOK_API_KEY" in result.stdout


# -- streamable HTTP: a real `gieok serve` ------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gieok_serve(home: Path, log: Path) -> Iterator[str]:
    """A real `gieok serve` on a free loopback port; yields its base URL; always stopped."""
    port = _free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "gieok.cli", "serve", "--db", str(home), "--port", str(port)],
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   env=_subprocess_env(), cwd=home.parent)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                assert process.poll() is None, f"gieok serve exited: {log.read_text(errors='replace')[-3000:]}"
                try:
                    if probe().get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"gieok serve did not start: {log.read_text(errors='replace')}"
                time.sleep(0.2)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@asynccontextmanager
async def mcp_client(base: str, key: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's streamable HTTP client with a bearer key; mode "legacy" speaks the initialize
    handshake of the 2025 protocol versions (most desktop clients today), "auto" the newest."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=CALL_SECONDS)) as http,
                Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode,
                       read_timeout_seconds=CALL_SECONDS) as client):
        yield client


def _mcp_errors(exc: BaseException) -> list[MCPError]:
    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [found for inner in exc.exceptions for found in _mcp_errors(inner)]
    return []


@asynccontextmanager
async def refused_by_server() -> AsyncIterator[None]:
    """The block must fail with the SDK's error for a non-2xx answer (it maps a 401 to a generic
    'Server returned an error response'; the raw HTTP checks show the 401 itself)."""
    try:
        yield
    except BaseException as exc:  # the client raises inside its task groups
        assert _mcp_errors(exc), repr(exc)
    else:
        raise AssertionError("the server served a client it should have refused")


def _seed_alpha(home: Path) -> None:
    """Alpha's memory: filler blocks (so alpha's block indexes are past any beta will have),
    a summary and facts carrying the marker. Written before the server opens the files."""
    opened = ServerState.open(ServerSettings.load(db=str(home)))
    try:
        with opened.tenants.use("alpha") as alpha:
            alpha.memory.add_many([f"{MARKER} 잡담 {i}" for i in range(5)])
            cafe = conversation_of(ALPHA_GUILD, ALPHA_CHANNEL)
            alpha.conversation.summaries.update(cafe, {"topic": f"{MARKER} 고양이", "new_point": f"{MARKER} 나비"})
            alpha.conversation.facts.add(f"<user:{ALPHA_USER}> has a cat named 나비 {MARKER}", fact_type="user_fact",
                                         guild=ALPHA_GUILD, user_id=ALPHA_USER, topic="pet")
    finally:
        opened.close()


class Recorder:
    """Calls tools as one client and keeps what came back, minus the echoed search query."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: list[str] = []
        self.tried: set[str] = set()

    async def __call__(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        self.tried.add(tool)
        result = await self.client.call_tool(tool, arguments)
        echoed = str(arguments.get("query", "\x00"))  # search_memory repeats its query
        answer = text_of(result) + json.dumps(result.structured_content, ensure_ascii=False)
        self.seen.append(answer.replace(json.dumps(echoed, ensure_ascii=False), "").replace(echoed, ""))
        return result


def own_only(result: CallToolResult) -> bool:
    """A search that found nothing, or only beta's own notes."""
    return not result.is_error and all(hit["text"].startswith(("beta's own note", "beta's message"))
                                       for hit in result.structured_content["hits"])


async def beta_tries_alpha(beta: Client, index: int, *, own_blocks: int) -> None:
    """Beta's key through every tool, each argument naming alpha's block, channel, guild or user."""
    assert {tool.name for tool in (await beta.list_tools()).tools} == TOOLS
    call = Recorder(beta)
    alpha_where = {"channel": ALPHA_CHANNEL, "guild": ALPHA_GUILD}
    assert own_only(await call("search_memory", {"query": f"{MARKER} 민지 고양이 나비 잡담", "k": 50}))
    for scope in (alpha_where, {"channel": ALPHA_CHANNEL}, {"guild": ALPHA_GUILD}):
        assert own_only(await call("search_memory", {"query": "고양이 나비", **scope}))
    got = await call("get_memory", {"block_index": index})
    assert got.is_error and "not_found" in text_of(got)
    for other in range(own_blocks + 1, index):  # every index alpha has and beta does not
        assert (await call("get_memory", {"block_index": other})).is_error
    forgot = await call("forget_memory", {"block_index": index})
    assert forgot.is_error and "not_found" in text_of(forgot)
    facts = await call("list_facts", {"user": ALPHA_USER, "history": True})
    assert facts.structured_content["facts"] == []
    everyone = await call("list_facts", {"history": True, "guild": ALPHA_GUILD})
    assert everyone.structured_content["facts"] == []
    summary = await call("conversation_summary", alpha_where)
    assert not summary.is_error and summary.structured_content["topic"] == ""
    for detail in (False, True):
        context = await call("get_context", {**alpha_where, "user": ALPHA_USER, "query": "민지 고양이 나비 이름",
                                             "budget_tokens": 4000, "detail": detail})
        assert not context.is_error  # beta's own (empty) conversation: nothing of alpha's
    own = await call("remember", {"text": "beta's own note about 고양이", **alpha_where})
    assert not own.is_error and own.structured_content["block_index"] == own_blocks + 1  # in beta's memory
    for tool, arguments in (("correct_fact", {"fact_id": ALPHA_FACT, "text": "beta's correction"}),
                            ("forget_fact", {"fact_id": ALPHA_FACT})):
        answer = await call(tool, arguments)
        assert answer.is_error and "not_found" in text_of(answer), text_of(answer)
    nobody = await call("remember_fact", {"text": "beta states nothing about anyone"})  # refused: writes nothing
    assert nobody.is_error and "invalid_input" in text_of(nobody)
    sent = await call("add_messages", {**alpha_where, "messages": [
        {"id": "beta-1", "role": "user", "user": ALPHA_USER, "name": "민지", "text": "beta's message about 나비"}]})
    assert not sent.is_error  # stored in beta's memory (once: the second round's copy is a duplicate)
    assert call.tried == TOOLS  # a new tool must join this matrix
    assert not [answer for answer in call.seen if MARKER in answer]


@pytest.mark.slow
def test_streamable_http_against_gieok_serve(tmp_path: Path) -> None:
    home, made = _keyed_home(tmp_path, ("alpha", "write"), ("beta", "admin"), ("beta", "read"), ("alpha", "read"))
    (alpha_key, _), (beta_key, _), (beta_reader, _), (alpha_reader, alpha_reader_id) = made
    _seed_alpha(home)
    alpha_where = {"channel": ALPHA_CHANNEL, "guild": ALPHA_GUILD}

    with gieok_serve(home, tmp_path / "serve.log") as base:
        # no key, an unknown key, a malformed key: refused before any MCP handling. No key: 401 pointing at
        # the RFC 9728 metadata; a key that is not valid: 403 with the reason, which MCP clients show (on any
        # 401 they start an OAuth flow, and there is no OAuth here)
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "test", "version": "0"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        metadata_url = f"{base}/.well-known/oauth-protected-resource/mcp"
        for headers, status, reason in (
                ({}, 401, "missing API key"), ({"Authorization": f"Basic {alpha_key}"}, 401, "missing API key"),
                ({"Authorization": "Bearer gk_00000000_" + "x" * 43}, 403, "invalid or revoked API key"),
                ({"Authorization": "Bearer nope"}, 403, "malformed API key")):
            response = httpx.post(f"{base}/mcp", json=initialize, headers={**accept, **headers}, timeout=30)
            assert response.status_code == status, response.text
            assert response.json()["error"] == "invalid_token" and reason in response.json()["error_description"]
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith("Bearer ")
            assert (f'resource_metadata="{metadata_url}"' in challenge) == (status == 401), challenge
            assert status == 401 or ('error="invalid_token", error_description="' in challenge and reason in challenge)
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            metadata = httpx.get(f"{base}{path}", timeout=30)  # public, as RFC 9728 has it
            assert metadata.status_code == 200 and metadata.json() == {
                "resource": f"{base}/mcp", "resource_name": "gieok memory", "bearer_methods_supported": ["header"]}
            assert "authorization_servers" not in metadata.json()  # keys, not OAuth: nothing to sign in to
        # the REST app around it is unchanged
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
        missing = httpx.get(f"{base}/v1/nothing-here", timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
        # a foreign Host header (DNS rebinding) is refused even with a key
        rebinding = httpx.post(f"{base}/mcp", json=initialize, timeout=30,
                               headers={**accept, "Authorization": f"Bearer {alpha_key}", "Host": "evil.example:80"})
        assert rebinding.status_code == 421 and rebinding.json()["error"]["type"] == "misdirected_request"
        # and a page of another site (its Origin) too — with the JSON error body (was plain text)
        foreign = httpx.post(f"{base}/mcp", json=initialize, timeout=30,
                             headers={**accept, "Authorization": f"Bearer {alpha_key}", "Origin": "http://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "forbidden_origin", foreign.text
        own = httpx.post(f"{base}/mcp", json=initialize, timeout=30,
                         headers={**accept, "Authorization": f"Bearer {alpha_key}", "Origin": base})
        assert own.status_code == 200, own.text

        async def scenario() -> None:
            async with refused_by_server(), mcp_client(base, None) as client:
                await client.list_tools()

            async with mcp_client(base, alpha_key) as alpha:
                marker = await ok(alpha, "remember", {"text": f"{MARKER} 민지는 고양이 나비를 키워",
                                                      **alpha_where, "speaker": "민지"})
                index = marker["block_index"]
                assert index == 7  # after the five filler blocks and the fact

            async with mcp_client(base, beta_reader, "legacy") as reader:
                await refused(reader, "remember", {"text": "a reader's note"}, "forbidden", "write")
                await refused(reader, "forget_memory", {"block_index": 1}, "forbidden")
                assert (await ok(reader, "search_memory", {"query": "a reader's note"}))["hits"] == []

            # beta's admin key through every tool, every argument aimed at alpha's data, in both protocol eras
            for round_, mode in enumerate(("auto", "legacy"), start=1):
                async with mcp_client(base, beta_key, mode) as beta:
                    await beta_tries_alpha(beta, index, own_blocks=2 * (round_ - 1))  # a note and a message

            # alpha's data is intact, and beta's note did not land in it
            async with mcp_client(base, alpha_key) as alpha:
                block = await ok(alpha, "get_memory", {"block_index": index})
                assert MARKER in block["text"] and "forgotten" not in block
                found = await ok(alpha, "search_memory", {"query": "민지 고양이 나비"})
                assert MARKER in found["hits"][0]["text"]
                assert all("beta" not in hit["text"] for hit in found["hits"])
                facts = await ok(alpha, "list_facts", {"user": ALPHA_USER})
                assert any(MARKER in fact["text"] for fact in facts["facts"])
                summary = await ok(alpha, "conversation_summary", alpha_where)
                assert MARKER in summary["topic"]

            # a key revoked while its client is connected is refused from its next call on
            async with mcp_client(base, alpha_reader) as reader:
                assert (await ok(reader, "search_memory", {"query": "민지 고양이"}))["hits"]
                revoke = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [sys.executable, "-m", "gieok.cli", "keys", "revoke", str(alpha_reader_id), "--db", str(home)],
                    capture_output=True, text=True, env=_subprocess_env(), timeout=120))
                assert revoke.returncode == 0, revoke.stderr
                async with refused_by_server():  # its next POST is answered 401
                    await reader.call_tool("search_memory", {"query": "민지 고양이"})
            async with refused_by_server(), mcp_client(base, alpha_reader) as reader:
                await reader.list_tools()

        run(scenario, seconds=600)
        after = httpx.post(f"{base}/mcp", json=initialize, timeout=30,
                           headers={**accept, "Authorization": f"Bearer {alpha_reader}"})
        assert after.status_code == 403 and "revoked" in after.json()["error_description"]
        # what `gieok mcp` writes on this memory reaches this server's live stream (server/relay.py)
        mcp_events_reach_the_stream(base, home, alpha_key, tmp_path)


# -- events written through `gieok mcp` reach `gieok serve`'s stream (checked in the HTTP test above) ----

def _sse(base: str, key: str, since: int | None, found: Callable[[list[dict[str, Any]]], bool],
         into: queue.Queue[list[dict[str, Any]]], seconds: float = 60) -> None:
    """Read `/v1/events` until `found(events so far)` (each event as `{"id", "type", "data"}`), then
    put the events on `into` (a thread's work: the stream never ends by itself)."""
    url = f"{base}/v1/events" + (f"?since={since}" if since is not None else "")
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    deadline = time.monotonic() + seconds
    try:
        with httpx.stream("GET", url, headers={"Authorization": f"Bearer {key}"}, timeout=seconds) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("id: "):
                    current["id"] = int(line[4:])
                elif line.startswith("event: "):
                    current["type"] = line[7:]
                elif line.startswith("data: "):
                    current["data"] = json.loads(line[6:]).get("data")
                elif not line and current:
                    events.append(current)
                    current = {}
                    if found(events) or time.monotonic() > deadline:
                        break
    finally:
        into.put(events)


def _added(events: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == "memory.added" and any(
        block.get("text") == text for block in (e.get("data") or {}).get("blocks", []))]


def mcp_events_reach_the_stream(base: str, home: Path, key: str, cwd: Path) -> None:
    """A `gieok mcp` process (the SDK's stdio client) writes; the `gieok serve` at `base`, on the same
    SQLite file, streams the event live, numbered next in its own stream, and a client resuming from
    the event before it gets it next — no `stream.gap` (the mcp process took no ids of the stream)."""
    live: queue.Queue[list[dict[str, Any]]] = queue.Queue()
    said = "민지: 고양이 이름은 나비야 (written over MCP stdio)"
    threading.Thread(target=_sse, args=(base, key, 0, lambda seen: bool(_added(seen, said)), live),
                     daemon=True).start()
    params = StdioServerParameters(command=sys.executable, args=["-m", "gieok.cli", "mcp", "--db", str(home)],
                                   env={"GIEOK_API_KEY": key, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=str(cwd))

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=CALL_SECONDS) as client:
            await ok(client, "remember", {"text": said, "channel": "cafe"})

    run(scenario)
    events = live.get(timeout=60)
    [relayed] = _added(events, said)
    before = events[events.index(relayed) - 1]
    assert relayed["id"] == before["id"] + 1  # the next id of the server's stream: nothing in between
    # (a gap may open the replay: the events of a process that wrote this memory before the server ran)
    assert not [e for e in events[1:] if e.get("type") == "stream.gap"]
    resumed: queue.Queue[list[dict[str, Any]]] = queue.Queue()
    _sse(base, key, before["id"], lambda seen: len(seen) >= 1, resumed)
    [first] = resumed.get(timeout=1)
    assert first["type"] == "memory.added" and first["id"] == relayed["id"], first


def test_the_relay_reaches_every_server_and_one_claims_each_event(tmp_path: Path) -> None:
    """Two servers' pumps on one memory (as `--workers 2`): each publishes a relayed event into its
    own stream; exactly one claims it (its webhooks); a server that starts later takes up only what
    no server took. A `user.erased` redacts the relay's copies before it is written."""
    from gieok.coordination.events import REDACTED
    from gieok.server.events import EventBus
    from gieok.server.relay import RelayPump

    home = tmp_path / "home.db"
    writer = ServerState.open(ServerSettings.load(db=str(home)))
    first = ServerState.open(ServerSettings.load(db=str(home)))
    try:
        writer.bus.relay = writer.event_relay  # what `gieok mcp` does
        table = first.event_relay
        assert table is not None
        pumps = [RelayPump(table, bus) for bus in (EventBus(), EventBus())]
        for pump in pumps:
            pump.begin()
        said = {"blocks": [{"block_index": 7, "text": "민지: 보리야"}]}
        written = writer.bus.publish("default", "memory.added", said)
        assert written.seq == 0  # no id of any stream is taken by the writer
        assert [pump.step() for pump in pumps] == [1, 1]
        for pump in pumps:
            [event] = pump.bus.recent("default")
            assert event.seq == 1 and event.data["blocks"][0]["text"] == "민지: 보리야" and event.time == written.time
        assert {row.claimed_by for row in table.after(0)} <= {pumps[0].holder, pumps[1].holder}
        assert [pump.step() for pump in pumps] == [0, 0]  # nothing twice

        writer.bus.publish("default", "memory.added", {"blocks": [{"block_index": 8, "text": "Alex: Nuvola Labs"}]})
        late = RelayPump(table, EventBus())
        late.begin()  # starts at the row no server took yet
        assert late.step() == 1 and [e.data["blocks"][0]["block_index"] for e in late.bus.recent("default")] == [8]
        assert pumps[0].step() == 1  # already claimed by the late one: still in this stream, not claimed twice
        assert {row.relay_id: row.claimed_by for row in table.after(0)}[2] == late.holder

        writer.bus.publish("default", "user.erased", {"user": "u-minji", "blocks": [7]})
        assert table.after(0)[0].data == REDACTED  # the relay's copy, before the erasure is written
        pumps[1].step()
        assert pumps[1].bus.recent("default")[0].data == REDACTED  # and each server's buffer, as it reads it
    finally:
        writer.close()
        first.close()

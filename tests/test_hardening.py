"""What an outside review of `gieok serve` found (issue 23), each finding reproduced against a real
server where it matters — a `gieok serve` process on loopback, real sockets, real HTTP bytes — or
the in-process app where the app alone decides:

1. `--no-auth` reachable from other sites: Host allow-list on every route, Origin on every write
   and the WebSocket.
2. A revoked key's open SSE and WebSocket streams are closed within seconds.
3. Event ids survive a restart; a `since` ahead of the stream is refused, not silently accepted.
4. `/docs` from vendored assets under the dashboard's CSP, with a bearer security scheme.
5. Dashboard login throttled; sessions are opaque server-side ids with idle and absolute expiry.
6. `GET /mcp` answers 405 at once.
7. MCP tools refuse unknown arguments, in the `invalid_input:` form.
8. Quiet logs on a normal WebSocket disconnect; one status per kind of bad body; NaN refused by name.
9. An export imported back into the same memory duplicates nothing.
10. Forgetting a user removes every block of theirs, any kind.
11. `Idempotency-Key` on every write: a retry after a cut connection stores once.

Every subprocess and every wait is bounded; servers are stopped in `finally`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from live_server import GIEOK, clean_env, create_key_with_id
from live_server import LiveServer as Server
from test_server_process import sse_events

ATTACKER = "http://attacker.example"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A `--no-auth` server that also answers to `memory.test` (`--allow-host`), shared by the
    module's tests (a start costs ~11 s): each counts from what it finds, and the one that stops
    it to read its whole log comes last."""
    srv = Server(tmp_path_factory.mktemp("open") / "open.db", "--no-auth", "--allow-host", "memory.test")
    try:
        yield srv
    finally:
        srv.stop()


def _handshake(port: int, host: str, path: str = "/v1/events/ws") -> bytes:
    """The status line a raw WebSocket handshake with this Host header gets."""
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0]


def _export(blocks: int) -> bytes:
    """An export of `blocks` blocks, made by a real memory."""
    from gieok import Memory

    with Memory(":memory:") as memory:
        memory.add_many([f"가져온 블록 {i}" for i in range(blocks)])
        return "".join(memory.export_lines()).encode()


# -- 1. --no-auth: Host allow-list and Origin ------------------------------------------------------

@pytest.mark.slow  # a real `gieok serve` process
def test_finding_1_no_auth_answers_no_foreign_host_and_no_cross_origin_write(open_server: Server) -> None:
    srv = open_server
    foreign = {"Host": "attacker.example"}
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        before = client.get("/v1/stats").json()["blocks"]
        assert client.post("/v1/memories", json={"text": "로컬 메모"}).status_code == 201
        # DNS rebinding: every route, read or not, refuses a Host that is not this server's
        for path in ("/v1/memories", "/v1/stats", "/v1/export", "/healthz", "/readyz", "/", "/docs", "/openapi.json",
                     "/static/gieok.css", "/v1/events?since=0"):
            refused = client.get(path, headers=foreign)
            assert refused.status_code == 421, (path, refused.status_code, refused.text[:200])
            assert refused.json()["error"]["type"] == "misdirected_request" and "로컬 메모" not in refused.text
        mcp = client.post("/mcp", headers={**foreign, "Accept": "application/json, text/event-stream"},
                          json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert mcp.status_code == 421
        # loopback names and --allow-host names are served
        for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "memory.test", f"memory.test:{srv.port}"):
            assert client.get("/v1/stats", headers={"Host": host}).status_code == 200, host
        # cross-origin writes: refused whatever the Content-Type, nothing stored
        export = _export(11)
        for content_type in ("text/plain", "application/x-ndjson"):
            imported = client.post("/v1/import", content=export,
                                   headers={"Content-Type": content_type, "Origin": ATTACKER})
            assert imported.status_code == 403 and imported.json()["error"]["type"] == "forbidden", imported.text
        for origin in (ATTACKER, "null", f"http://127.0.0.1:{srv.port + 1}"):
            written = client.post("/v1/memories", json={"text": "from another site"}, headers={"Origin": origin})
            assert written.status_code == 403, (origin, written.text)
        assert client.delete("/v1/memories/1", headers={"Origin": ATTACKER}).status_code == 403
        assert client.delete("/v1/facts/users/u1", headers={"Origin": ATTACKER}).status_code == 403
        assert client.get("/v1/stats").json()["blocks"] == before + 1
        # this server's own pages (and clients that send no Origin) still write
        own = client.post("/v1/memories", json={"text": "same origin"}, headers={"Origin": srv.url})
        assert own.status_code == 201
        assert client.get("/v1/stats").json()["blocks"] == before + 2
    # the WebSocket: another site's page gets nothing; a foreign Host is refused at the handshake
    socket_url = f"ws://127.0.0.1:{srv.port}/v1/events/ws?since=0"
    with ws_connect(socket_url, additional_headers={"Origin": ATTACKER}, open_timeout=10) as ws, \
            pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    assert _handshake(srv.port, "attacker.example").startswith(b"HTTP/1.1 403")
    assert _handshake(srv.port, f"localhost:{srv.port}").startswith(b"HTTP/1.1 101")
    with ws_connect(socket_url, additional_headers={"Origin": srv.url}, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "memory.added"


# -- 6, 7. MCP: GET answers 405 at once; unknown arguments refused in the documented form -----------

@pytest.mark.slow  # a real `gieok serve` process
def test_finding_6_get_mcp_answers_405_at_once(open_server: Server) -> None:
    started = time.monotonic()
    for method in ("GET", "DELETE"):
        response = httpx.request(method, f"{open_server.url}/mcp", timeout=5,
                                 headers={"Accept": "text/event-stream, application/json"})
        assert response.status_code == 405 and response.headers["allow"] == "POST"
        assert response.json()["error"]["type"] == "method_not_allowed"
    assert time.monotonic() - started < 5
    listed = httpx.post(f"{open_server.url}/mcp", timeout=60, headers={"Accept": "application/json, text/event-stream"},
                        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert listed.status_code == 200 and listed.json()["result"]["tools"]


def _mcp_state(tmp_path: Path) -> Any:
    from gieok.server import ServerState
    from gieok.server.settings import ServerSettings

    return ServerState.open(ServerSettings.load(db=str(tmp_path / "mcp.db")))


def test_finding_7_mcp_tools_refuse_unknown_arguments_as_invalid_input(tmp_path: Path) -> None:
    import anyio
    from mcp import Client

    from gieok.server.mcp import build_mcp

    state = _mcp_state(tmp_path)
    alpha_key, _ = state.keys.create("alpha", "write")
    beta_key, _ = state.keys.create("beta", "write")

    async def scenario() -> None:
        for tenant, key in (("alpha", alpha_key), ("beta", beta_key)):
            server = build_mcp(state, fixed=state.keys.verify(key))
            async with Client(server) as client:
                tools = (await client.list_tools()).tools
                assert tools and all(tool.input_schema.get("additionalProperties") is False for tool in tools)
                other = "beta" if tenant == "alpha" else "alpha"
                refused = await client.call_tool("remember", {"text": f"{tenant}의 메모", "tenant": other})
                message = " ".join(getattr(block, "text", "") for block in refused.content)
                assert refused.is_error and "invalid_input: tenant: unknown argument" in message, message
                assert "validation error" not in message and "rememberArguments" not in message
                for bad in ({"text": "x", "importance": float("nan")}, {"text": "x", "importance": 7},
                            {"text": "x", "owner": "b"}):
                    result = await client.call_tool("remember", bad)
                    said = " ".join(getattr(block, "text", "") for block in result.content)
                    assert result.is_error and "invalid_input: " in said, said
                nested = await client.call_tool("add_messages", {"channel": "c", "messages": [
                    {"id": "1", "role": "user", "user": "u", "text": "x", "tenant": other}]})
                assert nested.is_error and "invalid_input: messages.0.tenant" in nested.content[0].text  # type: ignore[union-attr]
                searched = await client.call_tool("search_memory", {"query": "메모", "tenant": other})
                assert searched.is_error and "invalid_input" in searched.content[0].text  # type: ignore[union-attr]
                stored = await client.call_tool("remember", {"text": f"{tenant}의 메모"})
                assert not stored.is_error
        for tenant in ("alpha", "beta"):
            with state.tenants.use(tenant) as t:
                assert [b.text for b in t.memory.iter_blocks()] == [f"{tenant}의 메모"]

    try:
        anyio.run(scenario)
    finally:
        state.close()


# -- 8. quiet logs, one status per kind of bad body, NaN by name ------------------------------------

@pytest.mark.slow  # a real `gieok serve` process
def test_finding_8_a_normal_websocket_disconnect_logs_no_error(open_server: Server) -> None:
    srv = open_server
    url = f"ws://127.0.0.1:{srv.port}/v1/events/ws?since=0"
    httpx.post(f"{srv.url}/v1/memories", json={"text": "이벤트 하나"}, timeout=60)
    with ws_connect(url, open_timeout=10) as ws:  # the client closes (1000)
        assert json.loads(ws.recv(timeout=10))["seq"] == 1
    with contextlib.suppress(ConnectionClosed), ws_connect(url, open_timeout=10) as ws:
        ws.recv(timeout=10)
        # The client goes away without a close frame: shutdown() sends the FIN at once (a bare
        # close() of a socket the library's reader thread is blocked on sends nothing, and the
        # context's close handshake then waited out its timeouts: 20 s for the same disconnect).
        ws.socket.shutdown(socket.SHUT_RDWR)
    with ws_connect(url, open_timeout=10) as ws:  # the client leaves while an event is on its way
        httpx.post(f"{srv.url}/v1/memories", json={"text": "이벤트 둘"}, timeout=60)
    time.sleep(1.0)
    srv.stop()
    log = srv.log
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def _in_process(tmp_path: Path) -> Any:
    from starlette.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings

    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db")))
    keys = {tenant: {"Authorization": f"Bearer {state.keys.create(tenant, 'admin')[0]}"} for tenant in ("a", "b")}
    return state, TestClient(create_app(state)), keys


@pytest.mark.parametrize("body", [
    b'{"text": ',                                          # malformed
    b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested too deeply for the parser
    b"[" * 5000 + b"]" * 5000,
    b'{"text": "\xff\xfe"}',                              # not UTF-8
])
def test_finding_8_every_body_that_is_not_json_gets_the_same_422(tmp_path: Path, body: bytes) -> None:
    _, client, keys = _in_process(tmp_path)
    with client:
        for route in ("/v1/memories", "/v1/memories:batch", "/v1/search", "/v1/conversations/messages"):
            response = client.post(route, content=body, headers={**keys["a"], "content-type": "application/json"})
            assert response.status_code == 422, (route, response.text[:200])
            assert response.json()["error"]["type"] == "invalid_json", response.text[:200]
        assert client.get("/v1/stats", headers=keys["a"]).json()["blocks"] == 0


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_finding_8_nan_and_infinity_are_refused_by_name(tmp_path: Path, value: str) -> None:
    _, client, keys = _in_process(tmp_path)
    with client:
        for tenant in ("a", "b"):
            one = client.post("/v1/memories", content=f'{{"text": "x", "importance": {value}}}'.encode(),
                              headers={**keys[tenant], "content-type": "application/json"})
            batch = client.post("/v1/memories:batch", content=f'{{"items": [{{"text": "x", "event_time": {value}}}]}}'
                                .encode(), headers={**keys[tenant], "content-type": "application/json"})
            search = client.post("/v1/search", content=f'{{"query": "x", "since": {value}}}'.encode(),
                                 headers={**keys[tenant], "content-type": "application/json"})
            for response in (one, batch, search):
                assert response.status_code == 422, response.text
                message = response.json()["error"]["message"]
                assert "NaN and Infinity are refused" in message and "less than" not in message, message
            assert client.get("/v1/stats", headers=keys[tenant]).json()["blocks"] == 0


# -- 10. forgetting a user: every block of theirs, any kind -----------------------------------------

def test_finding_10_forget_user_removes_every_block_of_theirs_any_kind(tmp_path: Path) -> None:
    _, client, keys = _in_process(tmp_path)
    with client:
        for tenant in ("a", "b"):
            h = keys[tenant]
            assert client.post("/v1/memories", json={"text": f"{tenant}: u1의 노트 (scope)", "kind": "note",
                                                     "scope": {"user": "u1"}}, headers=h).status_code == 201
            assert client.post("/v1/memories", json={"text": f"{tenant}: u1 wrote this note", "kind": "note",
                                                     "speaker": "u1"}, headers=h).status_code == 201
            assert client.post("/v1/memories", json={"text": f"{tenant}: u1 likes tea", "kind": "fact",
                                                     "scope": {"user": "u1"}}, headers=h).status_code == 201
            other = client.post("/v1/memories", json={"text": f"{tenant}: u2의 노트", "kind": "note",
                                                      "scope": {"user": "u2"}, "speaker": "u2"}, headers=h)
            assert other.status_code == 201
            sent = client.post("/v1/conversations/messages", headers=h, json={"channel": "c", "messages": [
                {"id": f"{tenant}-1", "role": "user", "user": "u1", "text": f"{tenant}: 안녕 나는 u1이야"}]})
            assert sent.status_code == 202, sent.text
        erased = client.delete("/v1/facts/users/u1", headers=keys["a"])
        assert erased.status_code == 200 and erased.json()["erased"]["blocks"] >= 4, erased.text
        live_a = [b for b in client.get("/v1/memories", params={"limit": 200}, headers=keys["a"]).json()["items"]
                  if not b["forgotten"]]
        assert [b["text"] for b in live_a] == ["a: u2의 노트"]
        live_b = [b for b in client.get("/v1/memories", params={"limit": 200}, headers=keys["b"]).json()["items"]
                  if not b["forgotten"]]
        assert len(live_b) == 5  # the other tenant's u1 is someone else: nothing of theirs is touched
        assert client.get("/v1/verify", headers=keys["a"]).json()["ok"]


# -- 9. an export imported back into the same memory ------------------------------------------------

def test_finding_9_import_into_a_non_empty_memory_skips_the_blocks_it_holds(tmp_path: Path) -> None:
    _, client, keys = _in_process(tmp_path)
    with client:
        a, b = keys["a"], keys["b"]
        items = [{"text": f"블록 {i}", "scope": {"channel": "c"}, "kind": "note" if i % 2 else "turn",
                  "event_time": 1_767_225_600 + i} for i in range(6)]
        items.append({"text": "블록 0", "scope": {"channel": "other"}, "event_time": 1_767_225_600})  # elsewhere
        assert client.post("/v1/memories:batch", json={"items": items}, headers=a).status_code == 201
        client.delete("/v1/memories/2", headers=a)  # a tombstone travels too, and is never revived
        exported = client.get("/v1/export", headers=a).content
        again = client.post("/v1/import", content=exported, headers=a)
        assert again.status_code == 200 and again.json() == {"imported": 0}, again.text
        assert client.get("/v1/stats", headers=a).json()["blocks"] == 7
        # another tenant holding some of them: only the missing ones are written, once
        assert client.post("/v1/memories", json={"text": "블록 3", "scope": {"channel": "c"}, "kind": "note",
                                                 "event_time": 1_767_225_603}, headers=b).status_code == 201
        assert client.post("/v1/memories", json={"text": "b의 블록"}, headers=b).status_code == 201
        first = client.post("/v1/import", content=exported, headers=b).json()
        assert first == {"imported": 5}  # 6 live blocks, minus the one b holds
        assert client.post("/v1/import", content=exported, headers=b).json() == {"imported": 0}
        texts = sorted(blk["text"] for blk in client.get("/v1/memories", params={"limit": 200},
                                                         headers=b).json()["items"])
        assert texts == sorted(["b의 블록", "블록 0", "블록 0", "블록 2", "블록 3", "블록 4", "블록 5"])
        assert client.get("/v1/verify", headers=b).json()["ok"] and client.get("/v1/verify", headers=a).json()["ok"]


# -- 11. Idempotency-Key: the same key, the first answer, one write ---------------------------------

def _messages(tenant: str, n: int = 2) -> dict[str, Any]:
    return {"channel": "c", "messages": [{"id": f"{tenant}-{i}", "role": "user", "user": "u1",
                                          "text": f"{tenant}의 메시지 {i}"} for i in range(n)]}


def test_finding_11_the_same_idempotency_key_twice_writes_once_on_every_write_route(tmp_path: Path) -> None:
    _, client, keys = _in_process(tmp_path)
    with client:
        for tenant in ("a", "b"):  # the same keys in two tenants are two tenants' keys
            h = keys[tenant]
            writes: list[tuple[str, dict[str, Any]]] = [
                ("/v1/memories", {"json": {"text": f"{tenant}: 한 번만 저장"}}),
                ("/v1/memories:batch", {"json": {"items": [{"text": f"{tenant}: 배치 {i}"} for i in range(3)]}}),
                ("/v1/import", {"content": _export(2)}),
                ("/v1/conversations/messages", {"json": _messages(tenant)}),
            ]
            for n, (route, body) in enumerate(writes):
                key = {"Idempotency-Key": f"key-{n}"}
                first = client.post(route, headers={**h, **key}, **body)
                before = client.get("/v1/stats", headers=h).json()["blocks"]
                again = client.post(route, headers={**h, **key}, **body)
                assert first.status_code in (201, 202, 200), first.text
                assert again.status_code == first.status_code and again.json() == first.json(), route
                assert again.headers.get("idempotent-replayed") == "true"
                assert client.get("/v1/stats", headers=h).json()["blocks"] == before, route
                if "json" in body:  # the same JSON spelled differently is the same request
                    spaced = json.dumps(body["json"], indent=2).encode()
                    assert client.post(route, content=spaced, headers={**h, **key, "content-type":
                                       "application/json"}).json() == first.json()
                other = client.post(route, headers={**h, **key}, **({"json": {"text": "딴 내용"}} if route ==
                                    "/v1/memories" else {"json": {"items": [{"text": "x"}]}}))
                assert other.status_code == 422 and other.json()["error"]["type"] in (
                    "idempotency_key_reused", "validation_error"), other.text
                assert client.get("/v1/stats", headers=h).json()["blocks"] == before
            reused = client.post("/v1/memories:batch", json={"items": [{"text": "x"}]},
                                 headers={**h, "Idempotency-Key": "key-0"})  # another route, a key of /v1/memories
            assert reused.status_code == 422 and reused.json()["error"]["type"] == "idempotency_key_reused"
            for bad in ("", "with space", "x" * 256):
                refused = client.post("/v1/memories", json={"text": "x"}, headers={**h, "Idempotency-Key": bad})
                assert refused.status_code == 400, (bad, refused.text)
            # a refused request leaves no key behind: the corrected retry runs
            assert client.post("/v1/memories", json={"text": " "}, headers={**h, "Idempotency-Key": "fix"}
                               ).status_code == 400
            assert client.post("/v1/memories", json={"text": " "}, headers={**h, "Idempotency-Key": "fix"}
                               ).status_code == 400
            texts = [b["text"] for b in client.get("/v1/memories", params={"limit": 200}, headers=h).json()["items"]]
            assert texts.count(f"{tenant}: 한 번만 저장") == 1
            assert sum(t.startswith(f"{tenant}: 배치") for t in texts) == 3
            assert not any(t.startswith("b:" if tenant == "a" else "a:") for t in texts)


def test_finding_11_a_retry_after_the_block_was_forgotten_does_not_answer_its_text(tmp_path: Path) -> None:
    """The kept answer of `POST /v1/memories` holds the block's text for a day; once the block is
    forgotten (`DELETE /v1/memories/…`), a retry with the same key is answered with the same status
    and a redacted body, stores nothing, and the text is in no table."""
    _, client, keys = _in_process(tmp_path)
    with client:
        h, key = keys["a"], {"Idempotency-Key": "forget-me"}
        first = client.post("/v1/memories", json={"text": "a: 사물함 비밀번호는 7788"}, headers={**h, **key})
        assert first.status_code == 201 and "7788" in first.text
        kept = client.post("/v1/memories:batch", json={"items": [{"text": "a: 점심 김밥"}]},
                           headers={**h, "Idempotency-Key": "keep-me"})
        assert client.delete(f"/v1/memories/{first.json()['block_index']}", headers=h).status_code == 200
        before = client.get("/v1/stats", headers=h).json()["blocks"]
        again = client.post("/v1/memories", json={"text": "a: 사물함 비밀번호는 7788"}, headers={**h, **key})
        assert again.status_code == 201 and "7788" not in again.text and again.json() == {
            "redacted": "the data this answer held was erased"}
        assert client.get("/v1/stats", headers=h).json()["blocks"] == before
        other = client.post("/v1/memories:batch", json={"items": [{"text": "a: 점심 김밥"}]},
                            headers={**h, "Idempotency-Key": "keep-me"})
        assert other.json() == kept.json(), "the answers of other blocks are kept"
    for path in tmp_path.rglob("*.db"):
        with sqlite3.connect(path) as db:
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                rows = db.execute(f'SELECT * FROM "{table}"').fetchall()
                assert not any("7788" in str(value) for row in rows for value in row), (path.name, table)


def _dead_holder() -> str:
    """A holder name of a process on this machine that has exited (as a worker killed with -9)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return f"{socket.gethostname()}:{gone.pid}:killed"


@pytest.mark.parametrize("route, body", [
    ("/v1/memories", {"text": "죽은 워커가 저장한 블록: 점심은 비빔밥"}),
    ("/v1/memories:batch", {"items": [{"text": f"죽은 워커의 배치 {i}"} for i in range(3)]}),
])
def test_finding_11_a_worker_killed_between_its_commit_and_its_answer_stores_nothing_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str, body: dict[str, Any]) -> None:
    """The key records the stored blocks inside their own transaction, so a retry after the worker
    died (blocks committed, no answer kept) is answered from those blocks instead of writing again."""
    from gieok.server import idempotency
    from gieok.store.idempotency import IdempotencyTable

    _, client, keys = _in_process(tmp_path)
    h, key = keys["a"], {"Idempotency-Key": "killed-after-commit"}
    with client:
        with monkeypatch.context() as dying:  # the first request runs in a process that dies after its commit
            dying.setattr(idempotency, "HOLDER", _dead_holder())
            dying.setattr(IdempotencyTable, "finish", lambda *args: None)
            first = client.post(route, json=body, headers={**h, **key})
        assert first.status_code == 201, first.text
        stored = client.get("/v1/stats", headers=h).json()["blocks"]
        retry = client.post(route, json=body, headers={**h, **key})
        assert retry.status_code == 201 and retry.headers.get("idempotent-replayed") == "true", retry.text
        assert retry.json() == first.json()
        assert client.get("/v1/stats", headers=h).json()["blocks"] == stored
        again = client.post(route, json=body, headers={**h, **key})  # the rebuilt answer is kept with the key
        assert again.json() == first.json() and again.headers.get("idempotent-replayed") == "true"
        # the other tenant's same key is its own: it writes
        other = client.post(route, json=body, headers={**keys["b"], **key})
        assert other.status_code == 201 and other.headers.get("idempotent-replayed") is None
        assert client.get("/v1/stats", headers=h).json()["blocks"] == stored


def test_finding_11_a_write_that_failed_after_its_commit_is_answered_from_its_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gieok.store.idempotency import IdempotencyTable

    _, client, keys = _in_process(tmp_path)
    h, key = keys["a"], {"Idempotency-Key": "failed-after-commit"}
    body = {"text": "커밋 뒤에 실패한 요청"}

    def broken(*args: Any) -> None:
        raise RuntimeError("the answer could not be kept")

    with client:
        with monkeypatch.context() as failing:
            failing.setattr(IdempotencyTable, "finish", broken)
            with pytest.raises(RuntimeError):
                client.post("/v1/memories", json=body, headers={**h, **key})
        assert client.get("/v1/stats", headers=h).json()["blocks"] == 1  # it had committed
        retry = client.post("/v1/memories", json=body, headers={**h, **key})
        assert retry.status_code == 201 and retry.headers.get("idempotent-replayed") == "true", retry.text
        assert retry.json()["block_index"] == 1 and retry.json()["text"] == body["text"]
        assert client.get("/v1/stats", headers=h).json()["blocks"] == 1


def test_finding_11_a_key_a_failed_request_could_not_give_back_does_not_hold_its_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database went away during a write: the write failed (503) and so did giving its key
    back. The retry, in the same process, once the database is back, runs at once — it does not
    wait for a request that is no longer running (found by `gieok bench chaos`: every writer hung
    after a PostgreSQL restart)."""
    from gieok.errors import StoreError
    from gieok.memory import Memory
    from gieok.store.idempotency import IdempotencyTable

    _, client, keys = _in_process(tmp_path)
    h, key = keys["a"], {"Idempotency-Key": "db-was-down"}

    def down(*args: Any, **kwargs: Any) -> None:
        raise StoreError("the database server is not answering")

    with client:
        for route, body in (("/v1/memories", {"text": "데이터베이스가 돌아온 뒤"}),
                            ("/v1/conversations/messages", _messages("a", 1))):
            with monkeypatch.context() as outage:
                outage.setattr(Memory, "add", down)
                outage.setattr(Memory, "remember_many", down)
                outage.setattr(IdempotencyTable, "abandon", down)
                failed = client.post(route, json=body, headers={**h, **key, "Idempotency-Key": route})
            assert failed.status_code == 503, failed.text
            started = time.monotonic()
            retry = client.post(route, json=body, headers={**h, **key, "Idempotency-Key": route})
            assert retry.status_code in (201, 202), retry.text
            assert time.monotonic() - started < 20  # not the 60 s wait for a running request
            assert retry.headers.get("idempotent-replayed") is None


def test_finding_11_a_killed_worker_not_yet_reaped_holds_no_key() -> None:
    """uvicorn's supervisor reaps a killed worker when it next looks (found by `gieok bench chaos`:
    once a minute later); until then its pid still answers kill(pid, 0). Its keys are free at once."""
    from gieok.server.idempotency import HOLDER, _gone

    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.05)
        assert _gone(f"{socket.gethostname()}:{child.pid}:someproc:somereq")  # exited, not reaped
    finally:
        child.wait()
    assert _gone(f"{socket.gethostname()}:{child.pid}:someproc:somereq")  # reaped
    assert not _gone(f"{socket.gethostname()}:1:someproc:somereq")  # init is alive
    assert not _gone(f"another-host:{child.pid}:someproc:somereq")  # another machine: unknown
    assert _gone(f"{HOLDER}:a-request-not-running")


def _post_and_cut(port: int, path: str, body: bytes, headers: dict[str, str]) -> None:
    """Send a whole request, then close the connection before any answer comes."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall("\r\n".join(lines).encode() + body)
        conn.shutdown(socket.SHUT_WR)


@pytest.mark.slow  # a real `gieok serve` process
def test_finding_11_a_retry_after_a_cut_connection_stores_the_batch_once(tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    key, _ = create_key_with_id(db)
    srv = Server(db)
    try:
        auth = {"Authorization": f"Bearer {key}"}
        items = {"items": [{"text": f"끊긴 연결 뒤의 재시도 {i}: 점심은 비빔밥"} for i in range(120)]}
        body = json.dumps(items, ensure_ascii=False).encode()
        _post_and_cut(srv.port, "/v1/memories:batch", body, {**auth, "Idempotency-Key": "retry-1"})
        time.sleep(0.2)  # the server is embedding the batch when the retry comes
        retry = httpx.post(f"{srv.url}/v1/memories:batch", content=body, timeout=300,
                           headers={**auth, "Idempotency-Key": "retry-1", "Content-Type": "application/json"})
        assert retry.status_code == 201, retry.text
        assert [b["block_index"] for b in retry.json()["blocks"]] == list(range(1, 121))
        assert httpx.get(f"{srv.url}/v1/stats", headers=auth, timeout=60).json()["blocks"] == 120
        # the Python client sends a key of its own on every write, and the same one on its retries
        from gieok.client import Client
        with Client(srv.url, api_key=key) as memory:
            memory.add("클라이언트로 한 번", scope={"channel": "c"})
        assert httpx.get(f"{srv.url}/v1/stats", headers=auth, timeout=60).json()["blocks"] == 121
    finally:
        srv.stop()


# -- 3. event ids survive a restart; a `since` ahead of the stream is refused ------------------------


@pytest.mark.slow  # a real `gieok serve` process
def test_finding_3_resume_across_a_restart_loses_no_event_and_repeats_none(tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    key, _ = create_key_with_id(db)
    other, _ = create_key_with_id(db, tenant="other")
    auth = {"Authorization": f"Bearer {key}"}
    srv = Server(db)
    port = srv.port
    try:
        with httpx.Client(base_url=srv.url, headers=auth, timeout=60) as client, \
                client.stream("GET", "/v1/events") as stream:
            for i in range(3):
                client.post("/v1/memories", json={"text": f"재시작 전 {i}"})
            before = sse_events(stream, 3)
        assert [e["id"] for e in before] == ["1", "2", "3"]
        seen = int(before[-1]["id"])
    finally:
        assert srv.stop() in (0, -signal.SIGTERM)
    srv = Server(db, port=port)  # the same server, restarted
    try:
        with httpx.Client(base_url=srv.url, headers=auth, timeout=60) as client:
            for i in range(2):
                client.post("/v1/memories", json={"text": f"재시작 후 {i}"})
            started = time.monotonic()
            with client.stream("GET", "/v1/events", headers={"Last-Event-ID": str(seen)}) as stream:
                after = sse_events(stream, 2)
            resume_seconds = time.monotonic() - started
            assert [int(e["id"]) for e in after] == [seen + 1, seen + 2]  # none lost, none repeated
            assert [json.loads(e["data"])["data"]["blocks"][0]["text"] for e in after] == ["재시작 후 0", "재시작 후 1"]
            # a client that had seen less is told what it missed (the old process's buffer is gone)
            with client.stream("GET", "/v1/events?since=1") as stream:
                gap, first = sse_events(stream, 2)
            assert gap["event"] == "stream.gap" and json.loads(gap["data"])["data"]["missed"] == 2
            assert int(first["id"]) == seen + 1
            # a since the stream never reached: a clear 409, not a silent wait
            ahead = client.get("/v1/events?since=999")
            assert ahead.status_code == 409 and ahead.json()["error"]["type"] == "since_ahead"
            assert ahead.json()["error"]["latest"] == seen + 2
            assert client.get("/v1/events", headers={"Last-Event-ID": "999"}).status_code == 409
        url = f"ws://127.0.0.1:{srv.port}/v1/events/ws?since=999"
        with ws_connect(url, additional_headers=auth, open_timeout=10) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4409
        with ws_connect(f"ws://127.0.0.1:{srv.port}/v1/events/ws?since={seen}", additional_headers=auth,
                        open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["seq"] == seen + 1
        # the other tenant's stream has its own ids, unaffected
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {other}"}, timeout=60) as client:
            with client.stream("GET", "/v1/events") as stream:
                client.post("/v1/memories", json={"text": "다른 테넌트"})
                [mine] = sse_events(stream, 1)
            assert mine["id"] == "1"
        print(f"resume after restart: {resume_seconds * 1000:.0f} ms for 2 events")
    finally:
        srv.stop()


def test_finding_3_shared_event_ids_go_on_when_redis_loses_them(tmp_path: Path, redis_url: str,
                                                                   redis_namespace: str) -> None:
    """With Redis (several workers): its counter is the ids' source, and the home store keeps a floor
    above every id handed out, so a Redis that restarts empty does not start again at 1."""
    from gieok.coordination import RedisConnection, SharedEventLog
    from gieok.server.events import EventBus, SinceAheadError
    from gieok.store.factory import open_store

    store = open_store(str(tmp_path / "home.db"))
    connection = RedisConnection(redis_url, redis_namespace)
    try:
        bus = EventBus(100, sequences=store.event_sequences,
                       shared=SharedEventLog(connection, 100, sequences=store.event_sequences))
        ids = [bus.publish("acme", "memory.added", {"i": i}).seq for i in range(5)]
        assert ids == [1, 2, 3, 4, 5]
        with pytest.raises(SinceAheadError):
            bus.check_since("acme", 6)
        connection.client.delete(*connection.client.keys(f"{redis_namespace}:*"))  # Redis restarted empty
        restarted = EventBus(100, sequences=store.event_sequences,
                             shared=SharedEventLog(connection, 100, sequences=store.event_sequences))
        bus.check_since("acme", 5)  # a client's last id is still a valid place to resume from
        later = [restarted.publish("acme", "memory.added", {"i": i}).seq for i in range(2)]
        assert min(later) > max(ids) and later[1] == later[0] + 1
    finally:
        connection.close()
        store.close()


# -- 2. a revoked key's open streams are closed -----------------------------------------------------

@pytest.mark.slow  # a real `gieok serve` process
def test_finding_2_revoking_a_key_closes_its_open_streams_within_5_s(tmp_path: Path) -> None:
    import threading

    db = tmp_path / "home.db"
    reader, reader_id = create_key_with_id(db, role="read")
    writer, _ = create_key_with_id(db, role="write")
    other, _ = create_key_with_id(db, tenant="other", role="read")
    srv = Server(db)
    try:
        closed_at: dict[str, float] = {}
        seen: dict[str, list[str]] = {"sse": [], "ws": [], "other": []}

        def watch_sse(name: str, key: str) -> None:
            with contextlib.suppress(httpx.HTTPError), httpx.stream(
                    "GET", f"{srv.url}/v1/events", headers={"Authorization": f"Bearer {key}"},
                    timeout=httpx.Timeout(60, read=30)) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        seen[name].append(line[7:])
                        if line == "event: stream.closed":
                            closed_at[name] = time.time()
            closed_at.setdefault(f"{name}-end", time.time())

        def watch_ws() -> None:
            url = f"ws://127.0.0.1:{srv.port}/v1/events/ws"
            with ws_connect(url, additional_headers={"Authorization": f"Bearer {reader}"}, open_timeout=10) as ws:
                try:
                    while True:
                        seen["ws"].append(json.loads(ws.recv(timeout=30))["type"])
                except ConnectionClosed as exc:
                    closed_at["ws"] = time.time()
                    closed_at["ws-code"] = exc.rcvd.code if exc.rcvd else -1

        threads = [threading.Thread(target=watch_sse, args=("sse", reader), daemon=True),
                   threading.Thread(target=watch_ws, daemon=True),
                   threading.Thread(target=watch_sse, args=("other", other), daemon=True)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        write = {"Authorization": f"Bearer {writer}"}
        added = httpx.post(f"{srv.url}/v1/memories", json={"text": "취소 전"}, headers=write, timeout=60)
        assert added.status_code == 201
        deadline = time.monotonic() + 30
        while (not seen["sse"] or not seen["ws"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen["sse"] == ["memory.added"] and seen["ws"] == ["memory.added"]
        revoked = subprocess.run([*GIEOK, "keys", "revoke", str(reader_id), "--db", str(db)], capture_output=True,
                                 text=True, timeout=120, env=clean_env(), cwd=db.parent)
        assert revoked.returncode == 0, revoked.stderr
        for _ in range(10):  # new blocks keep coming: none reaches the revoked key's streams
            httpx.post(f"{srv.url}/v1/memories", json={"text": "취소 후의 비밀"}, headers=write, timeout=60)
        for thread in threads[:2]:
            thread.join(timeout=10)
        assert "sse" in closed_at and "ws" in closed_at, (closed_at, seen)
        listed = subprocess.run([*GIEOK, "keys", "list", "--db", str(db), "--json"], capture_output=True, text=True,
                                timeout=120, env=clean_env(), cwd=db.parent, check=True)
        at = next(k["revoked_at"] for k in json.loads(listed.stdout) if k["id"] == reader_id)  # when it was revoked
        sse_s, ws_s = closed_at["sse"] - at, closed_at["ws"] - at
        assert sse_s < 5 and ws_s < 5, (sse_s, ws_s)
        assert closed_at["ws-code"] == 4401
        assert seen["sse"][-1] == "stream.closed"
        print(f"revocation closed the SSE stream in {sse_s:.2f} s, the WebSocket in {ws_s:.2f} s")
        assert threads[2].is_alive() and "stream.closed" not in seen["other"]  # another key's stream stays
    finally:
        srv.stop()


# -- 5. dashboard sessions: opaque ids, expiry, logout, revocation; login throttling -----------------

def _jar(session: str) -> dict[str, str]:
    return {"Cookie": f"gieok_session={session}"}


def _login(client: Any, key: str, **headers: str) -> Any:
    return client.post("/login", data={"key": key, "next": "/"}, follow_redirects=False,
                       headers={"Origin": str(client.base_url).rstrip("/"), **headers})


def test_finding_5_the_session_cookie_is_an_opaque_id_that_ends(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings

    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db"), server_session_idle_seconds=600,
                                                server_session_max_seconds=3600))
    keys = {name: state.keys.create(tenant, "write", name) for name, tenant in (("a", "a"), ("b", "b"))}
    now = [time.time()]
    assert state.access.sessions is not None
    state.access.sessions.clock = lambda: now[0]
    with TestClient(create_app(state)) as client:
        for name, (key, row) in keys.items():
            client.cookies.clear()
            signed_in = _login(client, key)
            assert signed_in.status_code == 303
            cookie = signed_in.cookies["gieok_session"]
            assert key not in cookie and row.prefix not in cookie and len(cookie) >= 40  # not the key
            assert "max-age=3600" in signed_in.headers["set-cookie"].lower()
            stats = client.get("/v1/stats", headers=_jar(cookie))
            assert stats.status_code == 200
            added = client.post("/v1/memories", json={"text": f"{name}의 블록"},
                                headers={**_jar(cookie), "Origin": "http://testserver"})
            assert added.status_code == 201
            # the other tenant's data is not reachable with it
            listed = client.get("/v1/memories", headers=_jar(cookie)).json()["items"]
            assert [b["text"] for b in listed] == [f"{name}의 블록"]
        # the key itself is no longer a session
        client.cookies.clear()
        assert client.get("/v1/stats", headers=_jar(keys["a"][0])).status_code == 401
        # logout ends the session on the server: the old cookie is refused afterwards
        cookie = _login(client, keys["a"][0]).cookies["gieok_session"]
        client.cookies.clear()
        assert client.post("/logout", follow_redirects=False,
                           headers={**_jar(cookie), "Origin": "http://testserver"}).status_code == 303
        assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 401
        # idle expiry: 600 s without a request
        cookie = _login(client, keys["a"][0]).cookies["gieok_session"]
        client.cookies.clear()
        now[0] += 500
        assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 200  # used: idle restarts
        now[0] += 500
        assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 200
        now[0] += 601
        assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 401
        # absolute expiry: 3600 s after login, however busy
        cookie = _login(client, keys["a"][0]).cookies["gieok_session"]
        client.cookies.clear()
        for _ in range(7):
            now[0] += 500
            assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 200
        now[0] += 200
        assert client.get("/v1/stats", headers=_jar(cookie)).status_code == 401
        assert client.get("/", headers=_jar(cookie), follow_redirects=False).status_code == 303
        # revoking the key ends its sessions (and only its own)
        cookie_a = _login(client, keys["a"][0]).cookies["gieok_session"]
        cookie_b = _login(client, keys["b"][0]).cookies["gieok_session"]
        client.cookies.clear()
        assert state.keys.revoke(keys["a"][1].key_id)
        assert client.get("/v1/stats", headers=_jar(cookie_a)).status_code == 401
        assert client.get("/v1/stats", headers=_jar(cookie_b)).status_code == 200


def test_finding_5_logins_are_throttled_per_client_and_per_key_prefix(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings

    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db"), server_login_attempts=3,
                                                server_login_window_seconds=60))
    good, row = state.keys.create("a", "read", "good")
    other_good, _ = state.keys.create("b", "read", "other")
    app = create_app(state)
    with TestClient(app, client=("10.0.0.1", 5000)) as one, TestClient(app, client=("10.0.0.2", 5000)) as two, \
            TestClient(app, client=("10.0.0.3", 5000)) as three:
        for i in range(3):  # wrong keys from one client
            assert _login(one, f"gk_0000000{i}_" + "x" * 43).status_code == 401
        throttled = _login(one, good)  # even the right key waits: the key is not checked
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
        assert "Too many failed logins" in throttled.text and "gieok_session" not in throttled.headers.get(
            "set-cookie", "")
        assert _login(two, good).status_code == 303  # another client is not held up
        # guesses at one key's secret from many clients: that prefix waits, other keys do not
        wrong = f"gk_{row.prefix}_" + "y" * 43
        assert _login(two, wrong).status_code == 401
        assert _login(three, wrong).status_code == 401
        assert _login(three, wrong).status_code == 401
        assert _login(three, good).status_code == 429
        assert _login(two, other_good).status_code == 303
    assert state.login_throttle.retry_after("10.0.0.9", good) > 0
    state.login_throttle.clock = lambda: time.monotonic() + 61  # the window passed
    assert state.login_throttle.retry_after("10.0.0.1", good) == 0


# -- 4. /docs from this server's own files, under the pages' CSP; a bearer scheme in the OpenAPI --------

def test_finding_4_docs_come_from_this_server_under_the_csp_and_the_schema_names_the_bearer_key(
        tmp_path: Path) -> None:
    import re

    from starlette.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings
    from gieok.server.web.security import SECURITY_HEADERS

    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db")))
    key, _ = state.keys.create("a", "read", "docs")
    with TestClient(create_app(state)) as client:
        page = client.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
        assert "script-src 'self';" in page.headers["content-security-policy"]
        assert "cdn" not in page.text.lower() and "<script>" not in page.text  # no CDN, no inline script
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert {a for a in assets if a.endswith((".js", ".css"))} == {
            "/static/vendor/swagger-ui-dist-5.35.0/swagger-ui.css",
            "/static/vendor/swagger-ui-dist-5.35.0/swagger-ui-bundle.js", "/static/docs.js"}
        for asset in assets:
            assert asset.startswith("/"), asset  # this origin only
            fetched = client.get(asset)
            assert fetched.status_code == 200 and len(fetched.content) > 0, asset
        assert "SwaggerUIBundle" in client.get("/static/vendor/swagger-ui-dist-5.35.0/swagger-ui-bundle.js").text
        assert '"/openapi.json"' in client.get("/static/docs.js").text
        schema = client.get("/openapi.json").json()
        assert schema["components"]["securitySchemes"] == {"apiKey": {
            "type": "http", "scheme": "bearer", "bearerFormat": "gk_<prefix>_<secret>",
            "description": "An API key from `gieok keys create`: it decides the tenant and the role"}}
        assert schema["security"] == [{"apiKey": []}]
        assert schema["paths"]["/healthz"]["get"]["security"] == []  # the health checks need no key
        assert "security" not in schema["paths"]["/v1/memories"]["get"]  # the document-wide one: a key
        assert "/docs" not in schema["paths"] and "/login" not in schema["paths"]
        # what the scheme says is what the server does: the key as a bearer token, nothing else
        assert client.get("/v1/stats").status_code == 401
        assert client.get("/v1/stats", headers={"Authorization": f"Bearer {key}"}).status_code == 200


# -- behind a TLS proxy: --proxy-headers ---------------------------------------------------------------

@pytest.mark.slow  # a real `gieok serve` process
def test_behind_a_tls_proxy_the_session_cookie_is_secure_and_throttling_counts_the_real_client(
        tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    key, _ = create_key_with_id(db, tenant="a", role="read")
    srv = Server(db, "--proxy-headers")
    plain = Server(tmp_path / "plain.db")  # no --proxy-headers: the forwarded scheme is not believed
    try:
        https = f"https://127.0.0.1:{srv.port}"
        proxied = {"X-Forwarded-Proto": "https", "Origin": https}

        def login(server: Server, with_key: str, client: str, **headers: str) -> httpx.Response:
            return httpx.post(f"{server.url}/login", data={"key": with_key, "next": "/"}, follow_redirects=False,
                              headers={"X-Forwarded-For": client, **headers}, timeout=30)

        signed_in = login(srv, key, "203.0.113.1", **proxied)
        assert signed_in.status_code == 303, signed_in.text
        cookie = signed_in.headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        assert key.lower() not in cookie  # the session id, never the key
        # the Origin check compares with the https origin the browser shows
        assert login(srv, key, "203.0.113.1", **{**proxied, "Origin": srv.url}).status_code == 403
        # failed logins are counted per real client (X-Forwarded-For), not for the proxy's address
        for i in range(5):
            assert login(srv, f"gk_1234567{i}_" + "z" * 43, "203.0.113.7", **proxied).status_code == 401
        throttled = login(srv, key, "203.0.113.7", **proxied)
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
        assert login(srv, key, "203.0.113.8", **proxied).status_code == 303  # another client behind the proxy
        # without --proxy-headers a forwarded https is not believed: no Secure cookie
        plain_key, _ = create_key_with_id(plain.db, tenant="a", role="read")
        unproxied = login(plain, plain_key, "203.0.113.1", Origin=plain.url, **{"X-Forwarded-Proto": "https"})
        assert unproxied.status_code == 303 and "secure" not in unproxied.headers["set-cookie"].lower()
    finally:
        srv.stop()
        plain.stop()

"""`gieok mcp --server URL` (client/mcp_relay.py): MCP over stdio answered by a running `gieok serve`.

Spawned as MCP clients spawn it and driven by the official MCP client over stdio: every tool works
through it, the caller is whoever the key says (tenant beta's key through every tool, each argument
aimed at tenant alpha's data, finds nothing of alpha's — the same matrix as over HTTP), a refused
start is one line and exit 1, raw lines in give only JSON-RPC lines out, and a key revoked or a
server gone while the relay runs turns the next calls into JSON-RPC errors, not a hang; a server
back on its port answers the same relay again."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from gieok.client.mcp_relay import McpRelay
from live_server import LiveServer, free_port
from test_mcp import (
    ALPHA_CHANNEL,
    ALPHA_GUILD,
    CALL_SECONDS,
    MARKER,
    TOOLS,
    _keyed_home,
    _seed_alpha,
    _subprocess_env,
    beta_tries_alpha,
    gieok_serve,
    ok,
    run,
)

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "0"}}}


def _relay(base: str, key: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "gieok.cli", "mcp", "--server", base, *more]


def _params(base: str, key: str, tmp_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=_relay(base, key)[1:],
                                 env=_subprocess_env(GIEOK_API_KEY=key), cwd=str(tmp_path))


def _lines(base: str, key: str, messages: list[Any], tmp_path: Path) -> tuple[list[dict[str, Any]], str, int]:
    """Raw lines through a relay process: every stdout line parsed (each must be JSON), stderr, exit code."""
    sent = "".join((m if isinstance(m, str) else json.dumps(m, ensure_ascii=False)) + "\n" for m in messages)
    done = subprocess.run(_relay(base, key), input=sent, capture_output=True, text=True, timeout=300,
                          env=_subprocess_env(GIEOK_API_KEY=key), cwd=tmp_path)
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr, done.returncode


@pytest.mark.slow
def test_the_relay_serves_every_tool_as_the_keys_tenant_and_says_why_it_cannot(tmp_path: Path) -> None:
    home, made = _keyed_home(tmp_path, ("alpha", "write"), ("beta", "admin"), ("alpha", "read"))
    (alpha_key, _), (beta_key, _), (alpha_reader, alpha_reader_id) = made
    _seed_alpha(home)
    alpha_where = {"channel": ALPHA_CHANNEL, "guild": ALPHA_GUILD}

    with gieok_serve(home, tmp_path / "serve.log") as base:
        # a start that cannot serve: one line on stderr, exit 1, nothing on stdout
        nowhere = f"http://127.0.0.1:{free_port()}"
        for command, key, said in (
                (_relay(base, "gk_00000000_" + "x" * 43), "gk_00000000_" + "x" * 43, "refused the key"),
                (_relay(nowhere, alpha_key), alpha_key, "no gieok serve answers at"),
                (_relay(base, alpha_key, "--db", str(home)), alpha_key, "--db and --server"),
                (_relay("ftp://example.org", alpha_key), alpha_key, "http(s) URL"),
                (_relay(base, ""), "", "needs an API key")):
            done = subprocess.run(command, input="", capture_output=True, text=True, timeout=120,
                                  env=_subprocess_env(GIEOK_API_KEY=key), cwd=tmp_path)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert done.returncode == 1 and len(lines) == 1 and said in lines[0], done.stderr
            assert done.stdout == "" and "Traceback" not in done.stderr

        async def scenario() -> int:
            async with Client(_params(base, alpha_key, tmp_path), read_timeout_seconds=CALL_SECONDS) as alpha:
                assert {tool.name for tool in (await alpha.list_tools()).tools} == TOOLS
                marker = await ok(alpha, "remember", {"text": f"{MARKER} 민지는 고양이 나비를 키워",
                                                      **alpha_where, "speaker": "민지"})
                await ok(alpha, "add_messages", {**alpha_where, "messages": [
                    {"id": "relay-1", "role": "user", "user": "4242", "name": "민지",
                     "text": f"{MARKER} 나비가 오늘 처음으로 간식을 먹었어"}]})
                found = await ok(alpha, "search_memory", {"query": "민지 고양이 나비"})
                assert MARKER in found["hits"][0]["text"]
                context = await ok(alpha, "get_context", {**alpha_where, "user": "4242", "query": "나비 간식"})
                assert "간식" in context["text"]
            async with Client(_params(base, beta_key, tmp_path), read_timeout_seconds=CALL_SECONDS) as beta:
                await beta_tries_alpha(beta, marker["block_index"], own_blocks=0)
            return int(marker["block_index"])

        index = run(scenario)

        # raw lines: only JSON-RPC comes out; a notification gets nothing, a broken line the server's parse error
        answers, stderr, code = _lines(base, alpha_key, [
            INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"}, "{not json",
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "get_memory", "arguments": {"block_index": index}}}], tmp_path)
        assert code == 0, stderr
        by_id = {answer.get("id"): answer for answer in answers}
        assert len(answers) == 3 and by_id[1]["result"]["serverInfo"]["name"]
        assert by_id[None]["error"]["code"] == -32700
        assert MARKER in json.dumps(by_id[2]["result"], ensure_ascii=False)

        # a key revoked while its relay runs: the next call is refused with why, the relay goes on
        relay = subprocess.Popen(_relay(base, alpha_reader), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_subprocess_env(GIEOK_API_KEY=alpha_reader),
                                 cwd=tmp_path)
        try:
            assert relay.stdin is not None and relay.stdout is not None

            def ask(message: dict[str, Any]) -> dict[str, Any]:
                assert relay.stdin is not None and relay.stdout is not None
                relay.stdin.write(json.dumps(message) + "\n")
                relay.stdin.flush()
                return dict(json.loads(relay.stdout.readline()))

            assert ask({"jsonrpc": "2.0", "id": 1, "method": "ping"}) == {"jsonrpc": "2.0", "id": 1, "result": {}}
            revoked = subprocess.run([sys.executable, "-m", "gieok.cli", "keys", "revoke", str(alpha_reader_id),
                                      "--db", str(home)], capture_output=True, text=True, env=_subprocess_env(),
                                     timeout=120)
            assert revoked.returncode == 0, revoked.stderr
            refused = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            assert refused["id"] == 2 and "refused" in refused["error"]["message"]
            assert "revoked" in refused["error"]["message"]
        finally:
            _close(relay)
        assert relay.returncode == 0
        gone = subprocess.Popen(_relay(base, alpha_key), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=_subprocess_env(GIEOK_API_KEY=alpha_key),
                                cwd=tmp_path)
        assert gone.stdin is not None and gone.stdout is not None
        gone.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + "\n")
        gone.stdin.flush()
        assert json.loads(gone.stdout.readline())["result"] == {}  # past its start check, relaying

    # the server stopped while that relay runs: each call gets an error saying so, and no hang; once a
    # server is back on the port, the same relay's next call is answered
    try:
        gone.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}) + "\n")
        gone.stdin.flush()
        answer = json.loads(gone.stdout.readline())
        assert answer["id"] == 2 and "did not answer" in answer["error"]["message"], answer
        back = LiveServer(home, port=int(base.rsplit(":", 1)[1]))
        try:
            gone.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "name": "search_memory", "arguments": {"query": "민지 고양이 나비"}}}) + "\n")
            gone.stdin.flush()
            answer = json.loads(gone.stdout.readline())
            assert answer["id"] == 3 and MARKER in json.dumps(answer["result"], ensure_ascii=False), answer
        finally:
            back.stop()
    finally:
        _close(gone)
    assert gone.returncode == 0


@pytest.mark.slow
def test_without_a_key_the_relay_reaches_a_no_auth_server_as_its_default_tenant(tmp_path: Path) -> None:
    """`gieok serve --no-auth` (loopback) takes no key: neither does the relay to it."""
    server = LiveServer(tmp_path / "open.db", "--no-auth")
    try:
        answers, stderr, code = _lines(server.url, "", [
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
             "params": {"name": "remember", "arguments": {"text": "Dave meets the study group at 7pm"}}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}], tmp_path)
    finally:
        server.stop()
    assert code == 0, stderr
    by_id = {answer["id"]: answer for answer in answers}
    assert by_id[1]["result"]["structuredContent"]["block_index"] == 1, by_id[1]
    assert {tool["name"] for tool in by_id[2]["result"]["tools"]} == TOOLS


def _close(relay: subprocess.Popen[str]) -> None:
    """stdin closed (the client is done): the relay writes what is under way and exits."""
    if relay.stdin is not None:
        relay.stdin.close()
    try:
        relay.wait(timeout=60)
    finally:
        if relay.poll() is None:
            relay.kill()


def _http(status: str, body: str, content_type: str = "application/json", length: int | None = None) -> bytes:
    data = body.encode("utf-8")
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data) if length is None else length}\r\n\r\n").encode() + data


def test_every_request_is_answered_whatever_the_server_does() -> None:
    """In process against a loopback HTTP server that answers the start's ping, then a truncated
    body, a page that is not JSON, a 401 of gieok's shape, a notification's 202 and a Korean
    answer: each request gets an answer for its id (a client waits for every id it sent), the
    notification nothing, and every line out is ASCII JSON that reads back the same."""
    korean = json.dumps({"jsonrpc": "2.0", "id": 6, "result": {"text": "고양이 이름은 보리야"}}, ensure_ascii=False)
    answers = [
        _http("200 OK", '{"jsonrpc":"2.0","id":"gieok-relay-check","result":{}}'),
        _http("200 OK", '{"jsonrpc"', length=500),  # the connection closes 490 bytes short
        _http("502 Bad Gateway", "<h1>bad gateway</h1>", "text/html"),
        _http("401 Unauthorized", '{"error":"invalid_token","error_description":"this key was revoked"}'),
        _http("202 Accepted", ""),
        _http("200 OK", korean),
    ]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        for answer in answers:  # a connection per request: each answer then closes it
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(answer)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    out = io.StringIO()
    relay = McpRelay(f"http://127.0.0.1:{listener.getsockname()[1]}", "gk_test", stdout=out, request_seconds=10)
    relay.check()
    for ident in (2, 3, 4):
        relay.relay(json.dumps({"jsonrpc": "2.0", "id": ident, "method": "tools/list"}).encode())
    relay.relay(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    relay.relay(b'{"jsonrpc":"2.0","id":6,"method":"tools/call"}')
    server.join(10)
    listener.close()
    lines = out.getvalue().splitlines()
    assert all(line.isascii() for line in lines), lines
    written = [json.loads(line) for line in lines]
    assert [w["id"] for w in written] == [2, 3, 4, 6], written
    assert "did not answer" in written[0]["error"]["message"]  # the truncated body
    assert "answered 502 without JSON-RPC" in written[1]["error"]["message"]
    assert "refused the message: this key was revoked" in written[2]["error"]["message"]
    assert written[3]["result"]["text"] == "고양이 이름은 보리야"

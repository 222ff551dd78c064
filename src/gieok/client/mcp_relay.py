"""`gieok mcp --server`: MCP over stdio, answered by a running `gieok serve` (its `/mcp`).

A client that spawns `gieok mcp` (an IDE assistant, a desktop app) waits for the whole start-up
before its first answer: the interpreter, the MCP SDK, kiwi, the models — 2–3 s of one core.
When a `gieok serve` already holds the memory warm, this process only relays: each JSON-RPC
message read from stdin is POSTed to the server's `/mcp` with the key as a bearer token, and the
answer is written to stdout, one line per message. The server's `/mcp` is stateless with JSON
answers (server/mcp_http.py), so every message stands alone and nothing is kept here but the
protocol version `initialize` agreed on (sent back as the `MCP-Protocol-Version` header).

Who the caller is comes from the key, on the server, for every message — as over HTTP (a relay
without a key reaches only a `gieok serve --no-auth`, whose every caller is its default tenant).
Only the standard library is imported here: the relay answers within a few hundred milliseconds
of its spawn. The server and the key are checked before anything is read (a `ping`): a server that does
not answer or a key it refuses is one line on stderr and exit 1. Later failures (the server
restarting, the key revoked) become JSON-RPC errors of the message that met them; the relay goes
on. Messages are relayed side by side (`RELAY_THREADS`), so a long tool call does not hold up a
`ping`; answers are matched to requests by their ids, as JSON-RPC allows.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any
from urllib.parse import urlsplit

__all__ = ["McpRelay", "RelayError", "RELAY_THREADS", "REQUEST_SECONDS"]

MCP_PATH = "/mcp"  # server/mcp_http.py's (the client package imports nothing of the server's)
RELAY_THREADS = 4
REQUEST_SECONDS = 300.0  # an add_messages of a long batch on a busy server; ping and lists answer at once
CHECK_SECONDS = 10.0
SERVER_ERROR = -32000  # JSON-RPC's range for implementation-defined server errors


class RelayError(Exception):
    """The server cannot be reached, or refused the key: said before anything is relayed."""


class McpRelay:
    """Relays newline-delimited JSON-RPC between `stdin`/`stdout` and `url`'s `/mcp`."""

    def __init__(self, url: str, key: str | None, *, stdout: IO[str] | None = None,
                 request_seconds: float = REQUEST_SECONDS) -> None:
        parts = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RelayError(f"--server must be an http(s) URL such as http://127.0.0.1:8420, got {url!r}")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self._connection_type: Callable[..., http.client.HTTPConnection] = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection)
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + MCP_PATH
        self._key = (key or "").strip() or None  # none: only a `gieok serve --no-auth` (loopback) takes it
        self._seconds = request_seconds
        self._out = stdout or sys.stdout
        self._write_lock = threading.Lock()
        self._local = threading.local()  # one kept-alive connection per relaying thread
        self.protocol_version: str | None = None

    # -- the check before serving ----------------------------------------------------------------

    def check(self) -> None:
        """A `ping` through the key: RelayError saying why if the server or the key is not usable."""
        try:
            status, body = self._post(b'{"jsonrpc":"2.0","id":"gieok-relay-check","method":"ping"}', CHECK_SECONDS)
        except (OSError, http.client.HTTPException) as exc:
            raise RelayError(f"no gieok serve answers at {self.url} ({_reason(exc)}): start one "
                             f"(gieok serve --db … --port …) or run gieok mcp without --server") from None
        if status in (401, 403) and self._key is None:
            raise RelayError(f"the server at {self.url} needs an API key: pass --key or set GIEOK_API_KEY "
                             "(gieok keys create)")
        if status in (401, 403):
            raise RelayError(f"the server at {self.url} refused the key: {_said(body) or status}")
        if status != 200:
            raise RelayError(f"{self.url}{self._path} answered {status} to a ping, not 200: is it a gieok serve? "
                             f"{_said(body)}".rstrip())

    # -- relaying --------------------------------------------------------------------------------

    def run(self, stdin: IO[bytes] | None = None) -> None:
        """Relay every line of `stdin` (bytes: UTF-8 JSON whatever the locale) until it closes; the
        answers under way are written first."""
        source = stdin or sys.stdin.buffer
        with ThreadPoolExecutor(RELAY_THREADS, thread_name_prefix="gieok-mcp-relay") as pool:
            for line in source:
                if line.strip():
                    pool.submit(self.relay, line.strip())

    def relay(self, line: bytes) -> None:
        """One message from the client: its answer (if it has one) written to stdout. Every request
        gets an answer, whatever fails: a client waits for each id it sent."""
        try:
            message: Any = json.loads(line)
        except ValueError:
            message = None  # the server says what is wrong with it (a JSON-RPC parse error)
        ident = message.get("id") if isinstance(message, dict) else None
        try:
            self._relay(message, ident, line)
        except Exception as exc:  # a bug here must not leave the client waiting for ever
            self._answer_error(ident, f"gieok mcp could not relay the message: {type(exc).__name__}: {exc}")

    def _relay(self, message: Any, ident: Any, line: bytes) -> None:
        try:
            status, body = self._post(line, self._seconds)
        except (OSError, http.client.HTTPException) as exc:
            self._answer_error(ident, f"the gieok serve at {self.url} did not answer ({_reason(exc)})")
            return
        if status == 202 or not body.strip():
            return  # a notification or a response: nothing comes back
        try:
            answer = json.loads(body)
        except ValueError:
            self._answer_error(ident, f"the gieok serve at {self.url} answered {status} without JSON-RPC")
            return
        if not (isinstance(answer, dict) and answer.get("jsonrpc") == "2.0"):
            said = _said(body) or f"status {status}"
            self._answer_error(ident, f"the gieok serve at {self.url} refused the message: {said}")
            return
        if (isinstance(message, dict) and message.get("method") == "initialize"
                and isinstance(answer.get("result"), dict)):
            version = answer["result"].get("protocolVersion")
            self.protocol_version = version if isinstance(version, str) else None
        self._write(answer)

    def _answer_error(self, ident: Any, reason: str) -> None:
        if ident is None:
            print(f"gieok mcp: {reason}", file=sys.stderr, flush=True)  # a notification: no one to answer
            return
        self._write({"jsonrpc": "2.0", "id": ident, "error": {"code": SERVER_ERROR, "message": reason}})

    def _write(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":"))  # ASCII: safe on any stdout encoding
        with self._write_lock:
            self._out.write(line + "\n")
            self._out.flush()

    def _post(self, body: bytes, seconds: float) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        if self.protocol_version:
            headers["MCP-Protocol-Version"] = self.protocol_version
        while True:
            connection = self._connection(seconds)
            reused = connection.sock is not None
            try:
                connection.request("POST", self._path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                if response.getheader("Content-Type", "").startswith("text/event-stream"):
                    data = _first_event(data)
                return response.status, data
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._local.connection = None
                # A kept-alive connection the server closed while idle (uvicorn closes them after
                # 5 s) fails before the request reached it: sent once more on a new one. A failure
                # on a new connection may have come after the server read the request: said.
                if not (reused and isinstance(exc, (ConnectionResetError, BrokenPipeError))):
                    raise

    def _connection(self, seconds: float) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None and connection.sock is not None and _closed_by_peer(connection.sock):
            connection.close()  # the server closed it while idle: a new one, rather than a failed send
            connection = None
        if connection is None:
            connection = self._local.connection = self._connection_type(self._host, self._port, timeout=seconds)
        connection.timeout = seconds
        if connection.sock is not None:
            connection.sock.settimeout(seconds)
        return connection


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle kept-alive socket has been closed (or reset) by the server: readable with
    nothing to read. An open idle one is not readable at all."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and not sock.recv(1, socket.MSG_PEEK)
    except (OSError, ValueError):
        return True


def _first_event(stream: bytes) -> bytes:
    """The data of the first message event of a text/event-stream body (a server that streams)."""
    data = [line[5:].strip() for line in stream.splitlines() if line.startswith(b"data:")]
    return data[0] if data else b""


def _said(body: bytes) -> str:
    """What an error answer says: gieok's `error_description` / `error.message`, else its text."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]
    if isinstance(answer, dict):
        if isinstance(answer.get("error_description"), str):
            return str(answer["error_description"])
        error = answer.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return json.dumps(answer, ensure_ascii=False)[:300]


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__

"""Loopback HTTP servers that speak the LLM providers' wire formats, for the llm tests.

Like the embedding tests' server (tests/test_remote_embedders.py), the client code runs for
real (httpx, the google-genai SDK, SSE parsing, error mapping); only the far end is scripted.
A test queues `Reply`s; each request takes the next one (or asks a function) and is recorded.

Streams are sent as HTTP/1.1 chunked bodies of server-sent events, so a reply can be cut
midway the way a dropped connection looks on the wire: some events, then the socket closes
without the terminating chunk. It can also stall, the way a provider that is up but not
answering looks: `Reply(hang=True)` reads the request and never answers; `stall_after=n` sends
the headers and `n` events (a plain reply: the headers), then nothing more; `pace` spaces a
stream's events out. A stalled handler wakes when the server closes.
`blackhole()` is an address whose connects never complete (a full accept queue), for connect
timeouts without depending on the network.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON body of a plain reply
    events: list[str] | None = None  # SSE `data:` payloads of a stream reply
    cut_after: int | None = None  # close the connection after this many events, mid-body
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (to trip a client timeout)
    hang: bool = False  # read the request, then never answer (until the server closes)
    stall_after: int | None = None  # a stream: send the headers and this many events, then stall;
    # a plain reply: send the headers (any value), then stall before the body
    pace: float = 0.0  # a stream: seconds between events


@dataclass
class LLMServer:
    url: str = ""
    requests: list[Received] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    respond: Callable[[Received], Reply] | None = None
    closing: threading.Event = field(default_factory=threading.Event)  # wakes stalled handlers

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def _next(self, received: Received) -> Reply:
        self.requests.append(received)
        if self.respond is not None:
            return self.respond(received)
        if not self.replies:
            return Reply(500, {"error": {"code": 500, "message": "test server: no reply queued"}})
        return self.replies.pop(0)


def _handler(state: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams, and a cut that the client can tell apart

        def log_message(self, *args: Any) -> None:
            pass

        def handle(self) -> None:
            with suppress(BrokenPipeError, ConnectionResetError):  # the client gave up first (timeout tests)
                super().handle()

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.loads(raw) if raw else None
            reply = state._next(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if reply.delay:
                time.sleep(reply.delay)
            if reply.hang:
                self._stall()
                return
            if reply.events is None:
                payload = json.dumps(reply.body if reply.body is not None else {}).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if reply.stall_after is not None:
                    self._stall()
                    return
                self.wfile.write(payload)
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            for index, event in enumerate(reply.events):
                if reply.stall_after is not None and index >= reply.stall_after:
                    self._stall()
                    return
                if reply.cut_after is not None and index >= reply.cut_after:
                    break
                if reply.pace and index:
                    time.sleep(reply.pace)
                line = event if event.startswith(":") else f"data: {event}"  # ":" = an SSE comment
                data = f"{line}\r\n\r\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            if reply.cut_after is not None:  # drop the connection without the final chunk
                self.close_connection = True
                with suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _stall(self) -> None:
            state.closing.wait()
            self.close_connection = True

    return Handler


@contextmanager
def serve() -> Iterator[LLMServer]:
    state = LLMServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        forget_clients()
        state.closing.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@contextmanager
def blackhole() -> Iterator[str]:
    """A loopback base URL (`http://127.0.0.1:<port>`) whose TCP connects never complete.

    A listening socket that never accepts: once its accept queue is full, the kernel drops new
    SYNs, so a connect waits until the client's connect timeout, as with an unreachable host.
    """
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(64):  # fill the accept queue until a connect stays pending
            filler = socket.socket()
            filler.setblocking(False)
            fillers.append(filler)
            with suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            _, writable, _ = select.select([], [filler], [], 0.2)
            if not writable:
                break
        else:
            pytest.skip("could not fill a loopback accept queue here")
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback traffic must not go through a proxy from the developer's environment."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_API_VERSION"):
        monkeypatch.delenv(name, raising=False)


# -- OpenAI chat-completions bodies ----------------------------------------------------------

def openai_completion(text: str | None, tool_calls: list[dict[str, Any]] | None = None,
                      model: str = "test-model") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def openai_chunks(pieces: list[str], *, done: bool = True) -> list[str]:
    events = [json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "test-model",
                          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "finish_reason": None}]})]
    for piece in pieces:
        events.append(json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "test-model",
                                  "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]},
                                 ensure_ascii=False))
    if done:
        events.append(json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "test-model",
                                  "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        events.append("[DONE]")
    return events


def openai_error(status: int, message: str = "nope") -> dict[str, Any]:
    return {"error": {"message": message, "type": "error", "code": status}}


# -- Gemini generateContent bodies -----------------------------------------------------------

def gemini_response(text: str | None = None, calls: list[dict[str, Any]] | None = None,
                    finish: str | None = "STOP") -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if text is not None:
        parts.append({"text": text})
    parts.extend(calls or [])
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate],
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13},
            "modelVersion": "gemini-test-001"}


def gemini_chunks(pieces: list[str]) -> list[str]:
    events = []
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        events.append(json.dumps(gemini_response(piece, finish="STOP" if last else None), ensure_ascii=False))
    return events


def gemini_error(status: int, message: str = "nope", *, state: str = "", details: list[Any] | None = None
                 ) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": state or "UNKNOWN", "details": details or []}}


# -- running clients -------------------------------------------------------------------------

_open: list[Any] = []


def track(llm: Any) -> Any:
    """Remember a client so `run` closes its connections inside the loop that opened them."""
    _open.append(llm)
    return llm


def run(awaitable: Awaitable[Any]) -> Any:
    """`asyncio.run`, then close every tracked client in that same loop (no stray sockets)."""

    async def main() -> Any:
        try:
            return await awaitable
        finally:
            for llm in _open:
                await llm.aclose()

    return asyncio.run(main())


def forget_clients() -> None:
    _open.clear()


# -- offline, proven ---------------------------------------------------------------------------

def _is_loopback(host: Any) -> bool:
    return isinstance(host, str) and (host in ("localhost", "::1") or host.startswith("127."))


def refuse_non_loopback(refused: list[str]) -> Callable[[], None]:
    """From now on this process reaches loopback only: resolving another host name or connecting
    to another address fails as it would with no network (`socket.gaierror`, `OSError`), and the
    host is appended to `refused` — so a framework that phones home (a tokenizer's vocabulary, a
    tracing export) fails loudly and the test can assert that nothing tried. Returns the undo."""
    real_getaddrinfo = socket.getaddrinfo
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host.decode() if isinstance(host, bytes) else host):
            refused.append(str(host))
            raise socket.gaierror(socket.EAI_NONAME, f"loopback only: {host} is not resolved here")
        return real_getaddrinfo(host, *args, **kwargs)

    def guarded(real: Callable[..., Any]) -> Callable[..., Any]:
        def connect(sock: socket.socket, address: Any) -> Any:
            if isinstance(address, tuple) and not _is_loopback(address[0]):
                refused.append(str(address[0]))
                raise OSError(f"loopback only: no connection to {address[0]} here")
            return real(sock, address)
        return connect

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = guarded(real_connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded(real_connect_ex)  # type: ignore[method-assign]

    def undo() -> None:
        socket.getaddrinfo = real_getaddrinfo
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
    return undo


@contextmanager
def loopback_only() -> Iterator[list[str]]:
    """`refuse_non_loopback` while the block runs; yields the hosts refused (assert it stays empty)."""
    refused: list[str] = []
    undo = refuse_non_loopback(refused)
    try:
        yield refused
    finally:
        undo()


def loopback_only_env(directory: Any) -> dict[str, str]:
    """Environment variables that put a Python subprocess under `refuse_non_loopback` from its first
    line: a `sitecustomize` in `directory` (on PYTHONPATH) holds its source, installs it and writes
    each refused host to stderr as `loopback only: refused <host>`. The program runs unchanged (and
    imports nothing of the tests: the guard's source is copied, not imported)."""
    import inspect
    from pathlib import Path
    report = ("class _Report(list):\n"
              "    def append(self, host):\n"
              "        sys.stderr.write(f'loopback only: refused {host}\\n')\n"
              "        super().append(host)\n\n\n"
              "refuse_non_loopback(_Report())\n")
    source = "\n\n".join(["from __future__ import annotations\n\nimport socket\nimport sys",
                          inspect.getsource(_is_loopback), inspect.getsource(refuse_non_loopback), report])
    (Path(directory) / "sitecustomize.py").write_text(source, encoding="utf-8")
    return {"PYTHONPATH": str(directory)}

"""A loopback OpenAI-compatible chat server for benchmarks: answers at once, over real HTTP,
so the real provider client (httpx, SSE parsing, the router) runs in the measured path.

It runs in a process of its own, as a real provider does: in the benchmark's process its
threads took the interpreter lock from the bot being measured (measured: the provider's own
first token took 44 ms under the 50-channel load instead of a few).

Replies: a request with a JSON schema gets a gatekeeper-shaped JSON answer (reply, no
retrieval; empty extraction); a streamed request echoes the last user message's bracketed
tags (e.g. "[c07-m012]") so a benchmark can check every reply landed in the right channel.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.children import stop_child

__all__ = ["loopback_llm", "TAG"]

TAG = re.compile(r"\[c\d+-m\d+\]")


def _answer(body: dict[str, Any]) -> tuple[str, bool]:
    messages = body.get("messages", [])
    text = str(messages[-1].get("content", "")) if messages else ""
    if body.get("response_format") or "user_facts" in text or "response_needed" in text:
        if "user_facts" in text:
            return json.dumps({"guild_facts": [], "user_facts": [], "summary_updates": {}}), False
        return json.dumps({"response_needed": True, "retrieval_needed": True, "search_query": "오늘 일정"}), False
    tags = " ".join(TAG.findall(text.split("<<<", 1)[-1].rsplit(">>>", 1)[0] if "<<<" in text else text))
    return f"응, 들었어 {tags}".strip(), bool(body.get("stream"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in two writes; with Nagle's algorithm the body waited for the
        # client's delayed ACK of the headers: a streamed answer's first token came 40 ms late.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        text, stream = _answer(body)
        if not stream:
            payload = json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model", "m"),
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        events: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "delta": {"content": piece + " "}, "finish_reason": None}]}
            for piece in text.split(" ")]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        data = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"
        raw = data.encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@contextmanager
def loopback_llm() -> Iterator[str]:
    """Yields the base URL (`…/v1`) of a server running in a child process."""
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.loopback_llm"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the loopback LLM server did not start (exit code {child.poll()})")
        yield url
    finally:
        stop_child(child)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a bot process killed on purpose) is no error here."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def main() -> None:
    """Serve until terminated; the first line on stdout is the base URL."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    with suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()

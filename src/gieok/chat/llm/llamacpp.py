"""A local GGUF model in-process through llama-cpp-python: an optional extra, imported lazily.

For a bot that must answer with no network at all. Not a default dependency: the package
compiles llama.cpp at install time, and the native build (`-march=native`) crashes on CPUs with
AMX, so it must be built with `CMAKE_ARGS="-DGGML_NATIVE=OFF"`. Without it, constructing this
class raises an `LLMError` that says exactly what to run.

llama.cpp blocks while it computes, so every call runs in a worker thread (the event loop keeps
serving other channels), and calls are serialised: one model context is not thread-safe. The
lock is a `threading.Lock` taken by the worker thread itself, not an `asyncio.Lock` around the
await: a cancelled caller (a timeout, a failover) stops waiting but cannot stop the thread, and
the next call must still wait for that thread to let go of the model. A thread lock also holds
across event loops (each `asyncio.run` of a CLI command has its own).

The request and response shapes are llama-cpp-python's OpenAI-style ones, so the
OpenAI-compatible mapping is reused. `json_schema` goes in as `response_format={"type":
"json_object", "schema": ...}`, which llama-cpp-python turns into a grammar: the output is
constrained to the schema, not merely asked for. Tool calls need a chat format that supports
them (e.g. `chat_format="chatml-function-calling"`); with the GGUF's own chat template (the
default) llama-cpp-python shows the tools to the template but parses no calls out of the reply.
`chatml-function-calling`'s template renders no `tool` messages at all, so for that format tool
results are sent as user messages that name the function: otherwise the model never sees them
and calls the same tool again. And when, offered tools, the model chooses to answer in words,
that handler (0.3.36) constrains the words with its tool-name grammar, so the "answer" is only
`functions.<name>:` or nothing; such a reply is asked again without tools, which lets the model
write its answer.

llama.cpp's own log lines go to the `gieok.llama_cpp` logger. `verbose=False` alone does not
quiet them: llama-cpp-python 0.3.36 maps ggml's log levels with an outdated table, so warnings
reach stderr as if they were errors and real errors (why a file failed to load) are dropped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from ...embed.llama_logs import route_llama_logs
from ...errors import LLMError, LLMOutputError
from .base import ChatMessage, ChatResponse, ToolCall, ToolSpec
from .openai_compat import parse_openai_message, to_openai_messages, to_openai_tools

__all__ = ["LlamaCppLLM", "INSTALL_HINT"]

INSTALL_HINT = ("the llamacpp provider needs llama-cpp-python: "
                "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'gieok[llamacpp]'")
log = logging.getLogger("gieok.chat.llm.llamacpp")

_FUNCTION_CALLING = frozenset({"chatml-function-calling"})  # llama-cpp-python's grammar-driven tool format
# What that format returns as the text of a "message" answer: its follow-up grammar allows nothing else.
_EMPTY_MESSAGE = re.compile(r"\s*(functions\.[^\s:]*:?)?\s*(<\|im_end\|>)?\s*")


class LlamaCppLLM:
    """One GGUF file; the model loads on first use, not at construction (it can take seconds)."""

    def __init__(self, model_path: str, *, n_ctx: int = 4096, n_threads: int | None = None,
                 chat_format: str | None = None, provider: str = "llamacpp") -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise LLMError(INSTALL_HINT)
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise LLMError(f"GGUF model file not found: {path}")
        self.model = path.name
        self.provider = provider
        self.name = f"{provider}:{path.name}"
        self._path = path
        self._options: dict[str, Any] = {"n_ctx": n_ctx, "n_threads": n_threads, "chat_format": chat_format}
        self._llama: Any = None
        self._lock = threading.Lock()  # held by the worker thread while it loads or uses the model

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (it loads on the first call)."""
        return self._llama is not None

    def _model(self) -> Any:
        """The loaded model; call with `_lock` held, so two first calls do not both load it."""
        if self._llama is None:
            from llama_cpp import Llama

            route_llama_logs()
            options = {k: v for k, v in self._options.items() if v is not None}
            # verbose=False: llama-cpp-python otherwise prints load details and timings on every call.
            self._llama = Llama(model_path=str(self._path), verbose=False, **options)
        return self._llama

    def _complete(self, request: dict[str, Any]) -> Any:
        with self._lock:
            return self._model().create_chat_completion(**request)

    def _wire_messages(self, messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        """OpenAI-style messages; for `chatml-function-calling`, tool results as user turns (its
        template would drop them)."""
        wire = to_openai_messages(messages)  # one entry per message, in order
        if self._options["chat_format"] not in _FUNCTION_CALLING:
            return wire
        names = {call.id: call.name for message in messages for call in message.tool_calls}
        for index, message in enumerate(messages):
            if message.role == "tool":
                name = message.name or names.get(message.tool_call_id or "", "tool")
                wire[index] = {"role": "user", "content": f"Result of functions.{name}:\n{message.content}"}
        return wire

    def _request(self, messages: Sequence[ChatMessage], json_schema: dict[str, Any] | None,
                 tools: Sequence[ToolSpec] | None, temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
        request: dict[str, Any] = {"messages": self._wire_messages(messages)}
        if json_schema is not None:  # llama.cpp turns the schema into a grammar: output is constrained
            request["response_format"] = {"type": "json_object", "schema": json_schema}
        if tools:
            request["tools"] = to_openai_tools(tools)
            request["tool_choice"] = "auto"
        if temperature is not None:
            request["temperature"] = temperature
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        return request

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        request = self._request(messages, json_schema, tools, temperature, max_tokens)
        text, calls, usage = await self._answer(request)
        if (tools and not calls and self._options["chat_format"] in _FUNCTION_CALLING
                and _EMPTY_MESSAGE.fullmatch(text)):
            del request["tools"], request["tool_choice"]  # the model chose words: let it write them
            text, calls, more = await self._answer(request)
            usage = {k: usage.get(k, 0) + more.get(k, 0) for k in {*usage, *more}}
        return ChatResponse(text=text, tool_calls=calls, model=self.model, provider=self.provider, usage=usage)

    async def _answer(self, request: dict[str, Any]) -> tuple[str, list[ToolCall], dict[str, int]]:
        """One `create_chat_completion` in a worker thread; whatever llama.cpp raises becomes an `LLMError`."""
        try:
            result = await asyncio.to_thread(self._complete, request)
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError (e.g. context overflow, bad file)
            raise LLMError(f"{self.name}: {exc}") from exc
        try:
            text, calls = parse_openai_message(result["choices"][0]["message"], self.name)
            usage = {k: v for k, v in (result.get("usage") or {}).items()
                     if isinstance(v, int) and not isinstance(v, bool)}
        except LLMOutputError:
            raise
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMError(f"{self.name}: unexpected response from llama-cpp-python: {str(result)[:200]}") from exc
        return text, calls, usage

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        """Pieces of the reply as llama.cpp produces them.

        One worker thread runs the whole generation with the lock held and hands pieces to the
        event loop; stepping llama-cpp-python's generator from a fresh thread per token would
        let go of the lock between tokens. A consumer that stops early (or is cancelled) sets
        `stop`, and the worker ends the generation at the next token and frees the model.
        """
        request = self._request(messages, None, None, temperature, max_tokens)
        request["stream"] = True
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        def produce() -> None:
            try:
                with self._lock:
                    if stop.is_set():  # given up on while it waited for the model
                        return
                    chunks = self._model().create_chat_completion(**request)
                    try:
                        for chunk in chunks:
                            if stop.is_set():
                                break
                            for choice in chunk.get("choices", [])[:1]:
                                text = (choice.get("delta") or {}).get("content")
                                if text:
                                    put("text", text)
                    finally:
                        close = getattr(chunks, "close", None)
                        if close is not None:  # a generator left early releases what it holds now
                            close()
            except Exception as exc:
                put("error", exc)
            else:
                put("done", None)

        loop.run_in_executor(None, produce)  # not awaited: a worker told to stop ends at its next token
        try:
            while True:
                kind, value = await queue.get()
                if kind == "done":
                    return
                if kind == "error":
                    raise LLMError(f"{self.name}: {value}") from value
                yield value
        finally:
            stop.set()

"""A local GGUF model in-process through llama-cpp-python: an optional extra, imported lazily.

For a bot that must answer with no network at all. Not a default dependency: the package
compiles llama.cpp at install time, and the native build (`-march=native`) crashes on CPUs with
AMX, so it must be built with `CMAKE_ARGS="-DGGML_NATIVE=OFF"`. Without it, constructing this
class raises an `LLMError` that says exactly what to run.

llama.cpp blocks while it computes, so every call runs in a worker thread (the event loop keeps
serving other channels) and calls are serialised: one model context is not thread-safe. The
request and response shapes are llama-cpp-python's OpenAI-style ones, so the OpenAI-compatible
mapping is reused. Tool calls need a chat format that supports them (e.g.
`chat_format="chatml-function-calling"`).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import LLMError
from .base import ChatMessage, ChatResponse, ToolSpec
from .openai_compat import parse_openai_message, to_openai_messages, to_openai_tools

__all__ = ["LlamaCppLLM", "INSTALL_HINT"]

INSTALL_HINT = ("the llamacpp provider needs llama-cpp-python: "
                "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'gieok[llamacpp]'")
_DONE = object()


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
        self._lock: asyncio.Lock | None = None

    def _model(self) -> Any:
        if self._llama is None:
            from llama_cpp import Llama

            options = {k: v for k, v in self._options.items() if v is not None}
            self._llama = Llama(model_path=str(self._path), verbose=False, **options)
        return self._llama

    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _request(self, messages: Sequence[ChatMessage], json_schema: dict[str, Any] | None,
                 tools: Sequence[ToolSpec] | None, temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
        request: dict[str, Any] = {"messages": to_openai_messages(messages)}
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
        async with self._serial():
            try:
                result = await asyncio.to_thread(lambda: self._model().create_chat_completion(**request))
            except Exception as exc:  # llama.cpp raises ValueError/RuntimeError (e.g. context overflow)
                raise LLMError(f"{self.name}: {exc}") from exc
        text, calls = parse_openai_message(result["choices"][0]["message"], self.name)
        usage = {k: int(v) for k, v in (result.get("usage") or {}).items() if isinstance(v, int)}
        return ChatResponse(text=text, tool_calls=calls, model=self.model, provider=self.provider, usage=usage)

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        request = self._request(messages, None, None, temperature, max_tokens)
        async with self._serial():
            try:
                chunks: Iterator[dict[str, Any]] = await asyncio.to_thread(
                    lambda: self._model().create_chat_completion(stream=True, **request))
                while True:
                    chunk = await asyncio.to_thread(next, chunks, _DONE)
                    if chunk is _DONE:
                        return
                    for choice in chunk.get("choices", [])[:1]:
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            yield text
            except LLMError:
                raise
            except Exception as exc:
                raise LLMError(f"{self.name}: {exc}") from exc

"""A scripted `LLM`: answers from a list or a function, in-process.

For tests and offline demos of the pipeline, where no model can be reached. It is a real
implementation of the protocol (it records every request), not a mock of a provider:
provider clients are tested against loopback servers that speak their wire formats.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import LLMError
from .base import ChatMessage, ChatResponse, ToolSpec

__all__ = ["ScriptedLLM", "Request"]


@dataclass(slots=True)
class Request:
    messages: list[ChatMessage]
    json_schema: dict[str, Any] | None = None
    tools: list[ToolSpec] | None = None
    streamed: bool = False


Reply = str | dict[str, Any] | ChatResponse | Exception
Script = Sequence[Reply] | Callable[[Request], Reply]


@dataclass
class ScriptedLLM:
    """Replies in order (a list) or by rule (a function of the request). A dict reply is
    sent as JSON text; an exception reply is raised, to script failures."""

    script: Script
    name: str = "scripted"
    requests: list[Request] = field(default_factory=list)
    _position: int = 0

    def _next(self, request: Request) -> ChatResponse:
        self.requests.append(request)
        if callable(self.script):
            reply = self.script(request)
        else:
            if self._position >= len(self.script):
                raise LLMError(f"{self.name}: script exhausted after {self._position} replies")
            reply = self.script[self._position]
            self._position += 1
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, ChatResponse):
            return reply
        text = json.dumps(reply, ensure_ascii=False) if isinstance(reply, dict) else str(reply)
        return ChatResponse(text=text, model=self.name, provider="scripted")

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        return self._next(Request(list(messages), json_schema, list(tools) if tools else None))

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        response = self._next(Request(list(messages), streamed=True))
        words = response.text.split(" ")
        for index, word in enumerate(words):
            yield word if index == len(words) - 1 else word + " "

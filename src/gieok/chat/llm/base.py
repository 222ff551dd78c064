"""The `LLM` protocol: the one interface every language-model provider implements.

Async, because the bot runs on an event loop (discord.py) and a blocking model call would
stall every channel. Three capabilities, all optional per call:
- `json_schema`: ask for a JSON object of that shape (providers that support constrained
  output pass the schema on; the rest get it in the prompt, and callers parse tolerantly);
- `tools`: the model may answer with tool calls instead of text;
- `stream`: text arrives in chunks as it is generated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["Role", "ChatMessage", "ToolSpec", "ToolCall", "ChatResponse", "LLM"]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # on assistant messages that asked for tools
    tool_call_id: str | None = None  # on tool messages: which call this answers
    name: str | None = None  # on tool messages: the tool's name


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object


@dataclass(slots=True)
class ChatResponse:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    model: str = ""
    provider: str = ""
    usage: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class LLM(Protocol):
    """A chat model. `name` identifies provider and model in logs and health reports."""

    name: str

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse: ...

    def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
               max_tokens: int | None = None) -> AsyncIterator[str]: ...

"""The tool loop: let a model call tools, feed it the results, and get its answer.

Round by round: `llm.chat(…, tools=specs)`; if the answer asks for tools, every call of that
round runs (concurrently, each under its own timeout), the assistant message with its calls and
one `tool` message per call are appended, and the model is asked again. After `max_rounds`
rounds of calls the model is asked once more *without* tools, so it has to answer with what it
has: a model that keeps calling tools cannot stall a reply. Calls beyond `max_calls_per_round`
in one answer are refused with an error result rather than run.

Nothing a model sends crashes the loop: an unknown tool, arguments that do not fit the schema,
a handler that raises or runs out of time each become an error result (`status="error"`) the
model reads and can recover from. Errors of the model call itself (`LLMError`) are the caller's
to handle, as for any other `chat`.

Every result goes into the prompt through `wrap_result` (tools.py): tagged, marked untrusted,
cut to `result_chars`, and with any wrapper tag inside it defused.

The `ToolContext` is an argument here and of every handler: two loops for two channels can run
at once on one event loop and each call sees only its own context.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .base import LLM, ChatMessage, ChatResponse, ToolCall
from .tools import (
    Tool,
    ToolContext,
    ToolError,
    tools_by_name,
    validate_arguments,
    wrap_result,
)

if TYPE_CHECKING:
    from ..settings import ChatSettings

__all__ = ["run_tool_loop", "ToolLoopResult", "ToolCallRecord", "tool_loop_options"]

log = logging.getLogger("gieok.chat.llm.tools")


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One call the model made, what it got back, and how long it took."""

    round: int  # 1-based
    call_id: str
    name: str
    arguments: dict[str, Any]
    result: str  # the text before wrapping (an error text when `ok` is False)
    ok: bool
    seconds: float


@dataclass(slots=True)
class ToolLoopResult:
    text: str  # the model's final answer
    calls: list[ToolCallRecord] = field(default_factory=list)
    rounds: int = 0  # rounds in which tools ran
    capped: bool = False  # max_rounds was reached; the final answer was asked for without tools
    messages: list[ChatMessage] = field(default_factory=list)  # the conversation incl. the tool exchange
    response: ChatResponse | None = None  # the last model response

    @property
    def tool_seconds(self) -> float:
        return sum(call.seconds for call in self.calls)


def tool_loop_options(settings: ChatSettings) -> dict[str, Any]:
    """`run_tool_loop` keyword arguments from the settings (`tool_rounds`, `tool_result_chars`,
    `tool_timeout_seconds`)."""
    return {"max_rounds": settings.tool_rounds, "result_chars": settings.tool_result_chars,
            "timeout_seconds": settings.tool_timeout_seconds}


async def _run_call(call: ToolCall, tool: Tool | None, ctx: ToolContext, *, round_number: int, timeout: float,
                    refused: str | None, available: Sequence[str],
                    clock: Callable[[], float]) -> ToolCallRecord:
    started = clock()
    ok = False
    if refused is not None:
        result = refused
    elif tool is None:
        result = (f"error: there is no tool named {call.name!r}; available tools: "
                  f"{', '.join(available) or 'none'}")
    else:
        arguments, problems = validate_arguments(tool.spec.parameters, call.arguments)
        if problems:
            result = f"error: invalid arguments for {tool.name}: {'; '.join(problems)}"
        else:
            try:
                result = str(await asyncio.wait_for(tool.handler(arguments, ctx), timeout))
                ok = True
            except TimeoutError:
                result = f"error: {tool.name} did not finish within {timeout:g} seconds"
            except ToolError as exc:
                result = f"error: {exc}"
            except Exception as exc:  # a handler bug must not take the reply down with it
                log.exception("tool %s failed", tool.name)
                result = f"error: {tool.name} failed unexpectedly ({type(exc).__name__})"
    seconds = clock() - started
    log.debug("tool %s round %d %s in %.1f ms", call.name, round_number, "ok" if ok else "error", seconds * 1000)
    return ToolCallRecord(round_number, call.id, call.name, dict(call.arguments), result, ok, seconds)


async def run_tool_loop(llm: LLM, messages: Sequence[ChatMessage], tools: Sequence[Tool] | Mapping[str, Tool],
                        ctx: ToolContext, *, max_rounds: int = 3, result_chars: int = 4000,
                        timeout_seconds: float = 10.0, max_calls_per_round: int = 8,
                        temperature: float | None = None, max_tokens: int | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> ToolLoopResult:
    """Ask `llm`, running the tools it calls, until it answers in text (see the module doc).

    `tools` may be empty (or `max_rounds` 0): then this is one plain `chat`."""
    if max_rounds < 0 or max_calls_per_round < 1 or timeout_seconds <= 0:
        raise ValueError("max_rounds must be >= 0, max_calls_per_round >= 1 and timeout_seconds > 0")
    registry = tools_by_name(tools)
    specs = [tool.spec for tool in registry.values()]
    names = sorted(registry)
    history = list(messages)
    records: list[ToolCallRecord] = []
    rounds = 0
    while True:
        offer = specs if specs and rounds < max_rounds else None
        response = await llm.chat(history, tools=offer, temperature=temperature, max_tokens=max_tokens)
        if offer is None or not response.tool_calls:
            # A model asked without tools that still "calls" one gets its text taken as is.
            return ToolLoopResult(text=response.text, calls=records, rounds=rounds,
                                  capped=bool(specs) and max_rounds > 0 and rounds >= max_rounds,
                                  messages=[*history, ChatMessage("assistant", response.text)], response=response)
        rounds += 1
        calls = list(response.tool_calls)
        too_many = (f"error: at most {max_calls_per_round} tool calls are run per answer; "
                    "this one was skipped")
        round_records = await asyncio.gather(*(
            _run_call(call, registry.get(call.name), ctx, round_number=rounds, timeout=timeout_seconds,
                      refused=too_many if index >= max_calls_per_round else None, available=names, clock=clock)
            for index, call in enumerate(calls)))
        records.extend(round_records)
        history.append(ChatMessage("assistant", response.text, tool_calls=tuple(calls)))
        for call, record in zip(calls, round_records):
            history.append(ChatMessage("tool", wrap_result(call.name, record.result, max_chars=result_chars,
                                                           error=not record.ok),
                                       tool_call_id=call.id, name=call.name))

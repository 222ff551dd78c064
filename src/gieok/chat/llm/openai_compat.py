"""Any OpenAI-compatible `/chat/completions` endpoint: Ollama, llama.cpp server, vLLM, OpenRouter.

One client is bound to one API key; the router rotates keys by holding one client per key.
Plain httpx rather than the `openai` package: the wire format is small and stable, and the
local servers we target each accept a slightly different subset of it, so we send only what
they all understand and parse tolerantly (content as a string or as parts, tool-call
arguments as a JSON string or an object, ids that some servers leave out).

Errors are sorted for the router (see `failures.py`): 429 → `LLMRateLimitError` with the
Retry-After header, 5xx / timeouts / dropped connections → `LLMTransientError`, 401/403 →
`LLMAuthError`. A stream that ends without `data: [DONE]` and without a `finish_reason` was
cut short and is a transient error too: delivering half an answer as if it were whole would
hide the failure from the router, which can finish the answer elsewhere.

Time limits (`LLMTimeoutError`, see `failures.py`): the connection within `connect_timeout`; a
plain call's response headers within `first_token_timeout` of the start and its whole answer
within `timeout`; a stream's first text within `first_token_timeout` of the start, then no
silence longer than `timeout` between reads. Keep-alive comments and role-only chunks are not a
first token. Under the router's `last_resort` the first-token wait grows to `timeout`.

JSON output: `json_mode="json_schema"` (default) sends `response_format: json_schema` with
`strict: true`; servers that only know JSON mode take `"json_object"` (schema also written
into the system prompt); `"prompt"` sends no `response_format` at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import httpx

from ...errors import LLMError, LLMOutputError, LLMRateLimitError, LLMTransientError
from .base import ChatMessage, ChatResponse, ToolCall, ToolSpec
from .failures import LLMTimeoutError, error_detail, error_for_status, first_token_budget

__all__ = [
    "OpenAICompatLLM",
    "JsonMode",
    "JSON_MODES",
    "to_openai_messages",
    "to_openai_tools",
    "parse_openai_message",
    "schema_instruction",
]

JsonMode = Literal["json_schema", "json_object", "prompt"]
JSON_MODES: tuple[str, ...] = ("json_schema", "json_object", "prompt")
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]+")


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """The prompt text that carries a schema to servers that cannot constrain output."""
    return ("Answer with one JSON object only, no prose and no code fence, matching this JSON schema:\n"
            + json.dumps(schema, ensure_ascii=False))


def _with_schema_in_prompt(messages: list[dict[str, Any]], schema: Mapping[str, Any]) -> list[dict[str, Any]]:
    # Appended to the leading system message: several chat templates (llama.cpp, some Ollama
    # models) reject a system message anywhere but first.
    instruction = schema_instruction(schema)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{instruction}" if first["content"] else instruction
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            out.append({"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content})
        elif message.role == "assistant" and message.tool_calls:
            out.append({
                "role": "assistant",
                "content": message.content or None,
                "tool_calls": [
                    {"id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
                    for call in message.tool_calls
                ],
            })
        else:
            out.append({"role": message.role, "content": message.content})
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def parse_openai_message(message: Mapping[str, Any], where: str) -> tuple[str, list[ToolCall]]:
    """Text and tool calls of a `choices[i].message` object."""
    calls: list[ToolCall] = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise LLMOutputError(f"{where}: tool call {function.get('name')!r} has arguments that are "
                                     f"not JSON: {arguments[:200]!r}") from exc
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise LLMOutputError(f"{where}: tool call {function.get('name')!r} arguments are not an object")
        calls.append(ToolCall(id=str(raw.get("id") or f"call_{index}"), name=str(function.get("name", "")),
                              arguments=arguments))
    return _content_text(message.get("content")), calls


def _usage(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    return {k: int(raw[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
            if isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool)}


def _stream_error(where: str, error: Any) -> LLMError:
    """An error event inside an accepted stream (vLLM, OpenRouter send these mid-answer)."""
    if not isinstance(error, dict):
        return LLMTransientError(f"{where}: stream error: {str(error)[:300]}")
    message = str(error.get("message") or error)[:300]
    code = error.get("code")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool):
        return error_for_status(where, code, message)
    if "rate" in str(code).lower() or "quota" in str(code).lower():
        return LLMRateLimitError(f"{where}: {message}")
    return LLMTransientError(f"{where}: stream error: {message}")


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` payload of each server-sent event (multi-line data joined; comments skipped)."""
    buffer: list[str] = []
    async for line in lines:
        if not line:
            if buffer:
                yield "\n".join(buffer)
                buffer = []
            continue
        if line.startswith(":"):  # keep-alive comments, e.g. OpenRouter's ": OPENROUTER PROCESSING"
            continue
        field, _, value = line.partition(":")
        if field == "data":
            buffer.append(value[1:] if value.startswith(" ") else value)
    if buffer:
        yield "\n".join(buffer)


class OpenAICompatLLM:
    """One model at one OpenAI-compatible endpoint, with one API key (empty for local servers)."""

    def __init__(self, model: str, base_url: str, api_key: str = "", *, timeout: float = 60.0,
                 connect_timeout: float | None = None, first_token_timeout: float | None = None,
                 json_mode: JsonMode = "json_schema", provider: str = "openai",
                 headers: Mapping[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`timeout`: the whole answer (a plain call) or the longest silence (a stream);
        `connect_timeout` (default: `timeout`, at most 10 s) and `first_token_timeout` (default:
        `timeout`) bound the connection and the start of the answer, see the module docstring."""
        if json_mode not in JSON_MODES:
            raise ValueError(f"json_mode must be one of {JSON_MODES}, got {json_mode!r}")
        if min(timeout, connect_timeout or timeout, first_token_timeout or timeout) <= 0:
            raise ValueError("timeouts must be positive")
        self.model = model
        self.provider = provider
        self.name = f"{provider}:{model}"
        self.base_url = base_url.rstrip("/")
        self.json_mode = json_mode
        self._url = self.base_url + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers.update(headers or {})
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else min(timeout, 10.0)
        self.first_token_timeout = first_token_timeout if first_token_timeout is not None else timeout
        self._timeout = httpx.Timeout(timeout, connect=self.connect_timeout)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._client_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _http(self) -> httpx.AsyncClient:
        # An AsyncClient's pooled connections belong to the event loop that opened them;
        # a caller that runs several loops (asyncio.run per CLI command, tests) gets a fresh
        # client per loop instead of "Event loop is closed" on a stale keep-alive socket.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is None or self._client_loop() is not loop:
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=self._headers,
                                             transport=self._transport, trust_env=True)
            self._client_loop = weakref.ref(loop)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(RuntimeError):  # opened on a loop that is gone; nothing left to close cleanly
                await client.aclose()

    def _timeout_error(self, exc: httpx.TimeoutException, *, streaming: bool = False) -> LLMTimeoutError:
        """An httpx timeout as the router's kind: a connect that did not complete, or a silence."""
        if isinstance(exc, httpx.ConnectTimeout):
            return LLMTimeoutError(f"{self.name}: timed out: no connection to {self.base_url} within "
                                   f"{self.connect_timeout:g} s", phase="connect", seconds=self.connect_timeout)
        what = "the stream" if streaming else "the answer"
        return LLMTimeoutError(f"{self.name}: timed out: {what} stalled for {self.timeout:g} s ({type(exc).__name__})",
                               phase="stall", seconds=self.timeout)

    def _body(self, messages: Sequence[ChatMessage], *, json_schema: Mapping[str, Any] | None,
              tools: Sequence[ToolSpec] | None, temperature: float | None, max_tokens: int | None,
              stream: bool) -> dict[str, Any]:
        wire = to_openai_messages(messages)
        body: dict[str, Any] = {"model": self.model}
        if json_schema is not None:
            if self.json_mode == "json_schema":
                name = _SCHEMA_NAME.sub("_", str(json_schema.get("title") or "response"))[:64] or "response"
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": name, "schema": dict(json_schema), "strict": True}}
            else:
                wire = _with_schema_in_prompt(wire, json_schema)
                if self.json_mode == "json_object":
                    body["response_format"] = {"type": "json_object"}
        body["messages"] = wire
        if tools:
            body["tools"] = to_openai_tools(tools)
        if temperature is not None:
            body["temperature"] = temperature
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stream:
            body["stream"] = True
        return body

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        body = self._body(messages, json_schema=json_schema, tools=tools, temperature=temperature,
                          max_tokens=max_tokens, stream=False)
        http = self._http()
        first = first_token_budget(self.first_token_timeout, self.timeout)
        start = asyncio.get_running_loop().time()
        timer = asyncio.timeout(first)
        answered = False  # the response headers came
        try:
            async with timer:
                response = await http.send(http.build_request("POST", self._url, json=body), stream=True)
                answered = True
                timer.reschedule(start + max(first, self.timeout))  # now the whole answer
                try:
                    await response.aread()
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            if not timer.expired():
                raise LLMTransientError(f"{self.name}: request to {self._url} failed: {exc!r}") from exc
            if answered:
                raise LLMTimeoutError(f"{self.name}: timed out: the answer took longer than "
                                      f"{max(first, self.timeout):g} s", phase="total",
                                      seconds=max(first, self.timeout)) from exc
            raise LLMTimeoutError(f"{self.name}: timed out: no response within {first:g} s",
                                  phase="first_token", seconds=first) from exc
        except httpx.TimeoutException as exc:
            raise self._timeout_error(exc) from exc
        except httpx.HTTPError as exc:
            raise LLMTransientError(f"{self.name}: request to {self._url} failed: {exc!r}") from exc
        if response.status_code >= 400:
            raise error_for_status(self.name, response.status_code, error_detail(response.text), response.headers)
        try:
            data = response.json()
            choice = data["choices"][0]
            text, calls = parse_openai_message(choice["message"], self.name)
        except LLMOutputError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMError(f"{self.name}: unexpected response from {self._url}: {response.text[:200]}") from exc
        return ChatResponse(text=text, tool_calls=calls, model=str(data.get("model") or self.model),
                            provider=self.provider, usage=_usage(data.get("usage")))

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        body = self._body(messages, json_schema=None, tools=None, temperature=temperature,
                          max_tokens=max_tokens, stream=True)
        finished = False
        first = first_token_budget(self.first_token_timeout, self.timeout)
        timer = asyncio.timeout(first)  # until the first text; lifted before it is yielded
        try:
            async with timer, self._http().stream("POST", self._url, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_for_status(self.name, response.status_code, error_detail(response.text),
                                           response.headers)
                async for payload in sse_data(response.aiter_lines()):
                    if payload.strip() == "[DONE]":
                        finished = True
                        break
                    try:
                        data = json.loads(payload)
                    except json.JSONDecodeError as exc:
                        raise LLMTransientError(f"{self.name}: stream sent a broken event: {payload[:120]!r}") from exc
                    if not isinstance(data, dict):
                        continue
                    if data.get("error"):
                        raise _stream_error(self.name, data["error"])
                    for choice in (data.get("choices") or [])[:1]:
                        content = _content_text((choice.get("delta") or {}).get("content"))
                        if content:
                            timer.reschedule(None)  # from here on, only silences longer than `timeout`
                            yield content
                        if choice.get("finish_reason"):
                            finished = True
        except TimeoutError as exc:
            if not timer.expired():
                raise LLMTransientError(f"{self.name}: stream from {self._url} broke: {exc!r}") from exc
            raise LLMTimeoutError(f"{self.name}: timed out: no first token within {first:g} s",
                                  phase="first_token", seconds=first) from exc
        except httpx.TimeoutException as exc:
            if not finished:
                raise self._timeout_error(exc, streaming=True) from exc
        except httpx.HTTPError as exc:
            if not finished:  # after finish_reason the answer is whole; a dropped [DONE] costs nothing
                raise LLMTransientError(f"{self.name}: stream from {self._url} broke: {exc!r}") from exc
        if not finished:
            raise LLMTransientError(f"{self.name}: stream from {self._url} ended before it was finished")

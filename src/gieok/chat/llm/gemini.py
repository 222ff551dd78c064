"""Gemini through Google's official `google-genai` SDK (async client, `client.aio`).

The SDK, not hand-written REST, because Google changes the request shape (thinking, thought
signatures, schema fields) faster than a private copy would follow. It is pointed at
`base_url` when one is given (a proxy, or a loopback server in the tests), so the SDK's real
request building, SSE parsing and error mapping are what runs.

Mapping to the `LLM` protocol:
- system messages become `system_instruction`; assistant is role "model"; a tool result is a
  `functionResponse` part in a user turn (consecutive results share one turn, as Gemini wants
  one response turn per call turn);
- `json_schema` → `response_mime_type="application/json"` + `response_json_schema` (full JSON
  Schema, unlike the OpenAPI subset of `response_schema`);
- tools → `function_declarations` with `parameters_json_schema`; calls come back as
  `ToolCall`s. Gemini may omit call ids, so missing ones are made up for the protocol (which
  needs them to pair results with calls) but never sent to Gemini: only ids Gemini issued go
  back, as it asks. Thinking models attach a `thought_signature` to each call that must be
  sent back with it (Gemini 3 refuses the next turn otherwise), so this client remembers, per
  call id, whether Gemini issued the id and the call's signature.

The SDK's own retries and automatic continuation / function calling are switched off: the
router owns retries, key rotation and failover, and two retry layers would multiply waits and
hide which key failed. Errors map to the kinds in `failures.py`; a 429's wait comes from the
Retry-After header or, as Gemini sends it, the `RetryInfo.retryDelay` of the error body.

Time limits are the same as for the OpenAI-compatible client (`LLMTimeoutError`): connect within
`connect_timeout`; a plain call's response headers within `first_token_timeout` of the start and
its whole answer within `timeout`; a stream's first text within `first_token_timeout`, then no
silence longer than `timeout`. The SDK sets one timeout on every request it builds, so an httpx
request hook puts the per-phase ones back, and a response hook sees a plain call's headers come.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from ...errors import LLMAuthError, LLMError, LLMTransientError
from .base import ChatMessage, ChatResponse, ToolCall, ToolSpec
from .failures import LLMTimeoutError, error_for_status, first_token_budget, parse_duration, parse_retry_after

__all__ = ["GeminiLLM", "IssuedCall", "to_gemini_contents"]

_DONE_REASONS = {"STOP", "MAX_TOKENS"}
_CALLS_KEPT = 512


class IssuedCall(NamedTuple):
    id_from_gemini: bool  # False: the id was made up here and must not be sent to Gemini
    signature: bytes | None  # the thought signature to send back with the call


def _transport_errors() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [httpx.HTTPError, TimeoutError, ConnectionError]
    try:  # the SDK's default HTTP backend is httpx2, a fork of httpx with its own exception types
        import httpx2

        found.append(httpx2.HTTPError)
    except ImportError:  # pragma: no cover - depends on the SDK's optional backend
        pass
    try:
        import aiohttp  # the SDK prefers aiohttp when it is installed

        found.append(aiohttp.ClientError)
    except ImportError:
        pass
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()


@dataclass
class _PlainCall:
    """A plain (non-streamed) call in flight: its deadline moves from the headers to the whole answer."""

    timer: asyncio.Timeout
    whole_at: float  # loop time by which the whole answer must be in
    answered: bool = False  # the response headers came


_PLAIN_CALL: ContextVar[_PlainCall | None] = ContextVar("gieok_gemini_plain_call", default=None)


async def _headers_arrived(response: httpx.Response) -> None:
    """httpx response hook: runs in the calling task once the headers are in, before the body."""
    call = _PLAIN_CALL.get()
    if call is not None and not call.answered:
        call.answered = True
        call.timer.reschedule(call.whole_at)


def _tool_response(content: str) -> dict[str, Any]:
    """Gemini wants a JSON object as a function's response; plain text is wrapped."""
    try:
        value = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return {"result": content}
    return value if isinstance(value, dict) else {"result": value}


def to_gemini_contents(messages: Sequence[ChatMessage], calls: Mapping[str, IssuedCall] | None = None,
                       ) -> tuple[str | None, list[types.Content]]:
    """(system instruction, contents) for a protocol conversation.

    `calls` describes the tool calls Gemini made earlier, by protocol id. An id is sent only if
    Gemini issued it; ids made up here or by another provider (after a failover) are not.
    """
    calls = calls or {}
    issued = {call_id for call_id, call in calls.items() if call.id_from_gemini}
    system: list[str] = []
    contents: list[types.Content] = []
    names_by_call: dict[str, str] = {}
    for message in messages:
        if message.role == "system":
            if message.content:
                system.append(message.content)
            continue
        if message.role == "tool":
            name = message.name or names_by_call.get(message.tool_call_id or "", "")
            part = types.Part(function_response=types.FunctionResponse(
                id=message.tool_call_id if message.tool_call_id in issued else None, name=name,
                response=_tool_response(message.content)))
            previous = contents[-1] if contents else None
            if previous is not None and previous.role == "user" and previous.parts and all(
                    p.function_response is not None for p in previous.parts):
                previous.parts.append(part)
            else:
                contents.append(types.Content(role="user", parts=[part]))
            continue
        parts: list[types.Part] = []
        if message.content:
            parts.append(types.Part(text=message.content))
        for call in message.tool_calls:
            names_by_call[call.id] = call.name
            parts.append(types.Part(
                function_call=types.FunctionCall(id=call.id if call.id in issued else None, name=call.name,
                                                 args=dict(call.arguments)),
                thought_signature=calls[call.id].signature if call.id in calls else None))
        if not parts:
            parts.append(types.Part(text=""))
        contents.append(types.Content(role="model" if message.role == "assistant" else "user", parts=parts))
    return ("\n\n".join(system) or None), contents


def _usage(metadata: types.GenerateContentResponseUsageMetadata | None) -> dict[str, int]:
    if metadata is None:
        return {}
    pairs = {"prompt_tokens": metadata.prompt_token_count, "completion_tokens": metadata.candidates_token_count,
             "total_tokens": metadata.total_token_count, "thoughts_tokens": metadata.thoughts_token_count}
    return {k: int(v) for k, v in pairs.items() if v is not None}


class GeminiLLM:
    """One Gemini model with one API key."""

    def __init__(self, model: str, api_key: str, *, base_url: str | None = None, api_version: str = "v1beta",
                 timeout: float = 60.0, connect_timeout: float | None = None,
                 first_token_timeout: float | None = None, provider: str = "gemini") -> None:
        """`timeout`: the whole answer (a plain call) or the longest silence (a stream);
        `connect_timeout` (default: `timeout`, at most 10 s) and `first_token_timeout` (default:
        `timeout`) bound the connection and the start of the answer, see the module docstring."""
        if not api_key:
            raise LLMAuthError("Gemini needs an API key: set GIEOK_GEMINI_API_KEYS")
        if min(timeout, connect_timeout or timeout, first_token_timeout or timeout) <= 0:
            raise ValueError("timeouts must be positive")
        self.model = model.removeprefix("models/")
        self.provider = provider
        self.name = f"{provider}:{self.model}"
        self._api_key = api_key
        self._base_url = base_url or None
        self._api_version = api_version
        self._timeout = timeout
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else min(timeout, 10.0)
        self.first_token_timeout = first_token_timeout if first_token_timeout is not None else timeout
        self._httpx_timeout = httpx.Timeout(timeout, connect=self.connect_timeout).as_dict()
        self._client: genai.Client | None = None
        self._http: httpx.AsyncClient | None = None
        self._client_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._calls: OrderedDict[str, IssuedCall] = OrderedDict()  # the latest tool calls Gemini made

    def _aio(self) -> Any:
        # An async HTTP client pools connections on the loop that first used it, so each running
        # loop gets its own (several asyncio.run calls in one process keep working). The SDK is
        # handed an httpx client that this class owns: an SDK-made one is closed by the SDK's
        # __del__ on whatever loop runs at that moment, which fails loudly once its loop is gone.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is None or self._client_loop() is not loop:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout, connect=self.connect_timeout),
                                           event_hooks={"request": [self._phase_timeouts],
                                                        "response": [_headers_arrived]})
            options = types.HttpOptions(base_url=self._base_url, api_version=self._api_version,
                                        timeout=max(1, int(self._timeout * 1000)), httpx_async_client=self._http,
                                        retry_options=types.HttpRetryOptions(attempts=1))
            self._client = genai.Client(api_key=self._api_key, vertexai=False, http_options=options)
            self._client_loop = weakref.ref(loop)
        return self._client.aio

    async def _phase_timeouts(self, request: httpx.Request) -> None:
        # the SDK passes one number (HttpOptions.timeout) for connect, read, write and pool alike
        request.extensions["timeout"] = dict(self._httpx_timeout)

    async def aclose(self) -> None:
        http, self._http, self._client = self._http, None, None
        if http is not None:
            with contextlib.suppress(RuntimeError):  # opened on a loop that is gone
                await http.aclose()

    def _config(self, system: str | None, *, json_schema: dict[str, Any] | None, tools: Sequence[ToolSpec] | None,
                temperature: float | None, max_tokens: int | None) -> types.GenerateContentConfig:
        return types.GenerateContentConfig(
            system_instruction=system,
            temperature=temperature,
            max_output_tokens=max_tokens,
            response_mime_type="application/json" if json_schema is not None else None,
            response_json_schema=json_schema,
            tools=[types.Tool(function_declarations=[
                types.FunctionDeclaration(name=t.name, description=t.description, parameters_json_schema=t.parameters)
                for t in tools])] if tools else None,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            automatic_continuation=False,
        )

    def _remember(self, call_id: str, call: IssuedCall) -> None:
        self._calls[call_id] = call
        self._calls.move_to_end(call_id)
        while len(self._calls) > _CALLS_KEPT:
            self._calls.popitem(last=False)

    def _error(self, exc: BaseException, *, streaming: bool = False) -> LLMError:
        """A failure below HTTP (connect, read, timeout): transient; a timeout says which phase."""
        kind = type(exc).__name__
        if "ConnectTimeout" in kind:
            return LLMTimeoutError(f"{self.name}: timed out: no connection within {self.connect_timeout:g} s",
                                   phase="connect", seconds=self.connect_timeout)
        if isinstance(exc, asyncio.TimeoutError) or "Timeout" in kind:
            what = "the stream" if streaming else "the answer"
            return LLMTimeoutError(f"{self.name}: timed out: {what} stalled for {self.timeout:g} s ({kind})",
                                   phase="stall", seconds=self.timeout)
        return LLMTransientError(f"{self.name}: request failed: {exc!r}")

    def _api_error(self, exc: genai_errors.APIError) -> LLMError:
        details = exc.details if isinstance(exc.details, dict) else {}
        body = details.get("error", details) if isinstance(details.get("error", details), dict) else {}
        details_value = body.get("details")
        detail_list = details_value if isinstance(details_value, list) else []
        message = str(exc.message or body.get("message") or exc)
        code = int(exc.code or 0)
        if code == 400 and any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID" for d in detail_list):
            return LLMAuthError(f"{self.name}: the API key was refused: {message[:200]}")
        retry_after = None
        headers = getattr(exc.response, "headers", None)
        if headers is not None:
            retry_after = parse_retry_after(headers.get("retry-after"))
        if retry_after is None:
            for item in detail_list:
                if isinstance(item, dict) and str(item.get("@type", "")).endswith("RetryInfo"):
                    retry_after = parse_duration(item.get("retryDelay"))
        return error_for_status(self.name, code or 500, f"{exc.status or ''} {message}".strip(),
                                retry_after=retry_after)

    def _parse(self, response: types.GenerateContentResponse) -> tuple[str, list[ToolCall], str | None]:
        """Text (thoughts left out), tool calls and finish reason of one response or chunk."""
        if not response.candidates:
            feedback = response.prompt_feedback
            if feedback is not None and feedback.block_reason:
                raise LLMError(f"{self.name}: the prompt was blocked ({feedback.block_reason})")
            return "", [], None
        candidate = response.candidates[0]
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in (candidate.content.parts if candidate.content and candidate.content.parts else []):
            if part.text and not part.thought:
                texts.append(part.text)
            if part.function_call is not None:
                call = part.function_call
                call_id = call.id or f"call_{uuid.uuid4().hex[:16]}"
                self._remember(call_id, IssuedCall(bool(call.id), part.thought_signature))
                calls.append(ToolCall(id=call_id, name=call.name or "", arguments=dict(call.args or {})))
        reason = candidate.finish_reason
        reason_name = reason.value if reason is not None and hasattr(reason, "value") else (
            str(reason) if reason else None)
        return "".join(texts), calls, reason_name

    async def chat(self, messages: Sequence[ChatMessage], *, json_schema: dict[str, Any] | None = None,
                   tools: Sequence[ToolSpec] | None = None, temperature: float | None = None,
                   max_tokens: int | None = None) -> ChatResponse:
        system, contents = to_gemini_contents(messages, self._calls)
        config = self._config(system, json_schema=json_schema, tools=tools, temperature=temperature,
                              max_tokens=max_tokens)
        first = first_token_budget(self.first_token_timeout, self.timeout)
        whole = max(first, self.timeout)
        aio = self._aio()  # building the SDK client is local work, not the provider's time
        call = _PlainCall(asyncio.timeout(first), asyncio.get_running_loop().time() + whole)
        token = _PLAIN_CALL.set(call)
        try:
            async with call.timer:
                response = await aio.models.generate_content(model=self.model, contents=contents, config=config)
        except genai_errors.APIError as exc:
            raise self._api_error(exc) from exc
        except _TRANSPORT_ERRORS as exc:
            if call.timer.expired() and call.answered:
                raise LLMTimeoutError(f"{self.name}: timed out: the answer took longer than {whole:g} s",
                                      phase="total", seconds=whole) from exc
            if call.timer.expired():
                raise LLMTimeoutError(f"{self.name}: timed out: no response within {first:g} s",
                                      phase="first_token", seconds=first) from exc
            raise self._error(exc) from exc
        finally:
            _PLAIN_CALL.reset(token)
        text, calls, reason = self._parse(response)
        if not text and not calls and reason not in _DONE_REASONS:
            raise LLMError(f"{self.name}: no answer (finish reason {reason or 'none'})")
        return ChatResponse(text=text, tool_calls=calls, model=response.model_version or self.model,
                            provider=self.provider, usage=_usage(response.usage_metadata))

    async def stream(self, messages: Sequence[ChatMessage], *, temperature: float | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[str]:
        system, contents = to_gemini_contents(messages, self._calls)
        config = self._config(system, json_schema=None, tools=None, temperature=temperature, max_tokens=max_tokens)
        finish: str | None = None
        first = first_token_budget(self.first_token_timeout, self.timeout)
        aio = self._aio()
        timer = asyncio.timeout(first)  # until the first text; lifted before it is yielded
        try:
            async with timer:
                chunks = await aio.models.generate_content_stream(model=self.model, contents=contents,
                                                                   config=config)
                async for chunk in chunks:
                    text, _, reason = self._parse(chunk)
                    if text:
                        timer.reschedule(None)  # from here on, only silences longer than `timeout`
                        yield text
                    finish = reason or finish
        except genai_errors.APIError as exc:
            raise self._api_error(exc) from exc
        except _TRANSPORT_ERRORS as exc:
            if timer.expired() and finish is None:
                raise LLMTimeoutError(f"{self.name}: timed out: no first token within {first:g} s",
                                      phase="first_token", seconds=first) from exc
            if finish is None:
                raise self._error(exc, streaming=True) from exc
        if finish is None:  # an SSE stream that just stops was cut, not finished
            raise LLMTransientError(f"{self.name}: stream ended before a finish reason")
        if finish not in _DONE_REASONS and finish != "FINISH_REASON_UNSPECIFIED":
            raise LLMError(f"{self.name}: stream stopped early (finish reason {finish})")

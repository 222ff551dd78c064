"""The OpenAI-compatible client against a loopback server speaking `/v1/chat/completions`."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gieok.chat.llm import ChatMessage, ToolCall, ToolSpec
from gieok.chat.llm.failures import LLMTimeoutError, first_token_budget, last_resort
from gieok.chat.llm.openai_compat import OpenAICompatLLM
from gieok.errors import LLMAuthError, LLMError, LLMOutputError, LLMRateLimitError, LLMTransientError
from llm_servers import (
    LLMServer,
    Reply,
    blackhole,
    no_proxy,
    openai_chunks,
    openai_completion,
    openai_error,
    run,
    serve,
    track,
)

SCHEMA = {"title": "Reply plan!", "type": "object", "properties": {"respond": {"type": "boolean"}},
          "required": ["respond"], "additionalProperties": False}
WEATHER = ToolSpec("get_weather", "Current weather of a city",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    no_proxy(monkeypatch)
    with serve() as state:
        yield state


def client(server: LLMServer, **options: Any) -> OpenAICompatLLM:
    return track(OpenAICompatLLM("qwen2.5:7b", f"{server.url}/v1/", options.pop("api_key", "sk-test"), **options))


async def collect(stream: AsyncIterator[str], into: list[str] | None = None) -> list[str]:
    pieces = [] if into is None else into
    async for piece in stream:
        pieces.append(piece)
    return pieces


def test_plain_chat_wire_format(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion("안녕! 반가워.")))
    llm = client(server)
    messages = [ChatMessage("system", "You are 누리."), ChatMessage("user", "안녕?")]
    response = run(llm.chat(messages, temperature=0.3, max_tokens=64))

    assert llm.name == "openai:qwen2.5:7b"
    assert (response.text, response.provider, response.model) == ("안녕! 반가워.", "openai", "test-model")
    assert response.tool_calls == [] and response.usage == {"prompt_tokens": 11, "completion_tokens": 7,
                                                            "total_tokens": 18}
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {"model": "qwen2.5:7b", "temperature": 0.3, "max_tokens": 64,
                            "messages": [{"role": "system", "content": "You are 누리."},
                                         {"role": "user", "content": "안녕?"}]}


def test_local_server_without_key_gets_no_authorization(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion("ok")))
    run(client(server, api_key="").chat([ChatMessage("user", "hi")]))
    assert "authorization" not in server.requests[0].headers
    assert "temperature" not in server.requests[0].body  # nothing is sent that was not asked for


def test_json_schema_is_sent_as_response_format(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion('{"respond": true}')))
    response = run(client(server).chat([ChatMessage("user", "should you answer?")], json_schema=SCHEMA))
    assert json.loads(response.text) == {"respond": True}
    body = server.requests[0].body
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "Reply_plan_", "schema": SCHEMA, "strict": True}}
    assert body["messages"] == [{"role": "user", "content": "should you answer?"}]


@pytest.mark.parametrize("mode", ["json_object", "prompt"])
def test_json_fallback_modes_put_the_schema_in_the_prompt(server: LLMServer, mode: str) -> None:
    server.push(Reply(body=openai_completion('{"respond": false}')))
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "q")]
    run(client(server, json_mode=mode).chat(messages, json_schema=SCHEMA))
    body = server.requests[0].body
    if mode == "json_object":
        assert body["response_format"] == {"type": "json_object"}
    else:
        assert "response_format" not in body
    system = body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    assert json.dumps(SCHEMA, ensure_ascii=False) in system["content"]  # schema merged into the first system turn
    assert len(body["messages"]) == 2


def test_tool_call_round_trip(server: LLMServer) -> None:
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "서울"}, ensure_ascii=False)}}
    server.push(Reply(body=openai_completion(None, tool_calls=[call])),
                Reply(body=openai_completion("서울은 맑아요.")))
    llm = client(server)

    async def conversation() -> tuple[Any, Any]:
        history = [ChatMessage("user", "서울 날씨 어때?")]
        first = await llm.chat(history, tools=[WEATHER])
        history += [ChatMessage("assistant", first.text, tool_calls=tuple(first.tool_calls)),
                    ChatMessage("tool", '{"sky": "clear"}', tool_call_id=first.tool_calls[0].id, name="get_weather")]
        return first, await llm.chat(history, tools=[WEATHER])

    first, second = run(conversation())
    assert first.text == "" and first.tool_calls == [ToolCall("call_abc", "get_weather", {"city": "서울"})]
    assert second.text == "서울은 맑아요."
    assert server.requests[0].body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER.parameters}}]
    sent = server.requests[1].body["messages"]
    assert sent[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "서울"}'}}]}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_abc", "content": '{"sky": "clear"}'}


def test_tolerant_tool_call_parsing(server: LLMServer) -> None:
    # Ollama sends arguments as an object and may leave the id out
    server.push(Reply(body=openai_completion("", tool_calls=[{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Busan"}}}])),
                Reply(body=openai_completion("", tool_calls=[{"id": "x", "function": {"name": "get_weather",
                                                                                     "arguments": "{not json"}}])))
    llm = client(server)
    first = run(llm.chat([ChatMessage("user", "q")], tools=[WEATHER]))
    assert first.tool_calls == [ToolCall("call_0", "get_weather", {"city": "Busan"})]
    with pytest.raises(LLMOutputError, match="not JSON"):
        run(llm.chat([ChatMessage("user", "q")], tools=[WEATHER]))


def test_sse_stream(server: LLMServer) -> None:
    events = openai_chunks(["누리", "예요", ", 반가워요!"])
    events.insert(1, ": OPENROUTER PROCESSING")  # comments between events are skipped
    server.push(Reply(events=events))
    pieces = run(collect(client(server).stream([ChatMessage("user", "자기소개")], max_tokens=20)))
    assert pieces == ["누리", "예요", ", 반가워요!"]
    assert server.requests[0].body["stream"] is True and server.requests[0].body["max_tokens"] == 20


def test_stream_cut_midway_is_transient_after_the_delivered_pieces(server: LLMServer) -> None:
    server.push(Reply(events=openai_chunks(["one ", "two ", "three"]), cut_after=3))
    pieces: list[str] = []
    with pytest.raises(LLMTransientError, match=r"broke|ended"):
        run(collect(client(server).stream([ChatMessage("user", "count")]), pieces))
    assert pieces == ["one ", "two "]


def test_stream_closed_cleanly_without_done_is_transient(server: LLMServer) -> None:
    server.push(Reply(events=openai_chunks(["half an answer"], done=False)))
    pieces: list[str] = []
    with pytest.raises(LLMTransientError, match="before it was finished"):
        run(collect(client(server).stream([ChatMessage("user", "q")]), pieces))
    assert pieces == ["half an answer"]


@pytest.mark.parametrize(("error", "kind"), [({"code": 429, "message": "slow down"}, LLMRateLimitError),
                                             ({"code": "rate_limit_exceeded", "message": "x"}, LLMRateLimitError),
                                             ({"code": 502, "message": "upstream"}, LLMTransientError),
                                             ({"message": "server_error"}, LLMTransientError)])
def test_error_event_inside_a_stream(server: LLMServer, error: dict[str, Any], kind: type[LLMError]) -> None:
    events = [*openai_chunks(["partial"], done=False), json.dumps({"error": error})]
    server.push(Reply(events=events))
    with pytest.raises(kind):
        run(collect(client(server).stream([ChatMessage("user", "q")])))


@pytest.mark.parametrize(("status", "kind"), [(429, LLMRateLimitError), (500, LLMTransientError),
                                              (503, LLMTransientError), (401, LLMAuthError),
                                              (403, LLMAuthError), (400, LLMError), (404, LLMError)])
@pytest.mark.parametrize("streaming", [False, True])
def test_http_errors_are_sorted(server: LLMServer, status: int, kind: type[LLMError], streaming: bool) -> None:
    server.push(Reply(status, openai_error(status, "bad things")))
    llm = client(server)
    with pytest.raises(kind, match=f"HTTP {status}") as info:
        if streaming:
            run(collect(llm.stream([ChatMessage("user", "q")])))
        else:
            run(llm.chat([ChatMessage("user", "q")]))
    if kind is LLMError:  # a bad request is nobody's transient trouble: not retried, not a key problem
        assert not isinstance(info.value, (LLMTransientError, LLMRateLimitError, LLMAuthError))


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), ("0.5", 0.5), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
                                                 (None, None)])
def test_retry_after_header_is_read(server: LLMServer, header: str | None, seconds: float | None) -> None:
    server.push(Reply(429, openai_error(429), headers={"Retry-After": header} if header else {}))
    with pytest.raises(LLMRateLimitError) as info:
        run(client(server).chat([ChatMessage("user", "q")]))
    assert info.value.retry_after == seconds  # an HTTP date in the past means: now


def test_timeout_and_unreachable_are_transient(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion("late"), delay=1.0))
    with pytest.raises(LLMTimeoutError, match="timed out"):
        run(client(server, timeout=0.2).chat([ChatMessage("user", "q")]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = track(OpenAICompatLLM("m", f"http://127.0.0.1:{port}/v1"))
    with pytest.raises(LLMTransientError, match="failed"):
        run(gone.chat([ChatMessage("user", "q")]))


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_one_client_serves_several_event_loops(server: LLMServer) -> None:
    server.push(*[Reply(body=openai_completion(f"answer {i}")) for i in range(3)])
    llm = OpenAICompatLLM("qwen2.5:7b", f"{server.url}/v1/", "sk-test")  # not tracked: gc closes it

    async def ask(close: bool) -> str:
        try:
            return (await llm.chat([ChatMessage("user", "q")])).text
        finally:
            if close:
                await llm.aclose()

    # asyncio.run per call, as a CLI does: pooled sockets of a closed loop are not reused
    assert [asyncio.run(ask(close=i == 2)) for i in range(3)] == [f"answer {i}" for i in range(3)]
    gc.collect()  # the clients dropped with their loops are reclaimed here, not during a later test


def test_error_message_is_taken_from_the_body(server: LLMServer) -> None:
    server.push(Reply(404, openai_error(404, "model 'qwen9' not found, try pulling it first")))
    with pytest.raises(LLMError) as info:
        run(client(server).chat([ChatMessage("user", "q")]))
    assert str(info.value) == "openai:qwen2.5:7b: HTTP 404: model 'qwen9' not found, try pulling it first"


def test_bad_response_shape_is_an_error(server: LLMServer) -> None:
    server.push(Reply(body={"unexpected": True}))
    with pytest.raises(LLMError, match="unexpected response"):
        run(client(server).chat([ChatMessage("user", "q")]))


# -- time limits: connect, first token, silence -------------------------------------------------

def timed(awaitable: Any) -> tuple[Any, float]:
    """`run`, and how long it took (seconds); an exception comes back as the result."""
    start = time.monotonic()
    try:
        result = run(awaitable)
    except Exception as exc:  # the tests below look at the exception and the time together
        result = exc
    return result, time.monotonic() - start


def test_a_server_that_never_answers_times_out_at_the_first_token_limit(server: LLMServer) -> None:
    server.push(Reply(hang=True))
    error, took = timed(client(server, timeout=30.0, first_token_timeout=0.4).chat([ChatMessage("user", "q")]))
    assert isinstance(error, LLMTimeoutError) and isinstance(error, LLMTransientError)
    assert (error.phase, error.seconds) == ("first_token", 0.4)
    assert str(error) == "openai:qwen2.5:7b: timed out: no response within 0.4 s"
    assert 0.35 < took < 2.0  # not the 30 s of the whole-answer limit


def test_a_plain_call_whose_headers_came_gets_the_whole_answer_limit(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion("never sent"), stall_after=0))  # headers, then nothing
    error, took = timed(client(server, timeout=0.9, first_token_timeout=0.3).chat([ChatMessage("user", "q")]))
    assert isinstance(error, LLMTimeoutError)
    assert error.phase in ("total", "stall") and error.seconds == 0.9
    assert 0.8 < took < 3.0  # the headers moved the deadline from 0.3 s to the whole answer's 0.9 s


def test_stream_first_token_ignores_keepalives_and_empty_chunks(server: LLMServer) -> None:
    events = openai_chunks(["late"])  # a role-only chunk first, then a keep-alive comment, then silence
    events.insert(1, ": OPENROUTER PROCESSING")
    server.push(Reply(events=events, stall_after=2))
    pieces: list[str] = []
    error, took = timed(collect(client(server, timeout=30.0, first_token_timeout=0.4)
                                .stream([ChatMessage("user", "q")]), pieces))
    assert isinstance(error, LLMTimeoutError) and error.phase == "first_token"
    assert str(error) == "openai:qwen2.5:7b: timed out: no first token within 0.4 s"
    assert pieces == [] and 0.35 < took < 2.0


def test_a_steady_stream_may_outlast_the_first_token_limit(server: LLMServer) -> None:
    server.push(Reply(events=openai_chunks([f"{i} " for i in range(6)]), pace=0.1))  # ~0.8 s in all
    pieces = run(collect(client(server, timeout=5.0, first_token_timeout=0.3).stream([ChatMessage("user", "q")])))
    assert "".join(pieces) == "0 1 2 3 4 5 "


def test_a_stream_that_goes_silent_after_text_is_a_stall(server: LLMServer) -> None:
    server.push(Reply(events=openai_chunks(["one ", "two ", "three"]), stall_after=3))
    pieces: list[str] = []
    error, took = timed(collect(client(server, timeout=0.5, first_token_timeout=0.3)
                                .stream([ChatMessage("user", "q")]), pieces))
    assert isinstance(error, LLMTimeoutError) and (error.phase, error.seconds) == ("stall", 0.5)
    assert "stream stalled for 0.5 s" in str(error)
    assert pieces == ["one ", "two "] and 0.45 < took < 2.5


@pytest.mark.parametrize("streaming", [False, True])
def test_connect_timeout(monkeypatch: pytest.MonkeyPatch, streaming: bool) -> None:
    no_proxy(monkeypatch)
    with blackhole() as url:
        llm = track(OpenAICompatLLM("m", f"{url}/v1", timeout=30.0, connect_timeout=0.3, first_token_timeout=10.0))
        call = collect(llm.stream([ChatMessage("user", "q")])) if streaming else llm.chat([ChatMessage("user", "q")])
        error, took = timed(call)
    assert isinstance(error, LLMTimeoutError) and (error.phase, error.seconds) == ("connect", 0.3)
    assert str(error).startswith(f"openai:m: timed out: no connection to {url}/v1 within 0.3 s")
    assert 0.25 < took < 2.0


def test_as_last_resort_the_first_token_wait_grows_to_the_whole_answer_limit(server: LLMServer) -> None:
    server.push(Reply(body=openai_completion("slow but here"), delay=0.6))
    llm = client(server, timeout=3.0, first_token_timeout=0.2)

    async def patiently() -> str:
        with last_resort():
            return (await llm.chat([ChatMessage("user", "q")])).text

    assert run(patiently()) == "slow but here"
    assert first_token_budget(0.2, 3.0) == 0.2  # outside the block: the short limit again


def test_timeouts_default_to_the_whole_answer_limit() -> None:
    llm = OpenAICompatLLM("m", "http://127.0.0.1:1/v1", timeout=30.0)
    assert (llm.timeout, llm.connect_timeout, llm.first_token_timeout) == (30.0, 10.0, 30.0)
    with pytest.raises(ValueError, match="positive"):
        OpenAICompatLLM("m", "http://127.0.0.1:1/v1", first_token_timeout=-1.0)

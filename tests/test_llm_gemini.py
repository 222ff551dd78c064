"""Gemini through the real google-genai SDK, pointed at a loopback server speaking the REST API.

The SDK builds the requests (`/v1beta/models/{model}:generateContent`,
`:streamGenerateContent?alt=sse`, `x-goog-api-key`, camelCase JSON) and parses the answers;
these tests pin what goes over the wire and how each answer maps back to the protocol.
"""

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
from gieok.chat.llm.failures import LLMTimeoutError, last_resort
from gieok.chat.llm.gemini import GeminiLLM
from gieok.errors import LLMAuthError, LLMError, LLMRateLimitError, LLMTransientError
from llm_servers import (
    LLMServer,
    Reply,
    blackhole,
    gemini_chunks,
    gemini_error,
    gemini_response,
    no_proxy,
    run,
    serve,
    track,
)

MODEL = "gemini-2.5-flash"
CHAT_PATH = f"/v1beta/models/{MODEL}:generateContent"
STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
SCHEMA = {"type": "object", "properties": {"respond": {"type": "boolean"}, "reason": {"type": "string"}},
          "required": ["respond"]}
WEATHER = ToolSpec("get_weather", "Current weather of a city",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
RETRY_INFO = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    no_proxy(monkeypatch)
    with serve() as state:
        yield state


def client(server: LLMServer, **options: Any) -> GeminiLLM:
    return track(GeminiLLM(options.pop("model", MODEL), options.pop("api_key", "g-key-1"), base_url=server.url,
                           **options))


async def collect(stream: AsyncIterator[str], into: list[str] | None = None) -> list[str]:
    pieces = [] if into is None else into
    async for piece in stream:
        pieces.append(piece)
    return pieces


def function_declarations(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for tool in body["tools"] for d in tool["functionDeclarations"]]


def test_plain_chat_wire_format(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response("나는 누리야.")))
    llm = client(server, model=f"models/{MODEL}")
    messages = [ChatMessage("system", "너는 누리야."), ChatMessage("system", "반말로 답해."),
                ChatMessage("user", "너 누구야?"), ChatMessage("assistant", "음?"), ChatMessage("user", "이름!")]
    response = run(llm.chat(messages, temperature=0.4, max_tokens=128))

    assert llm.name == f"gemini:{MODEL}"  # "models/" prefix accepted and dropped
    assert (response.text, response.provider, response.model) == ("나는 누리야.", "gemini", "gemini-test-001")
    assert response.usage == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    request = server.requests[0]
    assert request.path == CHAT_PATH
    assert request.headers["x-goog-api-key"] == "g-key-1"
    body = request.body
    assert body["systemInstruction"]["parts"] == [{"text": "너는 누리야.\n\n반말로 답해."}]
    assert [(c["role"], c["parts"]) for c in body["contents"]] == [
        ("user", [{"text": "너 누구야?"}]), ("model", [{"text": "음?"}]), ("user", [{"text": "이름!"}])]
    assert body["generationConfig"] == {"temperature": 0.4, "maxOutputTokens": 128}
    assert "tools" not in body


def test_json_schema_goes_into_generation_config(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response('{"respond": true, "reason": "asked"}')))
    response = run(client(server).chat([ChatMessage("user", "답할까?")], json_schema=SCHEMA))
    assert json.loads(response.text) == {"respond": True, "reason": "asked"}
    config = server.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == SCHEMA


def test_tool_call_round_trip_keeps_ids_and_thought_signatures(server: LLMServer) -> None:
    calls = [{"functionCall": {"id": "fc-1", "name": "get_weather", "args": {"city": "서울"}},
              "thoughtSignature": "c2lnLTE="},
             {"functionCall": {"name": "get_weather", "args": {"city": "부산"}},  # Gemini may omit the id
              "thoughtSignature": "c2lnLTI="}]
    server.push(Reply(body=gemini_response("날씨를 볼게.", calls=calls)), Reply(body=gemini_response("둘 다 맑아.")))
    llm = client(server)

    async def conversation() -> tuple[Any, Any]:
        history = [ChatMessage("user", "서울이랑 부산 날씨?")]
        first = await llm.chat(history, tools=[WEATHER])
        history.append(ChatMessage("assistant", first.text, tool_calls=tuple(first.tool_calls)))
        history += [ChatMessage("tool", json.dumps({"sky": "clear"}), tool_call_id=call.id)
                    for call in first.tool_calls]  # no name: found through the call id
        return first, await llm.chat(history, tools=[WEATHER])

    first, second = run(conversation())
    assert first.text == "날씨를 볼게."
    assert first.tool_calls[0] == ToolCall("fc-1", "get_weather", {"city": "서울"})
    made_up = first.tool_calls[1]
    assert made_up.name == "get_weather" and made_up.arguments == {"city": "부산"} and made_up.id
    assert second.text == "둘 다 맑아."

    declarations = function_declarations(server.requests[0].body)
    assert len(declarations) == 1 and declarations[0]["name"] == "get_weather"
    assert declarations[0]["description"] == "Current weather of a city"
    sent_schema = declarations[0].get("parametersJsonSchema", declarations[0].get("parameters_json_schema"))
    assert sent_schema == WEATHER.parameters

    contents = server.requests[1].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    model_parts = contents[1]["parts"]
    assert model_parts[0] == {"text": "날씨를 볼게."}
    assert model_parts[1]["functionCall"] == {"id": "fc-1", "name": "get_weather", "args": {"city": "서울"}}
    assert model_parts[1]["thoughtSignature"] == "c2lnLTE="  # sent back, as Gemini 3 requires
    assert model_parts[2]["functionCall"] == {"name": "get_weather", "args": {"city": "부산"}}  # made-up id: not sent
    assert model_parts[2]["thoughtSignature"] == "c2lnLTI="  # ... but its signature is
    responses = [p["functionResponse"] for p in contents[2]["parts"]]  # both results in one turn
    assert responses == [{"id": "fc-1", "name": "get_weather", "response": {"sky": "clear"}},
                         {"name": "get_weather", "response": {"sky": "clear"}}]


def test_plain_text_tool_result_is_wrapped(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response("ok")))
    messages = [ChatMessage("user", "q"),
                ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "lookup", {}),)),
                ChatMessage("tool", "no results", tool_call_id="t1", name="lookup")]
    run(client(server).chat(messages))
    part = server.requests[0].body["contents"][2]["parts"][0]
    assert part["functionResponse"]["response"] == {"result": "no results"}


def test_thoughts_are_not_part_of_the_answer(server: LLMServer) -> None:
    body = gemini_response(None, calls=[{"text": "let me think...", "thought": True}, {"text": "42"}])
    server.push(Reply(body=body))
    assert run(client(server).chat([ChatMessage("user", "q")])).text == "42"


def test_sse_stream(server: LLMServer) -> None:
    server.push(Reply(events=gemini_chunks(["누리", "예요", ", 반가워요!"])))
    pieces = run(collect(client(server).stream([ChatMessage("user", "자기소개")], temperature=0.9)))
    assert pieces == ["누리", "예요", ", 반가워요!"]
    request = server.requests[0]
    assert request.path == STREAM_PATH
    assert request.body["generationConfig"] == {"temperature": 0.9}


def test_stream_cut_midway_is_transient_after_the_delivered_pieces(server: LLMServer) -> None:
    server.push(Reply(events=gemini_chunks(["one ", "two ", "three"]), cut_after=2))
    pieces: list[str] = []
    with pytest.raises(LLMTransientError):
        run(collect(client(server).stream([ChatMessage("user", "count")]), pieces))
    assert pieces == ["one ", "two "]


def test_stream_without_finish_reason_is_transient(server: LLMServer) -> None:
    events = [json.dumps(gemini_response("half", finish=None))]
    server.push(Reply(events=events))
    with pytest.raises(LLMTransientError, match="finish reason"):
        run(collect(client(server).stream([ChatMessage("user", "q")])))


def test_error_event_inside_a_stream(server: LLMServer) -> None:
    events = [json.dumps(gemini_response("partial", finish=None)),
              json.dumps(gemini_error(503, "overloaded", state="UNAVAILABLE"))]
    server.push(Reply(events=events))
    pieces: list[str] = []
    with pytest.raises(LLMTransientError, match="503"):
        run(collect(client(server).stream([ChatMessage("user", "q")]), pieces))
    assert pieces == ["partial"]


def test_rate_limit_reads_retry_delay_from_the_error_body(server: LLMServer) -> None:
    server.push(Reply(429, gemini_error(429, "Quota exceeded", state="RESOURCE_EXHAUSTED", details=[RETRY_INFO])),
                Reply(429, gemini_error(429, "Quota exceeded", state="RESOURCE_EXHAUSTED", details=[RETRY_INFO]),
                      headers={"Retry-After": "5"}),
                Reply(429, gemini_error(429, "Quota exceeded", state="RESOURCE_EXHAUSTED")))
    llm = client(server)
    seen = []
    for _ in range(3):
        with pytest.raises(LLMRateLimitError, match="RESOURCE_EXHAUSTED") as info:
            run(llm.chat([ChatMessage("user", "q")]))
        seen.append(info.value.retry_after)
    assert seen == [37.0, 5.0, None]  # body's retryDelay; the header when present; else unknown


def test_rate_limit_on_a_stream(server: LLMServer) -> None:
    server.push(Reply(429, gemini_error(429, "Quota exceeded", state="RESOURCE_EXHAUSTED", details=[RETRY_INFO])))
    with pytest.raises(LLMRateLimitError) as info:
        run(collect(client(server).stream([ChatMessage("user", "q")])))
    assert info.value.retry_after == 37.0


@pytest.mark.parametrize(("status", "details", "kind"), [
    (400, [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}], LLMAuthError),
    (403, [], LLMAuthError), (500, [], LLMTransientError), (503, [], LLMTransientError), (400, [], LLMError)])
def test_http_errors_are_sorted(server: LLMServer, status: int, details: list[Any], kind: type[LLMError]) -> None:
    server.push(Reply(status, gemini_error(status, "bad things", details=details)))
    with pytest.raises(kind) as info:
        run(client(server).chat([ChatMessage("user", "q")]))
    if kind is LLMError:
        assert not isinstance(info.value, (LLMTransientError, LLMRateLimitError, LLMAuthError))


def test_timeout_and_unreachable_are_transient(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response("late"), delay=1.0))
    with pytest.raises(LLMTimeoutError, match="timed out"):
        run(client(server, timeout=0.2).chat([ChatMessage("user", "q")]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = track(GeminiLLM(MODEL, "k", base_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(LLMTransientError, match="request failed"):
        run(gone.chat([ChatMessage("user", "q")]))


def test_blocked_prompt_is_an_error(server: LLMServer) -> None:
    server.push(Reply(body={"promptFeedback": {"blockReason": "SAFETY"}}))
    with pytest.raises(LLMError, match="blocked"):
        run(client(server).chat([ChatMessage("user", "q")]))


def test_no_key_is_refused_before_any_request(server: LLMServer) -> None:
    with pytest.raises(LLMAuthError, match="API key"):
        GeminiLLM(MODEL, "", base_url=server.url)
    assert server.requests == []


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_one_client_serves_several_event_loops(server: LLMServer) -> None:
    server.push(*[Reply(body=gemini_response(f"answer {i}")) for i in range(2)])
    llm = GeminiLLM(MODEL, "g-key-1", base_url=server.url)  # not tracked: gc closes it

    async def ask(close: bool) -> str:
        try:
            return (await llm.chat([ChatMessage("user", "q")])).text
        finally:
            if close:
                await llm.aclose()

    # asyncio.run per call, as a CLI does: the client of a closed loop is replaced, not reused
    assert [asyncio.run(ask(close=i == 1)) for i in range(2)] == [f"answer {i}" for i in range(2)]
    gc.collect()  # the clients dropped with their loops are reclaimed here, not during a later test


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
    assert str(error) == f"gemini:{MODEL}: timed out: no response within 0.4 s"
    assert 0.35 < took < 2.0


def test_a_plain_call_whose_headers_came_gets_the_whole_answer_limit(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response("never sent"), stall_after=0))  # headers, then nothing
    error, took = timed(client(server, timeout=0.9, first_token_timeout=0.3).chat([ChatMessage("user", "q")]))
    assert isinstance(error, LLMTimeoutError)
    assert error.phase in ("total", "stall") and error.seconds == 0.9
    assert 0.8 < took < 3.0  # the response hook moved the deadline from 0.3 s to the whole answer's 0.9 s


def test_stream_headers_then_silence_times_out_at_the_first_token_limit(server: LLMServer) -> None:
    server.push(Reply(events=gemini_chunks(["late"]), stall_after=0))
    pieces: list[str] = []
    error, took = timed(collect(client(server, timeout=30.0, first_token_timeout=0.4)
                                .stream([ChatMessage("user", "q")]), pieces))
    assert isinstance(error, LLMTimeoutError) and error.phase == "first_token"
    assert str(error) == f"gemini:{MODEL}: timed out: no first token within 0.4 s"
    assert pieces == [] and 0.35 < took < 2.0


def test_a_steady_stream_may_outlast_the_first_token_limit(server: LLMServer) -> None:
    server.push(Reply(events=gemini_chunks([f"{i} " for i in range(6)]), pace=0.1))  # ~0.6 s in all
    pieces = run(collect(client(server, timeout=5.0, first_token_timeout=0.3).stream([ChatMessage("user", "q")])))
    assert "".join(pieces) == "0 1 2 3 4 5 "


def test_a_stream_that_goes_silent_after_text_is_a_stall(server: LLMServer) -> None:
    server.push(Reply(events=gemini_chunks(["one ", "two ", "three"]), stall_after=2))
    pieces: list[str] = []
    error, took = timed(collect(client(server, timeout=0.5, first_token_timeout=0.3)
                                .stream([ChatMessage("user", "q")]), pieces))
    assert isinstance(error, LLMTimeoutError) and (error.phase, error.seconds) == ("stall", 0.5)
    assert pieces == ["one ", "two "] and 0.45 < took < 2.5


@pytest.mark.parametrize("streaming", [False, True])
def test_connect_timeout_is_its_own_despite_the_sdk_single_timeout(monkeypatch: pytest.MonkeyPatch,
                                                                   streaming: bool) -> None:
    no_proxy(monkeypatch)
    with blackhole() as url:
        llm = track(GeminiLLM(MODEL, "k", base_url=url, timeout=30.0, connect_timeout=0.3, first_token_timeout=10.0))
        call = collect(llm.stream([ChatMessage("user", "q")])) if streaming else llm.chat([ChatMessage("user", "q")])
        error, took = timed(call)
    assert isinstance(error, LLMTimeoutError) and (error.phase, error.seconds) == ("connect", 0.3)
    assert str(error) == f"gemini:{MODEL}: timed out: no connection within 0.3 s"
    assert 0.25 < took < 2.0


def test_as_last_resort_the_first_token_wait_grows_to_the_whole_answer_limit(server: LLMServer) -> None:
    server.push(Reply(body=gemini_response("slow but here"), delay=0.6))
    llm = client(server, timeout=3.0, first_token_timeout=0.2)

    async def patiently() -> str:
        with last_resort():
            return (await llm.chat([ChatMessage("user", "q")])).text

    assert run(patiently()) == "slow but here"
    assert server.requests[0].headers.get("x-server-timeout") == "3"  # the SDK tells Google the whole limit

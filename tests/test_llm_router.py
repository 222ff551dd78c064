"""The router over real provider clients and loopback servers, on a virtual clock.

Nothing sleeps for real: the router's `clock` and `sleep` are a `VirtualTime`, so cooldowns
are crossed by moving the clock and backoff waits are recorded instead of waited.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from gieok.chat.llm import LLM, ChatMessage, ToolSpec, create_llm
from gieok.chat.llm.failures import LLMTimeoutError
from gieok.chat.llm.gemini import GeminiLLM
from gieok.chat.llm.openai_compat import OpenAICompatLLM
from gieok.chat.llm.router import CONTINUE_INSTRUCTION, LLMRouter, ResumeFilter, Route, continuation_messages
from gieok.chat.settings import ChatSettings, parse_chain
from gieok.errors import ConfigError, LLMError, LLMUnavailableError
from llm_servers import (
    LLMServer,
    Reply,
    blackhole,
    gemini_chunks,
    gemini_error,
    gemini_response,
    no_proxy,
    openai_chunks,
    openai_completion,
    openai_error,
    run,
    serve,
    track,
)

QUESTION = [ChatMessage("system", "You are 누리."), ChatMessage("user", "Tell me something.")]
WALL = 1_700_000_000.0


class VirtualTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL + self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def vt() -> VirtualTime:
    return VirtualTime()


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LLMServer, LLMServer]]:
    no_proxy(monkeypatch)
    with ExitStack() as stack:
        yield stack.enter_context(serve()), stack.enter_context(serve())


def openai_route(server: LLMServer | str, keys: list[str], label: str = "openai:local", **timeouts: float) -> Route:
    url = server if isinstance(server, str) else server.url
    return Route(label, [track(OpenAICompatLLM("local", f"{url}/v1", key, **timeouts)) for key in keys])


def gemini_route(server: LLMServer | str, keys: list[str], model: str = "gemini-2.5-flash",
                 **timeouts: float) -> Route:
    url = server if isinstance(server, str) else server.url
    return Route(f"gemini:{model}", [track(GeminiLLM(model, key, base_url=url, **timeouts)) for key in keys])


def router(vt: VirtualTime, *routes: Route, **options: Any) -> LLMRouter:
    options.setdefault("max_retries", 2)
    options.setdefault("backoff_seconds", 0.5)
    options.setdefault("cooldown_seconds", 60.0)
    return LLMRouter(list(routes), clock=vt.clock, wall_clock=vt.wall, sleep=vt.sleep, **options)


def used_keys(server: LLMServer) -> list[str]:
    """Which key each request carried (OpenAI bearer or Gemini header)."""
    keys = []
    for r in server.requests:
        keys.append(r.headers.get("x-goog-api-key") or r.headers.get("authorization", "").removeprefix("Bearer "))
    return keys


async def collect(stream: AsyncIterator[str], into: list[str] | None = None) -> list[str]:
    pieces = [] if into is None else into
    async for piece in stream:
        pieces.append(piece)
    return pieces


def test_router_is_an_llm(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    r = router(vt, openai_route(servers[0], ["k1"]), gemini_route(servers[1], ["g1"]))
    assert isinstance(r, LLM)
    assert r.name == "router(openai:local > gemini:gemini-2.5-flash)"


# -- keys: rotation, rate limits, cooldown ------------------------------------------------------

def test_keys_rotate_round_robin(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.respond = lambda r: Reply(body=openai_completion("ok"))
    r = router(vt, openai_route(a, ["k1", "k2", "k3"]))

    async def four() -> None:
        for _ in range(4):
            await r.chat(QUESTION)

    run(four())
    assert used_keys(a) == ["k1", "k2", "k3", "k1"]
    assert r.health.providers["openai:local"].successes == 4


def test_429_cools_the_key_for_retry_after_and_the_next_key_answers(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(429, openai_error(429, "rate limited"), headers={"Retry-After": "30"}),
           *[Reply(body=openai_completion(f"answer {i}")) for i in range(4)])
    r = router(vt, openai_route(a, ["k1", "k2"]))

    assert run(r.chat(QUESTION)).text == "answer 0"
    assert used_keys(a) == ["k1", "k2"]
    assert vt.sleeps == []  # a rate limit moves to the next key at once, no backoff
    status = {s["key"]: s for s in r.key_status()}
    assert status["key 1"]["ready"] is False and status["key 1"]["ready_in_seconds"] == 30.0
    assert status["key 1"]["reason"] == "rate limited" and status["key 2"]["ready"] is True
    health = r.health.providers["openai:local"]
    assert (health.rate_limited, health.successes, health.failures) == (1, 1, 0)

    # while k1 rests, every call goes to k2 ...
    run(r.chat(QUESTION))
    vt.now += 29.0
    run(r.chat(QUESTION))
    assert used_keys(a)[2:] == ["k2", "k2"]
    # ... and once the (virtual) 30 s are over, the rotation includes k1 again
    vt.now += 1.5
    run(r.chat(QUESTION))
    assert used_keys(a)[4:] == ["k1"]


def test_gemini_retry_delay_sets_the_cooldown(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    _, g = servers
    retry_info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
    g.push(Reply(429, gemini_error(429, "Quota exceeded", state="RESOURCE_EXHAUSTED", details=[retry_info])),
           Reply(body=gemini_response("from the second key")))
    r = router(vt, gemini_route(g, ["g-key-1", "g-key-2"]))
    assert run(r.chat(QUESTION)).text == "from the second key"
    assert used_keys(g) == ["g-key-1", "g-key-2"]
    assert r.key_status()[0]["ready_in_seconds"] == 37.0


def test_429_without_retry_after_uses_the_default_cooldown(vt: VirtualTime,
                                                           servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(429, openai_error(429)), Reply(body=openai_completion("ok")))
    r = router(vt, openai_route(a, ["k1", "k2"]), cooldown_seconds=45.0)
    run(r.chat(QUESTION))
    assert r.key_status()[0]["ready_in_seconds"] == 45.0


def test_refused_key_rests_long(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(401, openai_error(401, "invalid api key")), Reply(body=openai_completion("ok")))
    r = router(vt, openai_route(a, ["bad", "good"]), auth_cooldown_seconds=3600.0)
    assert run(r.chat(QUESTION)).text == "ok"
    assert r.key_status()[0]["reason"] == "key refused" and r.key_status()[0]["ready_in_seconds"] == 3600.0


def test_when_every_key_rests_the_provider_is_skipped_without_a_request(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, b = servers
    a.push(Reply(429, openai_error(429), headers={"Retry-After": "120"}))
    b.respond = lambda r: Reply(body=gemini_response("fallback"))
    r = router(vt, openai_route(a, ["only"]), gemini_route(b, ["g"]))
    assert run(r.chat(QUESTION)).text == "fallback"
    assert run(r.chat(QUESTION)).text == "fallback"
    assert len(a.requests) == 1  # the second call did not knock on the resting key
    health = r.health.providers["openai:local"]
    assert (health.rate_limited, health.failures, health.skipped) == (1, 1, 1)
    vt.now += 121
    a.push(Reply(body=openai_completion("back")))
    assert run(r.chat(QUESTION)).text == "back"


# -- transient errors: backoff, then the next provider ------------------------------------------

def test_5xx_is_retried_with_exponential_backoff_and_jitter(vt: VirtualTime,
                                                            servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(503, openai_error(503)), Reply(502, openai_error(502)), Reply(body=openai_completion("third time")))
    r = router(vt, openai_route(a, ["k1"]), max_retries=2, backoff_seconds=0.5)
    assert run(r.chat(QUESTION)).text == "third time"
    assert len(a.requests) == 3 and len(vt.sleeps) == 2
    assert 0.5 <= vt.sleeps[0] <= 1.0 and 1.0 <= vt.sleeps[1] <= 1.5  # 0.5·2^n plus up to 0.5 jitter
    health = r.health.providers["openai:local"]
    assert (health.retries, health.successes, health.failures) == (2, 1, 0)


def test_retries_rotate_keys(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(500, openai_error(500)), Reply(body=openai_completion("ok")))
    r = router(vt, openai_route(a, ["k1", "k2"]))
    run(r.chat(QUESTION))
    assert used_keys(a) == ["k1", "k2"]
    assert all(s["ready"] for s in r.key_status())  # a 5xx is the server's fault: no key is cooled


def test_exhausted_retries_fail_over_to_the_next_provider(vt: VirtualTime,
                                                          servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    a.respond = lambda r: Reply(500, openai_error(500, "boom"))
    g.push(Reply(body=gemini_response("Gemini here")))
    r = router(vt, openai_route(a, ["k1"]), gemini_route(g, ["g1"]), max_retries=1)
    response = run(r.chat(QUESTION, json_schema={"type": "object"}))
    assert (response.text, response.provider) == ("Gemini here", "gemini")
    assert len(a.requests) == 2 and len(vt.sleeps) == 1
    assert g.requests[0].body["generationConfig"]["responseJsonSchema"] == {"type": "object"}
    assert r.health.providers["openai:local"].failures == 1
    assert "HTTP 500" in (r.health.providers["openai:local"].last_error or "")
    assert r.health.providers["gemini:gemini-2.5-flash"].last_success_at == vt.wall()


def test_a_bad_request_skips_the_other_keys_and_goes_to_the_next_provider(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    a.push(Reply(400, openai_error(400, "model not found")))
    g.push(Reply(body=gemini_response("ok")))
    r = router(vt, openai_route(a, ["k1", "k2", "k3"]), gemini_route(g, ["g1"]))
    assert run(r.chat(QUESTION)).text == "ok"
    assert len(a.requests) == 1 and vt.sleeps == []


def test_tool_calls_pass_through_the_router(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    call = {"id": "c1", "type": "function", "function": {"name": "remember", "arguments": '{"fact": "x"}'}}
    a.push(Reply(body=openai_completion(None, tool_calls=[call])))
    tool = ToolSpec("remember", "Store a fact", {"type": "object", "properties": {"fact": {"type": "string"}}})
    response = run(router(vt, openai_route(a, ["k"])).chat(QUESTION, tools=[tool]))
    assert response.tool_calls[0].name == "remember" and response.tool_calls[0].arguments == {"fact": "x"}


# -- everything fails ---------------------------------------------------------------------------

def test_all_failing_raises_one_clear_llm_error_and_counts_it(vt: VirtualTime,
                                                              servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    a.respond = lambda r: Reply(503, openai_error(503, "overloaded"))
    g.respond = lambda r: Reply(500, gemini_error(500, "internal", state="INTERNAL"))
    r = router(vt, openai_route(a, ["k1", "k2"]), gemini_route(g, ["g1"]), max_retries=1)
    with pytest.raises(LLMError) as info:
        run(r.chat(QUESTION))
    error = info.value
    assert isinstance(error, LLMUnavailableError)
    message = str(error)
    assert message == ("No language model could answer: all 2 providers in the chain failed or are "
                       "rate-limited right now.")
    assert "\n" not in message and message.count(". ") == 0  # one sentence, fit for a friendly reply
    assert set(error.failures) == {"openai:local", "gemini:gemini-2.5-flash"}
    assert "HTTP 503" in error.failures["openai:local"]
    assert len(a.requests) == 2 and len(g.requests) == 2 and len(vt.sleeps) == 2

    health = r.health
    assert (health.calls, health.exhausted) == (1, 1)
    assert health.providers["openai:local"].failures == 1 and health.providers["openai:local"].successes == 0
    assert health.providers["gemini:gemini-2.5-flash"].last_error_at == vt.wall()
    assert "openai:local" in (health.last_error or "")
    snapshot = health.as_dict()
    assert snapshot["providers"]["openai:local"]["retries"] == 1
    json.dumps(snapshot)  # a dashboard can serve it as is

    a.respond = lambda r: Reply(body=openai_completion("recovered"))
    assert run(r.chat(QUESTION)).text == "recovered"
    assert health.providers["openai:local"].successes == 1 and health.calls == 2


def test_single_provider_failure_message(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.respond = lambda r: Reply(400, openai_error(400))
    with pytest.raises(LLMUnavailableError, match=r"^No language model could answer: the provider in the chain "
                                                  r"failed or is rate-limited right now\.$"):
        run(router(vt, openai_route(a, ["k"])).chat(QUESTION))


# -- streams ------------------------------------------------------------------------------------

ANSWER = "Hello, this is the whole answer, delivered once."


def test_stream_passes_through(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(events=openai_chunks(["Hello, ", "this is ", "the whole answer, delivered once."])))
    r = router(vt, openai_route(a, ["k"]))
    assert run(collect(r.stream(QUESTION, temperature=0.7))) == ["Hello, ", "this is ",
                                                                 "the whole answer, delivered once."]
    assert a.requests[0].body["temperature"] == 0.7
    assert r.health.providers["openai:local"].successes == 1


def test_stream_cut_midway_continues_on_the_next_provider_without_repeating(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    # provider A drops the connection after two pieces, every time (also on its retry) ...
    a.respond = lambda r: Reply(events=openai_chunks(["Hello, ", "this is ", "never sent"]), cut_after=3)
    # ... and Gemini, asked to continue, starts its answer over from the beginning
    g.push(Reply(events=gemini_chunks(["Hello, this", " is the whole", " answer, delivered once."])))
    r = router(vt, openai_route(a, ["k1"]), gemini_route(g, ["g1"]), max_retries=1)
    pieces = run(collect(r.stream(QUESTION)))

    assert "".join(pieces) == ANSWER  # exactly: nothing lost, nothing twice
    assert pieces[:2] == ["Hello, ", "this is "]
    assert len(a.requests) == 2 and len(g.requests) == 1 and len(vt.sleeps) == 1
    # the retry on A and the request to Gemini both carried the partial answer and the instruction
    assert a.requests[1].body["messages"][-2:] == [{"role": "assistant", "content": "Hello, this is "},
                                                  {"role": "user", "content": CONTINUE_INSTRUCTION}]
    contents = g.requests[0].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [{"text": "Hello, this is "}]
    assert contents[2]["parts"] == [{"text": CONTINUE_INSTRUCTION}]
    assert g.requests[0].body["systemInstruction"]["parts"] == [{"text": "You are 누리."}]
    assert r.health.providers["openai:local"].failures == 1
    assert r.health.providers["gemini:gemini-2.5-flash"].successes == 1


def test_stream_resumed_by_a_true_continuation(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(events=openai_chunks(["우리 고양이 ", "이름은 ", "(cut)"]), cut_after=3))
    # the next key continues, repeating the last words first (an overlap of 8 characters)
    a.push(Reply(events=openai_chunks(["고양이 이름은 ", "나비야. ", "세 살이야."])))
    r = router(vt, openai_route(a, ["k1", "k2"]))
    pieces = run(collect(r.stream(QUESTION)))
    assert "".join(pieces) == "우리 고양이 이름은 나비야. 세 살이야."
    assert used_keys(a) == ["k1", "k2"]


def test_rate_limit_in_the_middle_of_a_stream_moves_to_the_next_key(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    events = [*openai_chunks(["Hello, "], done=False), json.dumps({"error": {"code": 429, "message": "quota"}})]
    a.push(Reply(events=events), Reply(events=openai_chunks(["this is the whole answer, delivered once."])))
    r = router(vt, openai_route(a, ["k1", "k2"]))
    pieces = run(collect(r.stream(QUESTION)))
    assert "".join(pieces) == "Hello, this is the whole answer, delivered once."
    assert used_keys(a) == ["k1", "k2"] and vt.sleeps == []
    assert r.key_status()[0]["reason"] == "rate limited"


def test_stream_that_fails_before_any_text_is_simply_retried(vt: VirtualTime,
                                                             servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(503, openai_error(503)), Reply(events=openai_chunks(["fine"])))
    r = router(vt, openai_route(a, ["k1"]))
    assert run(collect(r.stream(QUESTION))) == ["fine"]
    assert a.requests[1].body["messages"] == a.requests[0].body["messages"]  # nothing to continue from


def test_stream_failing_everywhere_keeps_what_was_delivered_and_raises_once(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    a.respond = lambda r: Reply(events=openai_chunks(["Hello, ", "this is "]), cut_after=3)
    g.respond = lambda r: Reply(503, gemini_error(503, "overloaded", state="UNAVAILABLE"))
    r = router(vt, openai_route(a, ["k1"]), gemini_route(g, ["g1"]), max_retries=0)
    pieces: list[str] = []
    with pytest.raises(LLMUnavailableError):
        run(collect(r.stream(QUESTION), pieces))
    assert "".join(pieces) == "Hello, this is "
    assert r.health.exhausted == 1


def test_a_caller_that_stops_reading_cancels_the_stream(vt: VirtualTime,
                                                        servers: tuple[LLMServer, LLMServer]) -> None:
    a, _ = servers
    a.push(Reply(events=openai_chunks([f"piece {i} " for i in range(50)])))
    r = router(vt, openai_route(a, ["k1"]))

    async def first_two() -> list[str]:
        got = []
        stream = r.stream(QUESTION)
        async for piece in stream:
            got.append(piece)
            if len(got) == 2:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # producer gone
        return got

    assert run(first_two()) == ["piece 0 ", "piece 1 "]
    assert r.health.providers["openai:local"].failures == 0


# -- timeouts: the next provider at once ----------------------------------------------------------

FIRST_TOKEN = 0.5
QUICK = {"timeout": 5.0, "connect_timeout": 0.3, "first_token_timeout": FIRST_TOKEN}
LIMIT = 5 * FIRST_TOKEN  # the hand-over must come well within this, even on a loaded machine


def ask(r: LLMRouter, streaming: bool, into: list[str] | None = None) -> tuple[str, float]:
    """The router's answer (joined stream or chat text) and the seconds it took, in real time."""
    start = time.monotonic()
    if streaming:
        text = "".join(run(collect(r.stream(QUESTION), into)))
    else:
        text = run(r.chat(QUESTION)).text
    return text, time.monotonic() - start


@pytest.mark.parametrize("streaming", [False, True])
def test_a_stalled_provider_hands_over_to_the_next_within_the_first_token_limit(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer], streaming: bool) -> None:
    stalled, healthy = servers
    stalled.respond = lambda r: Reply(hang=True)  # accepts, reads the request, never answers
    healthy.respond = lambda r: (Reply(events=openai_chunks(["from the ", "second"])) if r.body.get("stream")
                                 else Reply(body=openai_completion("from the second")))
    r = router(vt, openai_route(stalled, ["k1", "k2"], "openai:stalled", **QUICK),
               openai_route(healthy, ["k"], "openai:healthy", **QUICK))

    text, took = ask(r, streaming)
    assert text == "from the second"
    assert FIRST_TOKEN * 0.9 < took < LIMIT
    assert len(stalled.requests) == 1 and vt.sleeps == []  # neither the other key nor a backoff retry
    health = r.health.providers["openai:stalled"]
    assert (health.timeouts, health.failures, health.retries) == (1, 1, 0)
    expected = "no first token" if streaming else "no response"
    assert health.last_error == f"LLMTimeoutError: openai:local: timed out: {expected} within 0.5 s"
    assert r.health.providers["openai:healthy"].successes == 1
    assert r.health.as_dict()["providers"]["openai:stalled"]["timeouts"] == 1  # what /status shows


def test_headers_then_silence_before_the_first_chunk_hands_over_and_nothing_leaks(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    stalled, healthy = servers
    # headers and a role-only chunk (no text) from the first, then silence
    stalled.push(Reply(events=openai_chunks(["never ", "sent"]), stall_after=1))
    healthy.push(Reply(events=openai_chunks(["Hello, ", "this is the whole answer, delivered once."])))
    r = router(vt, openai_route(stalled, ["k1"], "openai:stalled", **QUICK),
               openai_route(healthy, ["k"], "openai:healthy", **QUICK))
    pieces: list[str] = []
    _, took = ask(r, True, pieces)
    assert pieces == ["Hello, ", "this is the whole answer, delivered once."]  # nothing of the first
    assert took < LIMIT and len(stalled.requests) == 1 and vt.sleeps == []
    assert healthy.requests[0].body["messages"] == stalled.requests[0].body["messages"]  # nothing to continue
    assert r.health.providers["openai:stalled"].timeouts == 1


def test_a_stream_that_stalls_midway_is_continued_by_the_next_provider(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    a, g = servers
    # two pieces, then silence longer than the whole-answer limit (the gap between chunks)
    a.push(Reply(events=openai_chunks(["Hello, ", "this is ", "never sent"]), stall_after=3))
    g.push(Reply(events=gemini_chunks(["Hello, this", " is the whole", " answer, delivered once."])))
    r = router(vt, openai_route(a, ["k1"], timeout=0.6, connect_timeout=0.3, first_token_timeout=0.3),
               gemini_route(g, ["g1"], **QUICK))
    pieces: list[str] = []
    text, took = ask(r, True, pieces)

    assert text == ANSWER and pieces[:2] == ["Hello, ", "this is "]  # nothing lost, nothing twice
    assert 0.5 < took < 5 * 0.6
    assert len(a.requests) == 1 and vt.sleeps == []  # a stall is not retried on the same provider
    contents = g.requests[0].body["contents"]
    assert contents[1]["parts"] == [{"text": "Hello, this is "}]
    assert contents[2]["parts"] == [{"text": CONTINUE_INSTRUCTION}]
    health = r.health.providers["openai:local"]
    assert health.timeouts == 1 and "stream stalled for 0.6 s" in (health.last_error or "")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_stalled_gemini_hands_over_within_the_first_token_limit(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer], streaming: bool) -> None:
    g, a = servers
    g.respond = lambda r: Reply(hang=True)
    a.respond = lambda r: (Reply(events=openai_chunks(["local ", "answer"])) if r.body.get("stream")
                           else Reply(body=openai_completion("local answer")))
    r = router(vt, gemini_route(g, ["g1", "g2"], **QUICK), openai_route(a, ["k"], **QUICK))
    text, took = ask(r, streaming)
    assert text == "local answer" and FIRST_TOKEN * 0.9 < took < LIMIT
    assert len(g.requests) == 1 and vt.sleeps == []
    health = r.health.providers["gemini:gemini-2.5-flash"]
    expected = "no first token" if streaming else "no response"
    assert health.timeouts == 1
    assert health.last_error == f"LLMTimeoutError: gemini:gemini-2.5-flash: timed out: {expected} within 0.5 s"


def test_gemini_headers_then_silence_hands_over(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    g, a = servers
    g.push(Reply(events=gemini_chunks(["never sent"]), stall_after=0))
    a.push(Reply(events=openai_chunks(["local ", "answer"])))
    r = router(vt, gemini_route(g, ["g1"], **QUICK), openai_route(a, ["k"], **QUICK))
    pieces: list[str] = []
    _, took = ask(r, True, pieces)
    assert pieces == ["local ", "answer"] and took < LIMIT and len(g.requests) == 1


@pytest.mark.parametrize("provider", ["openai", "gemini"])
def test_an_unreachable_provider_hands_over_after_the_connect_limit(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer], provider: str) -> None:
    _, healthy = servers
    healthy.push(Reply(body=openai_completion("reachable")))
    limits = {"timeout": 5.0, "connect_timeout": 0.3, "first_token_timeout": 2.0}  # the connect limit governs
    with blackhole() as url:  # connects never complete
        first = (openai_route(url, ["k1", "k2"], "openai:gone", **limits) if provider == "openai"
                 else gemini_route(url, ["g1", "g2"], **limits))
        r = router(vt, first, openai_route(healthy, ["k"], "openai:healthy", **QUICK))
        text, took = ask(r, False)
    assert text == "reachable" and 0.25 < took < 5 * 0.3
    assert vt.sleeps == []
    health = r.health.providers[first.label]
    assert health.timeouts == 1 and "no connection" in (health.last_error or "")


def test_a_refused_connection_is_retried_briefly_then_hands_over(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    _, healthy = servers
    healthy.push(Reply(body=openai_completion("reachable")))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = router(vt, openai_route(closed, ["k1"], "openai:down", **QUICK),
               openai_route(healthy, ["k"], "openai:healthy", **QUICK))
    text, took = ask(r, False)
    assert text == "reachable" and took < LIMIT  # refused at once: only the (virtual) backoff waits
    assert len(vt.sleeps) == 2 and sum(vt.sleeps) <= 2.5  # the default backoff stays small
    assert r.health.providers["openai:down"].timeouts == 0


def test_the_last_provider_left_may_take_the_whole_answer_limit_for_its_first_token(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    slow, other = servers
    # The connect limit plays no part here (both servers are up); generous, so that a loaded
    # worker's pause (a 0.3 s limit once timed out connecting to the live fallback) fails nothing.
    limits = {"timeout": 3.0, "connect_timeout": 2.0, "first_token_timeout": 0.25}
    slow.respond = lambda r: Reply(body=openai_completion("slow but sure"), delay=0.5)
    other.respond = lambda r: Reply(body=openai_completion("the fallback"))

    # with a fallback behind it, a slow first token hands over ...
    r = router(vt, openai_route(slow, ["k"], "openai:slow", **limits),
               openai_route(other, ["k"], "openai:other", **limits))
    assert run(r.chat(QUESTION)).text == "the fallback"
    assert r.health.providers["openai:slow"].timeouts == 1
    # ... but when every provider behind it is resting, it is the last one left and is waited for
    r.routes[1].keys[0].cooldown_until = vt.now + 60
    assert run(r.chat(QUESTION)).text == "slow but sure"
    # ... and so is a provider alone in its chain
    alone = router(vt, openai_route(slow, ["k"], "openai:slow", **limits))
    assert run(alone.chat(QUESTION)).text == "slow but sure"
    assert len(other.requests) == 1 and alone.health.providers["openai:slow"].timeouts == 0


def test_a_stalled_provider_alone_fails_once_within_the_whole_answer_limit(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    stalled, _ = servers
    stalled.respond = lambda r: Reply(hang=True)
    r = router(vt, openai_route(stalled, ["k1", "k2"], timeout=0.8, connect_timeout=0.3, first_token_timeout=0.3))
    start = time.monotonic()
    with pytest.raises(LLMUnavailableError) as info:
        run(r.chat(QUESTION))
    took = time.monotonic() - start
    assert 0.7 < took < 5 * 0.8  # the last one left is waited for up to the whole-answer limit, once
    assert isinstance(info.value.__cause__, LLMTimeoutError) and info.value.__cause__.phase == "first_token"
    assert info.value.failures["openai:local"] == "openai:local: timed out: no response within 0.8 s"
    assert len(stalled.requests) == 1 and vt.sleeps == []


# -- the resume filter on its own ---------------------------------------------------------------

@pytest.mark.parametrize(("delivered", "pieces", "expected"), [
    ("", ["a", "b"], "ab"),  # nothing delivered: passthrough
    ("Hello, wor", ["Hel", "lo, ", "world!"], "ld!"),  # started over: the delivered prefix is dropped
    ("Hello, wor", ["ld! How are you", " today? I am fine."], "ld! How are you today? I am fine."),  # continuation
    ("The quick brown fox ", ["brown fox jumps over", " the lazy dog, twice."], "jumps over the lazy dog, twice."),
    ("Hello there", ["Hello"], ""),  # repeated part of the start, then stopped: nothing new
    ("Hello, wor", ["\n", " Hello, world!"], "ld!"),  # a restart that opens with whitespace
    ("abc", ["xyz"], "xyz"),  # short and different: released when the stream ends
])
def test_resume_filter(delivered: str, pieces: list[str], expected: str) -> None:
    f = ResumeFilter(delivered)
    out = "".join(f.feed(p) for p in pieces) + f.finish()
    assert out == expected


def test_resume_filter_ignores_short_accidental_overlaps() -> None:
    f = ResumeFilter("I like the ")
    out = "".join(f.feed(p) for p in ["the cats and dogs of the whole wide neighbourhood"]) + f.finish()
    assert out == "the cats and dogs of the whole wide neighbourhood"  # "the " (4 chars) is no repetition


def test_continuation_messages() -> None:
    assert continuation_messages(QUESTION, "") == QUESTION
    resumed = continuation_messages(QUESTION, "partial")
    assert resumed[-2:] == [ChatMessage("assistant", "partial"), ChatMessage("user", CONTINUE_INSTRUCTION)]


# -- configuration and the factory --------------------------------------------------------------

def test_parse_chain() -> None:
    entries = parse_chain(" gemini:gemini-2.5-flash , openai:qwen2.5:7b@http://127.0.0.1:8080/v1,"
                          "openai-compat:meta-llama/llama-3-8b-instruct:free, llamacpp:/m/qwen.gguf ")
    assert [(e.provider, e.model, e.base_url) for e in entries] == [
        ("gemini", "gemini-2.5-flash", ""), ("openai", "qwen2.5:7b", "http://127.0.0.1:8080/v1"),
        ("openai", "meta-llama/llama-3-8b-instruct:free", ""), ("llamacpp", "/m/qwen.gguf", "")]
    assert entries[1].label == "openai:qwen2.5:7b@http://127.0.0.1:8080/v1"
    for bad in ["", " , ", "claude:opus", "gemini", "gemini:", "openai:m@ftp://x", "openai:a, openai:a"]:
        with pytest.raises(ConfigError):
            parse_chain(bad)


def test_settings_validate_llm_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="llm_chain entry"):
        ChatSettings.load(llm_chain="gpt:4")
    with pytest.raises(ConfigError, match="openai_json_mode"):
        ChatSettings.load(openai_json_mode="xml")
    with pytest.raises(ConfigError, match="llm_max_retries"):
        ChatSettings.load(llm_max_retries=-1)
    with pytest.raises(ConfigError, match="llm_timeout_seconds"):
        ChatSettings.load(llm_timeout_seconds=0)
    monkeypatch.setenv("GIEOK_LLM_CHAIN", "openai:qwen2.5:7b")
    monkeypatch.setenv("GIEOK_GEMINI_API_KEYS", "a, b,a")
    settings = ChatSettings.load()
    assert [e.label for e in settings.llm_chain] == ["openai:qwen2.5:7b"] and settings.gemini_api_keys == ("a", "b")


def test_create_llm_from_settings(vt: VirtualTime, servers: tuple[LLMServer, LLMServer]) -> None:
    g, a = servers
    settings = ChatSettings.load(
        llm_chain=f"gemini:gemini-2.5-flash, openai:qwen2.5:7b@{a.url}/v1",
        gemini_api_key="AIzaSy-first-key-0001", gemini_api_keys="AIzaSy-second-key-0002,AIzaSy-first-key-0001",
        gemini_base_url=g.url, llm_max_retries=0, llm_cooldown_seconds=90)
    r = create_llm(settings, clock=vt.clock, sleep=vt.sleep, wall_clock=vt.wall)
    for route in r.routes:
        for slot in route.keys:
            track(slot.llm)
    assert r.name == f"router(gemini:gemini-2.5-flash > openai:qwen2.5:7b@{a.url}/v1)"
    assert [s["key"] for s in r.key_status()] == ["key 1 (…0001)", "key 2 (…0002)", "no key"]
    assert (r.max_retries, r.cooldown_seconds) == (0, 90)

    g.respond = lambda req: Reply(429, gemini_error(429, "quota", state="RESOURCE_EXHAUSTED"))
    a.push(Reply(body=openai_completion("local model answers")))
    response = run(r.chat(QUESTION))
    assert response.text == "local model answers"
    assert used_keys(g) == ["AIzaSy-first-key-0001", "AIzaSy-second-key-0002"]  # both keys, then the fallback
    assert a.requests[0].path == "/v1/chat/completions" and "authorization" not in a.requests[0].headers
    assert [s["ready_in_seconds"] for s in r.key_status()[:2]] == [90.0, 90.0]


@pytest.mark.parametrize("streaming", [False, True])
def test_create_llm_passes_the_time_limits_and_a_stalled_gemini_hands_over(
        vt: VirtualTime, servers: tuple[LLMServer, LLMServer], streaming: bool) -> None:
    g, a = servers
    settings = ChatSettings.load(
        llm_chain=f"gemini:gemini-2.5-flash, openai:qwen2.5:7b@{a.url}/v1", gemini_api_keys="g-key-1,g-key-2",
        gemini_base_url=g.url, llm_timeout_seconds=4, llm_connect_timeout_seconds=0.3, llm_first_token_seconds=0.5)
    r = create_llm(settings, clock=vt.clock, sleep=vt.sleep, wall_clock=vt.wall)
    clients = [track(slot.llm) for route in r.routes for slot in route.keys]
    assert [(c.timeout, c.connect_timeout, c.first_token_timeout) for c in clients] == [(4.0, 0.3, 0.5)] * 3

    g.respond = lambda req: Reply(hang=True)
    a.respond = lambda req: (Reply(events=openai_chunks(["local ", "answer"])) if req.body.get("stream")
                             else Reply(body=openai_completion("local answer")))
    text, took = ask(r, streaming)
    assert text == "local answer" and took < 5 * 0.5
    assert len(g.requests) == 1 and vt.sleeps == []
    assert r.health.as_dict()["providers"]["gemini:gemini-2.5-flash"]["timeouts"] == 1


def test_default_time_limits_hand_over_within_fifteen_seconds() -> None:
    settings = ChatSettings.load()
    assert (settings.llm_connect_timeout_seconds, settings.llm_first_token_seconds) == (5.0, 10.0)
    llm = create_llm(settings).routes[0].keys[0].llm
    assert isinstance(llm, OpenAICompatLLM)
    assert (llm.connect_timeout, llm.first_token_timeout, llm.timeout) == (5.0, 10.0, 60.0)
    # a stall costs the first-token limit (the connect is inside it), and a timeout is never retried
    assert max(llm.connect_timeout, llm.first_token_timeout) <= 15.0


def test_create_llm_defaults_and_missing_keys() -> None:
    local = create_llm(ChatSettings.load())
    assert local.name == "router(openai:qwen2.5:7b)"
    assert create_llm(ChatSettings.load(gemini_api_key="AIza-key")).name == "router(gemini:gemini-2.5-flash)"
    with pytest.raises(ConfigError, match="needs a Gemini API key"):
        create_llm(ChatSettings.load(llm_chain="gemini:gemini-2.5-flash"))


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_llamacpp_missing_names_the_extra_and_the_build_flag() -> None:
    with pytest.raises(LLMError) as info:
        create_llm(ChatSettings.load(llm_chain="llamacpp:/models/qwen2.5-0.5b-instruct-q4.gguf"))
    assert "pip install 'gieok[llamacpp]'" in str(info.value)
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in str(info.value)

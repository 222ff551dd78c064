"""gieok inside the OpenAI Agents SDK (`gieok.integrations.openai_agents`): real `Runner.run`s of an
agent whose session is a `GieokSession` and whose instructions are gieok's context, against `gieok
serve`'s app on a real port and a loopback OpenAI-compatible model (`OpenAIChatCompletionsModel`), Korean and
English; the items round trip exactly and in order through a new session object; `pop_item` and
`clear_session` remove items and their messages; a dropped connection stores nothing twice; a
second tenant's key sees nothing of the first's; the docs page's example runs as written.

Offline, proven: the SDK's tracing is off (`set_tracing_disabled`), and every test runs with
connections off loopback refused and recorded (`llm_servers.loopback_only`), asserted empty.
One server and one model for the module."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from gieok.client import AsyncClient
from gieok.errors import InvalidInputError
from gieok.integrations.openai_agents import LEDGER_PREFIX, GieokSession
from live_server import DROP, InProcessServer, Proxy, clean_env, create_key
from llm_servers import LLMServer, Received, Reply, loopback_only, loopback_only_env, openai_completion, serve

set_tracing_disabled(True)  # the SDK would export each run's trace to api.openai.com

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "integrations" / "openai-agents.md"
BASE = "You are a friendly assistant."


@dataclass
class Served:
    server: InProcessServer
    key: str  # the default tenant's write key
    other: str  # tenant "acme"'s write key
    llm: LLMServer

    @property
    def url(self) -> str:
        return self.server.url


def _reply(request: Received) -> Reply:
    """The loopback model: a tool call when the last user message asks about the weather (and no
    tool answered yet), else a short answer in the user's language."""
    messages = request.body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return Reply(body=openai_completion("서울은 맑고 23°C예요. 산책하기 좋아요!"))
    text = str(last.get("content") or "")
    if request.body.get("tools") and ("날씨" in text or "weather" in text):
        return Reply(body=openai_completion(None, [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                                                    "function": {"name": "weather",
                                                                 "arguments": json.dumps({"city": "서울"})}}]))
    return Reply(body=openai_completion("Got it!" if text.isascii() else "네, 기억할게요!"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    db = tmp_path_factory.mktemp("openai-agents") / "chat.db"
    keys = create_key(db), create_key(db, "acme")
    server = InProcessServer(db)
    try:
        with serve() as llm:
            llm.respond = _reply
            yield Served(server, *keys, llm)
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def offline() -> Iterator[None]:
    with loopback_only() as refused:
        yield
    assert refused == [], f"connections off loopback were tried: {refused}"


@function_tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: 맑음, 23°C"


def unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def agent_for(session: GieokSession, llm: LLMServer) -> Agent[Any]:
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=AsyncOpenAI(base_url=f"{llm.url}/v1",
                                                                                     api_key="sk-test"))
    return Agent(name="비서", instructions=session.instructions(BASE), model=model, tools=[weather])


def system_prompt(request: Received) -> str:
    first = request.body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


async def recent_texts(memory: AsyncClient, channel: str) -> list[str]:
    context = await memory.context(channel, include=["recent"], budget_tokens=4000)
    return [line.text for line in context.parts.recent]


def test_runs_keep_their_items_in_gieok_and_the_model_reads_gieoks_context(served: Served) -> None:
    channel, user = unique("minji"), unique("u-minji")
    fact = f"<user:{user}>는 고양이 보리를 키운다."

    async def scenario() -> None:
        async with AsyncClient(served.url, served.key) as memory:
            await memory.add_fact(fact, user=user)
            session = GieokSession(channel, memory, user=user, name="민지", assistant_name="비서")
            agent = agent_for(session, served.llm)
            seen = len(served.llm.requests)
            first = await Runner.run(agent, "서울 날씨 어때?", session=session)
            assert first.final_output == "서울은 맑고 23°C예요. 산책하기 좋아요!"
            asked = served.llm.requests[seen:]
            assert len(asked) == 2  # the tool call, then the answer
            prompt = system_prompt(asked[0])
            assert prompt.startswith(BASE + "\n\n# 알고 있는 사실\n") and fact in prompt

            again = GieokSession(channel, memory, user=user)  # a new object: what the server holds
            items = await again.get_items()
            assert items == first.to_input_list()
            assert [(i.get("type", "message"), i.get("role")) for i in items] == [
                ("message", "user"), ("function_call", None), ("function_call_output", None),
                ("message", "assistant")]
            assert await recent_texts(memory, channel) == ["서울 날씨 어때?", "서울은 맑고 23°C예요. 산책하기 좋아요!"]

            seen = len(served.llm.requests)
            second = await Runner.run(agent, "What is my cat's name?", session=again)
            assert second.final_output == "Got it!"
            sent = served.llm.requests[seen]
            history = sent.body["messages"][1:]
            assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
            assert history[0]["content"] == "서울 날씨 어때?" and history[2]["content"] == "서울: 맑음, 23°C"
            assert fact in system_prompt(sent)  # the English query still brings the user's facts
            assert len(await session.get_items()) == 6
            assert await session.get_items(limit=2) == (await session.get_items())[-2:]

    asyncio.run(scenario())


def test_every_kind_of_item_round_trips_and_pop_and_clear_remove_them_with_their_messages(served: Served) -> None:
    channel = unique("photos")
    items: list[Any] = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "  이 사진 좀 봐, 우리 보리야 \n"},
                                     {"type": "input_image", "image_url": "https://example.com/bori.jpg",
                                      "detail": "auto"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "A cat photo."}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Bori looks happy!", "logprobs": [],
                      "annotations": [{"type": "url_citation", "url": "https://example.com/cats", "title": "Cats",
                                       "start_index": 0, "end_index": 4}]}],
         "provider_data": {"model": "m", "response_id": "resp_1"}},
        {"role": "user", "content": "   "},
        {"role": "user", "content": "네"},
        {"role": "user", "content": "네"},
    ]

    async def scenario() -> None:
        async with AsyncClient(served.url, served.key) as memory:
            session = GieokSession(channel, memory, user="u-jiwoo", name="지우")
            await session.add_items(items)
            await session.add_items([])
            assert await GieokSession(channel, memory, user="u-jiwoo").get_items() == items
            assert await session.get_items(limit=3) == items[-3:]
            assert await session.get_items(limit=0) == []
            said = ["이 사진 좀 봐, 우리 보리야", "Bori looks happy!", "네", "네"]
            assert await recent_texts(memory, channel) == said

            assert await session.pop_item() == items[-1]
            assert await session.get_items() == items[:-1]
            assert await recent_texts(memory, channel) == said[:-1]

            await session.clear_session()
            assert await session.get_items() == [] and await session.pop_item() is None
            assert await recent_texts(memory, channel) == []
            assert len(await memory.list_blocks(scope={"channel": LEDGER_PREFIX + channel})) == 0

            too_long = {"type": "function_call_output", "call_id": "c1", "output": "가" * 100_001}
            with pytest.raises(InvalidInputError, match="metadata"):  # the note is refused after the message
                await session.add_items([{"role": "user", "content": "이건 남으면 안 돼"}, too_long])
            assert await session.get_items() == [] and await recent_texts(memory, channel) == []  # rolled back

            with pytest.raises(InvalidInputError, match="not JSON"):
                await session.add_items([{"role": "user", "content": "x", "when": {1, 2}}])  # type: ignore[list-item]
            assert await session.get_items() == []  # nothing of a refused batch is stored

            with pytest.raises(InvalidInputError, match="channel id"):
                GieokSession("gieok:lore", memory, user="u-jiwoo")  # a channel no conversation may have

    asyncio.run(scenario())


def test_a_dropped_connection_is_retried_with_the_same_message_ids_and_stores_them_once(served: Served) -> None:
    channel = unique("retry")
    proxy = Proxy(served.server.port, [DROP])

    async def scenario() -> None:
        async with AsyncClient(proxy.url, served.key, retries=3, backoff=0.01) as memory:
            session = GieokSession(channel, memory, user="u-alex", name="Alex")
            await session.add_items([{"role": "user", "content": "I adopted a dog named Max"}])
            assert await session.get_items() == [{"role": "user", "content": "I adopted a dog named Max"}]
            assert await recent_texts(memory, channel) == ["I adopted a dog named Max"]

    try:
        asyncio.run(scenario())
        posts = [line for line in proxy.requests() if line.startswith("POST /v1/conversations/messages")]
        assert len(posts) == 2  # dropped, then retried
        ids = re.findall(rb'"id":\s*"(oa-[0-9a-f]+-0)"', proxy.sent)
        assert len(ids) == 2 and ids[0] == ids[1]
    finally:
        proxy.close()


def test_a_second_tenant_sees_nothing_of_the_first_through_the_session_or_the_instructions(served: Served) -> None:
    channel, user = unique("shared-name"), unique("u-minji")
    secret = "비밀번호 힌트는 보리 생일이야"

    async def scenario() -> None:
        async with AsyncClient(served.url, served.key) as home, AsyncClient(served.url, served.other) as acme:
            mine = GieokSession(channel, home, user=user)
            await mine.add_items([{"role": "user", "content": secret}, {"type": "function_call_output",
                                                                         "call_id": "c1", "output": secret}])
            await home.add_fact(f"<user:{user}>의 비밀번호 힌트는 보리 생일이다.", user=user)
            theirs = GieokSession(channel, acme, user=user)  # the same session id and user id, another key
            assert await theirs.get_items() == [] and await theirs.pop_item() is None
            await theirs.clear_session()
            seen = len(served.llm.requests)
            result = await Runner.run(agent_for(theirs, served.llm), "내 비밀번호 힌트가 뭐였지?", session=theirs)
            assert result.final_output == "네, 기억할게요!"
            prompt = system_prompt(served.llm.requests[seen])
            assert "보리" not in prompt and "비밀" not in prompt.replace("내 비밀번호 힌트가 뭐였지?", "")
            assert len(await mine.get_items()) == 2  # the other tenant's clear and run touched nothing here
            assert (await theirs.get_items())[0]["content"] == "내 비밀번호 힌트가 뭐였지?"

    asyncio.run(scenario())


def test_importing_without_the_sdk_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)  # what Python does for a package that is not installed
    monkeypatch.delitem(sys.modules, "gieok.integrations.openai_agents")
    with pytest.raises(ImportError, match=re.escape('pip install "gieok[openai-agents]"')):
        importlib.import_module("gieok.integrations.openai_agents")


def python_block(page: Path) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert len(blocks) == 1, f"{page.name} has one Python example"
    return str(blocks[0])


def test_the_docs_example_runs_as_written(served: Served, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_block(PAGE), encoding="utf-8")
    env = {**clean_env(), **loopback_only_env(tmp_path), "GIEOK_URL": served.url, "GIEOK_API_KEY": served.key,
           "OPENAI_BASE_URL": f"{served.llm.url}/v1", "OPENAI_API_KEY": "sk-test", "NO_PROXY": "127.0.0.1,localhost"}
    seen = len(served.llm.requests)
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loopback only: refused" not in done.stderr
    assert [line.rstrip() for line in done.stdout.splitlines()] == [
        "bot> 네, 기억할게요!", "bot> 서울은 맑고 23°C예요. 산책하기 좋아요!",
        "message user", "message assistant", "message user", "function_call weather", "function_call_output",
        "message assistant"]
    asked = served.llm.requests[seen:]
    assert len(asked) == 3
    assert "보리는 츄르를 제일 좋아해" in system_prompt(asked[1])  # recalled from the first run

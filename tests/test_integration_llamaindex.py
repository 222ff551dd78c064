"""gieok inside LlamaIndex (`gieok.integrations.llamaindex`): a real `llama_index.core.memory.Memory`
with a `GieokMemoryBlock`, against `gieok serve`'s app on a real port, Korean and English — `aget` brings gieok's
context (a fact and turns stored earlier) into the system message, the messages the Memory flushes
are recorded as gieok messages (system and tool messages are not), a second tenant's key sees
nothing of the first's, and the docs page's example runs as written against a loopback model.

Offline, proven: every test runs with connections off loopback refused and recorded
(`llm_servers.loopback_only`), asserted empty; `approximate_tokens` stands in for tiktoken, whose
vocabulary download the guard is shown to catch. One server and one model for the module."""

from __future__ import annotations

import asyncio
import importlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory

from gieok.client import AsyncClient
from gieok.integrations.llamaindex import GieokMemoryBlock, approximate_tokens
from live_server import InProcessServer, clean_env, create_key
from llm_servers import LLMServer, Received, Reply, loopback_only, loopback_only_env, openai_completion, serve

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "integrations" / "llamaindex.md"


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
    said = str(request.body["messages"][-1]["content"])
    return Reply(body=openai_completion("Got it!" if said.isascii() else "네, 기억할게요!"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    db = tmp_path_factory.mktemp("llamaindex") / "chat.db"
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


def unique(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def memory_with(block: GieokMemoryBlock, session_id: str) -> Memory:
    return Memory.from_defaults(session_id=session_id, token_limit=60, tokenizer_fn=approximate_tokens,
                                memory_blocks=[block])


async def recent_texts(gieok: AsyncClient, channel: str) -> list[str]:
    context = await gieok.context(channel, include=["recent"], budget_tokens=4000)
    return [line.text for line in context.parts.recent]


def test_the_block_brings_gieoks_context_and_records_what_the_memory_flushes(served: Served) -> None:
    channel, user = unique("minji-notes"), unique("u-minji")
    fact = f"<user:{user}>는 부산에 산다."
    chat = [ChatMessage(role="system", content="You are a friendly assistant."),
            ChatMessage(role="user", content="우리 고양이 보리는 츄르를 제일 좋아해"),
            ChatMessage(role="assistant", content="보리 귀엽다! 츄르 좋아하는 고양이 많지"),
            ChatMessage(role="tool", content='{"weather": "맑음"}'),
            ChatMessage(role="user", content="I moved to Busan last month"),
            ChatMessage(role="assistant", content="How do you like Busan so far?"),
            ChatMessage(role="user", content="보리가 좋아하는 간식이 뭐였지?")]

    async def scenario() -> None:
        async with AsyncClient(served.url, served.key) as gieok:
            await gieok.add_fact(fact, user=user)
            block = GieokMemoryBlock(client=gieok, user=user, user_name="민지", assistant_name="비서")
            memory = memory_with(block, channel)
            await memory.aput_messages(chat)
            short_term = await memory.sql_store.get_messages(channel)
            assert 0 < len(short_term) < len(chat)  # the rest was flushed to the blocks
            flushed = chat[:len(chat) - len(short_term)]
            said = [m.content for m in flushed if m.role.value in ("user", "assistant")]
            assert said and await recent_texts(gieok, channel) == said  # no system or tool message

            messages = await memory.aget()
            system = messages[0]
            assert system.role.value == "system" and "<gieok>" in (system.content or "")
            assert fact in (system.content or "") and said[0] in (system.content or "")  # a fact, a turn
            assert [m.content for m in messages[1:]] == [m.content for m in short_term]

            only_facts = GieokMemoryBlock(client=gieok, user=user, channel=channel, include=["facts"])
            text = await only_facts.aget([ChatMessage(role="user", content="Where do I live now?")])
            assert fact in text and "보리" not in text

    asyncio.run(scenario())


def test_a_second_tenant_sees_nothing_of_the_first_through_the_block(served: Served) -> None:
    channel, user = unique("shared-name"), unique("u-minji")
    secret = "비밀번호 힌트는 보리 생일이야"

    async def scenario() -> None:
        async with AsyncClient(served.url, served.key) as home, AsyncClient(served.url, served.other) as acme:
            await GieokMemoryBlock(client=home, user=user, channel=channel).aput(
                [ChatMessage(role="user", content=secret), ChatMessage(role="assistant", content="알겠어, 기억할게")])
            await home.add_fact(f"<user:{user}>의 비밀번호 힌트는 보리 생일이다.", user=user)
            theirs = GieokMemoryBlock(client=acme, user=user, channel=channel)  # same channel and user, other key
            assert await theirs.aget([ChatMessage(role="user", content="내 비밀번호 힌트가 뭐였지?")]) == ""
            await theirs.aput([ChatMessage(role="user", content="Acme's own note")])
            assert await recent_texts(home, channel) == [secret, "알겠어, 기억할게"]
            assert await recent_texts(acme, channel) == ["Acme's own note"]

    asyncio.run(scenario())


def test_the_guard_catches_the_download_the_default_tokenizer_would_make(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # no vocabulary cached: tiktoken would fetch it
    with loopback_only() as refused, pytest.raises(Exception, match="openaipublic"):
        Memory.from_defaults(session_id="x")  # without tokenizer_fn: tiktoken's cl100k_base
    assert refused and all("openaipublic" in host for host in refused)
    assert approximate_tokens("우리 고양이 보리, I moved to Busan!") == [
        "우", "리", "고", "양", "이", "보", "리", ",", "I", "moved", "to", "Busan", "!"]


def test_importing_without_llamaindex_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.core.memory", None)  # as for a package not installed
    monkeypatch.delitem(sys.modules, "gieok.integrations.llamaindex")
    with pytest.raises(ImportError, match=re.escape('pip install "gieok[llamaindex]"')):
        importlib.import_module("gieok.integrations.llamaindex")


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
    assert done.stdout.splitlines() == ["bot> 네, 기억할게요!", "bot> Got it!", "bot> 네, 기억할게요!"]
    asked = served.llm.requests[seen:]
    assert len(asked) == 3 and all(r.headers["authorization"] == "Bearer sk-test" for r in asked)
    last = asked[-1].body["messages"]
    assert last[0]["role"] == "system" and "<gieok>" in last[0]["content"]
    assert "보리는 츄르를 제일 좋아해" in last[0]["content"]  # left the short-term memory, came back from gieok
    assert last[-1] == {"role": "user", "content": "보리가 좋아하는 간식이 뭐였지?"}

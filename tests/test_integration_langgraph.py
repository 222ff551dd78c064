"""gieok as LangGraph's store and LangChain's chat history, against `gieok serve`'s app on a real port (one per
module, keys made by `gieok keys create`) and a loopback OpenAI-compatible model server: items put,
read, replaced, searched and deleted in Korean and English; a compiled `StateGraph` whose nodes
read and write memories through the injected store (sync and async) and call the model with
them; `RunnableWithMessageHistory` over a gieok conversation with gieok's context in the prompt;
persistence across objects; a second tenant that reaches nothing; the docs page's example run as
written in a process that may not reach past loopback."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, TypedDict

import langsmith.utils
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError, PutOp

from gieok.client import AsyncClient, Client, Message
from gieok.integrations.langgraph import GieokChatMessageHistory, GieokStore, UnsupportedMessageError
from live_server import InProcessServer, create_key
from llm_servers import LLMServer, Received, Reply, loopback_only_env, openai_completion, serve

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "integrations" / "langgraph.md"
ANSWER = "(loopback) 기억해 둘게요"
TRACING = ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING", "LANGCHAIN_TRACING_V2",
           "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGSMITH_ENDPOINT", "LANGCHAIN_ENDPOINT")


@dataclass
class Served:
    url: str
    keys: dict[str, str]  # tenant → write key

    def client(self, tenant: str = "acme") -> Client:
        return Client(self.url, api_key=self.keys[tenant], retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    db = tmp_path_factory.mktemp("langgraph") / "memory.db"
    keys = {tenant: create_key(db, tenant) for tenant in ("acme", "rival", "docs")}
    server = InProcessServer(db)
    try:
        yield Served(server.url, keys)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def model() -> Iterator[LLMServer]:
    with serve() as llm:
        llm.respond = lambda received: Reply(200, openai_completion(ANSWER))
        yield llm


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy for loopback, and LangSmith's tracing off whatever the developer's shell says."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", *TRACING):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert not langsmith.utils.tracing_is_enabled()


@pytest.fixture
def acme(served: Served) -> Iterator[Client]:
    with served.client("acme") as client:
        yield client


def _blocks(client: Client, scope: dict[str, str]) -> list[Any]:
    return list(client.list_blocks(scope=scope, limit=200))


def _sent(request: Received) -> str:
    return "\n".join(str(message["content"]) for message in request.body["messages"])


# -- the store ------------------------------------------------------------------------------------

def test_items_round_trip_and_a_put_replaces_its_key(acme: Client) -> None:
    store = GieokStore(acme)
    minji = ("people", "민지")
    value = {"text": "민지는 고양이 보리를 키운다", "tags": ["반려동물", "cat"], "since": 2023, "indoor": True,
             "vet": None, "weight_kg": 4.5, "profile": {"city": "서울 마포구", "langs": ["ko", "en"]}}
    store.put(minji, "반려동물", value)
    store.put(("people", "alex"), "job", {"text": "Alex got an offer from Nuvola Labs"})

    first = store.get(minji, "반려동물")
    assert first is not None and first.value == value and first.namespace == minji and first.key == "반려동물"
    assert first.created_at == first.updated_at and first.created_at.tzinfo == UTC
    assert abs(first.created_at.timestamp() - time.time()) < 60  # the server's clock, now

    store.put(minji, "반려동물", {"text": "민지는 고양이 보리와 강아지 콩이를 키운다"})
    second = store.get(minji, "반려동물")
    assert second is not None and second.value == {"text": "민지는 고양이 보리와 강아지 콩이를 키운다"}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    live = _blocks(acme, {"guild": "langgraph:people.민지", "channel": "people.민지/반려동물"})
    assert len(live) == 1 and live[0].kind == "note", "a replaced item leaves one live block"
    assert live[0].text == "민지는 고양이 보리와 강아지 콩이를 키운다"

    odd = [" padded key ", "", "sha256:" + "0" * 64, "긴 키 " * 80]  # kept under a digest of namespace and key
    store.batch([PutOp(minji, key, {"text": f"key {number}"}) for number, key in enumerate(odd)])
    assert [(item.key, item.value) for item in (store.get(minji, key) for key in odd) if item is not None] == \
        [(key, {"text": f"key {number}"}) for number, key in enumerate(odd)]
    store.batch([PutOp(minji, key, None) for key in odd])

    store.delete(minji, "반려동물")
    assert store.get(minji, "반려동물") is None
    assert _blocks(acme, {"guild": "langgraph:people.민지"}) == []
    assert store.search(minji, query="고양이") == []
    assert store.get(("people", "alex"), "job") is not None  # a delete forgets its own key only


def test_search_ranks_by_meaning_with_filter_limit_and_offset(acme: Client) -> None:
    store = GieokStore(acme)
    notes = ("notes", "u-1")
    items = {
        "cat": {"text": "민지는 고양이 보리를 키운다", "topic": "pets", "year": 2023},
        "food": {"text": "민지가 제일 좋아하는 음식은 떡볶이야", "topic": "food", "year": 2024},
        "job": {"text": "Alex got a job offer from Nuvola Labs in Berlin", "topic": "work", "year": 2025},
        "trip": {"text": "Alex is flying to Busan next week to see the sea", "topic": "travel", "year": 2026},
    }
    store.batch([PutOp(notes, key, value) for key, value in items.items()])  # one request for all four

    korean = store.search(notes, query="민지가 키우는 반려동물 이름")
    assert [item.key for item in korean][:1] == ["cat"] and len(korean) == 4
    assert korean[0].score == 1.0 and all(a.score >= b.score for a, b in itertools.pairwise(korean))
    english = store.search(notes, query="which company made Alex an offer", limit=2)
    assert len(english) == 2 and english[0].key == "job"
    top3 = store.search(notes, query="which company made Alex an offer", limit=3)
    assert store.search(notes, query="which company made Alex an offer", limit=2, offset=1) == top3[1:]

    recent = store.search(notes, filter={"year": {"$gte": 2025}})
    assert [item.key for item in recent] == ["trip", "job"]  # without a query: newest first
    assert all(item.score is None for item in recent)
    assert [i.key for i in store.search(notes, query="Alex", filter={"topic": "travel"})] == ["trip"]
    assert [i.key for i in store.search(notes, filter={"topic": {"$ne": "work"}}, limit=2, offset=1)] == \
        ["food", "cat"]
    assert store.search(notes, query="고양이", filter={"topic": "nothing"}) == []


def test_prefixes_nested_namespaces_and_list_namespaces(acme: Client) -> None:
    store = GieokStore(acme)
    store.put(("kb",), "intro", {"text": "This knowledge base is about Korean food"})
    store.put(("kb", "ko"), "kimchi", {"text": "김치는 배추를 소금에 절여 만든다"})
    store.put(("kb", "en", "recipes"), "bibimbap", {"text": "Bibimbap is rice mixed with vegetables and gochujang"})

    # ("kb",) holds an item itself: by default it is that one namespace, on the server
    assert [i.key for i in store.search(("kb",), query="김치 만드는 법")] == ["intro"]
    assert [i.key for i in store.search(("kb",))] == ["intro"]
    nested = GieokStore(acme, nested=True)  # LangGraph's prefix rule: the namespaces below it too
    assert {i.key for i in nested.search(("kb",), query="김치 만드는 법")} == {"intro", "kimchi", "bibimbap"}
    assert [i.key for i in nested.search(("kb",))] == ["bibimbap", "kimchi", "intro"]
    # a parent that holds nothing itself is searched below, also by default
    assert [i.key for i in store.search(("kb", "en"), query="rice")] == ["bibimbap"]
    assert [i.namespace for i in store.search(("kb", "en"))] == [("kb", "en", "recipes")]

    listed = store.list_namespaces(prefix=("kb",))
    assert listed == [("kb",), ("kb", "en", "recipes"), ("kb", "ko")]
    assert store.list_namespaces(prefix=("kb",), max_depth=2) == [("kb",), ("kb", "en"), ("kb", "ko")]
    assert store.list_namespaces(suffix=("recipes",)) == [("kb", "en", "recipes")]
    assert store.list_namespaces(prefix=("kb", "*"), limit=1, offset=1) == [("kb", "ko")]


def test_bad_input_is_refused_before_anything_is_stored(acme: Client) -> None:
    store = GieokStore(acme)
    before = acme.stats().blocks
    with pytest.raises(InvalidNamespaceError):
        store.put(("users.v2", "민지"), "k", {"text": "a dot joins labels, so none may hold one"})
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "x"), "k", {"text": "LangGraph keeps this root for itself"})
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp((), "k", {"text": "no namespace"})])
    with pytest.raises(NotImplementedError, match="TTL"):
        store.put(("ttl",), "k", {"text": "expires"}, ttl=5)
    with pytest.raises(TypeError, match="JSON"):  # the first put would have been stored without the check
        store.batch([PutOp(("ok",), "a", {"text": "fine"}), PutOp(("ok",), "b", {"when": object()})])
    with pytest.raises(ValueError, match=r"\$regex"):
        store.search(("ok",), filter={"text": {"$regex": "f.*"}})
    with pytest.raises(ValueError, match="fields"):
        GieokStore(acme, index={"dims": 384, "embed": "openai:text-embedding-3-small"})
    history = GieokChatMessageHistory("bad-input", user="u-1", client=acme)
    with pytest.raises(UnsupportedMessageError, match="SystemMessage"):
        history.add_messages([HumanMessage("안녕"), SystemMessage("You are a bot")])
    with pytest.raises(UnsupportedMessageError, match="no text"):
        history.add_messages([AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "t1"}])])
    with pytest.raises(UnsupportedMessageError, match="ToolMessage"):
        history.add_messages([ToolMessage("42", tool_call_id="t1")])
    assert acme.stats().blocks == before and history.messages == []


@pytest.mark.parametrize("missing", ["langgraph.store.base", "langchain_core.chat_history"])
def test_importing_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # what `import` finds for a package that is not installed
    monkeypatch.delitem(sys.modules, "gieok.integrations.langgraph")
    with pytest.raises(ImportError, match=re.escape('pip install "gieok[langgraph]"')):
        importlib.import_module("gieok.integrations.langgraph")


# -- a graph --------------------------------------------------------------------------------------

class Turn(TypedDict, total=False):
    user: str
    question: str
    answer: str


def test_a_graph_node_remembers_through_the_injected_store(served: Served, acme: Client, model: LLMServer) -> None:
    store = GieokStore(acme)
    store.put(("memories", "u-jiwoo"), "home", {"text": "지우는 부산 해운대 근처에 산다"})
    store.put(("memories", "u-jiwoo"), "coffee", {"text": "Jiwoo drinks oat-milk flat whites"})
    llm = openai.OpenAI(base_url=model.url + "/v1", api_key="sk-test", max_retries=0)
    asked = len(model.requests)

    def answer(state: Turn, *, store: BaseStore) -> Turn:
        namespace = ("memories", state["user"])
        known = "\n".join(f"- {item.value['text']}" for item in store.search(namespace, query=state["question"]))
        reply = llm.chat.completions.create(model="test-model", messages=[
            {"role": "system", "content": "What you remember about the user:\n" + known},
            {"role": "user", "content": state["question"]}]).choices[0].message.content or ""
        store.put(namespace, "last-question", {"text": state["question"]})
        return {"answer": reply}

    graph = StateGraph(Turn).add_node("answer", answer).add_edge(START, "answer").add_edge("answer", END)
    result = graph.compile(store=store).invoke({"user": "u-jiwoo", "question": "내가 사는 동네 근처 카페 추천해 줘"})
    llm.close()

    assert result["answer"] == ANSWER
    prompt = _sent(model.requests[asked])
    assert "지우는 부산 해운대 근처에 산다" in prompt and "oat-milk flat whites" in prompt
    with served.client("acme") as fresh:  # another client, another store: the memory is the server's
        written = GieokStore(fresh).get(("memories", "u-jiwoo"), "last-question")
    assert written is not None and written.value == {"text": "내가 사는 동네 근처 카페 추천해 줘"}


def test_an_async_graph_and_history_use_the_async_client(served: Served, acme: Client) -> None:
    async def main() -> dict[str, Any]:
        async with AsyncClient(served.url, api_key=served.keys["acme"], retries=0) as client:
            store = GieokStore(acme, async_client=client)

            async def remember(state: Turn, *, store: BaseStore) -> Turn:
                await store.aput(("async", state["user"]), "said", {"text": state["question"]})
                found = await store.asearch(("async", state["user"]), query="주말 계획")
                return {"answer": " | ".join(item.value["text"] for item in found)}

            graph = StateGraph(Turn).add_node("remember", remember).add_edge(START, "remember").add_edge(
                "remember", END).compile(store=store)
            done = await graph.ainvoke({"user": "u-minji", "question": "이번 주말에 한강에서 자전거 탈 거야"})

            history = GieokChatMessageHistory("async-chat", user="u-minji", client=acme, async_client=client)
            said = [HumanMessage("I'm cycling along the Han river this weekend"), AIMessage("Sounds fun!")]
            await history.aadd_messages(said)
            await history.aadd_messages(said)  # a retry: stored once
            read = [(m.type, m.content) for m in await history.aget_messages()]
            context = await history.acontext("weekend plans")
            await history.aclear()
            return {**done, "read": read, "context": context, "cleared": await history.aget_messages()}

    done = asyncio.run(main())
    assert done["answer"] == "이번 주말에 한강에서 자전거 탈 거야"
    assert done["read"] == [("human", "I'm cycling along the Han river this weekend"), ("ai", "Sounds fun!")]
    assert "Han river" in done["context"] and done["cleared"] == []


# -- the chat history -----------------------------------------------------------------------------

def test_chat_history_with_runnable_with_message_history(served: Served, acme: Client, model: LLMServer) -> None:
    llm = openai.OpenAI(base_url=model.url + "/v1", api_key="sk-test", max_retries=0)

    def history_of(session_id: str) -> GieokChatMessageHistory:
        return GieokChatMessageHistory(session_id, user="u-minji", client=acme, assistant_name="bot")

    def chat(inputs: dict[str, Any], config: RunnableConfig) -> AIMessage:
        context = history_of(config["configurable"]["session_id"]).context(inputs["question"])
        earlier = [{"role": "user" if m.type == "human" else "assistant", "content": m.content}
                   for m in inputs["history"]]
        reply = llm.chat.completions.create(model="test-model", messages=[
            {"role": "system", "content": "You are a friendly assistant.\n\n" + context}, *earlier,
            {"role": "user", "content": inputs["question"]}]).choices[0].message.content or ""
        return AIMessage(reply)

    with pytest.warns(DeprecationWarning, match="RunnableWithMessageHistory"):
        chain = RunnableWithMessageHistory(RunnableLambda(chat), history_of, input_messages_key="question",
                                           history_messages_key="history")
    asked = len(model.requests)
    config: RunnableConfig = {"configurable": {"session_id": "cafe-7"}}
    for line in ["우리 강아지 콩이가 오늘 처음으로 산책했어", "What did my dog do today?"]:
        assert chain.invoke({"question": line}, config=config).content == ANSWER
    llm.close()

    second = model.requests[asked + 1].body["messages"]
    assert second[0]["role"] == "system" and "콩이가 오늘 처음으로 산책했어" in second[0]["content"]  # gieok's context
    assert [m["content"] for m in second[1:]] == ["우리 강아지 콩이가 오늘 처음으로 산책했어", ANSWER,
                                                "What did my dog do today?"]  # the history, then the question

    with served.client("acme") as fresh:  # a new client and history object read the same conversation
        history = GieokChatMessageHistory("cafe-7", user="u-minji", client=fresh)
        stored = history.messages
        assert [(m.type, m.content) for m in stored] == [
            ("human", "우리 강아지 콩이가 오늘 처음으로 산책했어"), ("ai", ANSWER),
            ("human", "What did my dog do today?"), ("ai", ANSWER)]
        assert all(m.id for m in stored)
        history.add_messages(stored)  # a retry of what is stored: nothing twice
        retry = [HumanMessage("새 메시지야"), AIMessage("Got it", id="chatcmpl-42")]
        history.add_messages(retry)
        history.add_messages(retry)  # the same objects again: their ids (one written on) are kept
        assert len(history.messages) == 6 and retry[0].id
        assert len(_blocks(fresh, {"channel": "cafe-7"})) == 6
        assert [m.content for m in GieokChatMessageHistory("cafe-7", client=fresh, max_messages=2).messages] == \
            ["새 메시지야", "Got it"]
        assert "콩이" in history.context("강아지 산책") and asyncio.run(history.aget_messages()) == history.messages

        history.clear()
        assert history.messages == [] and _blocks(fresh, {"channel": "cafe-7"}) == []


def test_the_history_reads_in_the_order_things_were_said(acme: Client) -> None:
    """An edit writes its turn anew and a backfill may come late: the history listed the turns as
    written (['second', 'third', 'first (edited)'])."""
    history = GieokChatMessageHistory("order-1", user="u-a", client=acme)
    history.add_messages([HumanMessage("first", id="o1"), AIMessage("second", id="o2"), HumanMessage("third", id="o3")])
    acme.add_messages("order-1", [Message(id="o1", role="user", text="first (edited)", user="u-a")])
    acme.add_messages("order-1", [Message(id="o0", role="user", text="said the day before", user="u-a",
                                          time=time.time() - 86_400)])
    assert [m.content for m in history.messages] == ["said the day before", "first (edited)", "second", "third"]
    with pytest.raises(UnsupportedMessageError, match="message 0 "):  # numbered from 0, as the server numbers them
        history.add_messages([HumanMessage("   ")])


# -- tenants --------------------------------------------------------------------------------------

def test_another_tenant_reaches_nothing(served: Served, acme: Client) -> None:
    GieokStore(acme).put(("secrets", "u-minji"), "bank", {"text": "민지의 비밀번호 힌트는 보리 생일"})
    GieokChatMessageHistory("private-1", user="u-minji", client=acme).add_messages(
        [HumanMessage("내 비밀번호 힌트는 보리 생일이야")])
    with served.client("rival") as rival:
        store = GieokStore(rival, nested=True)
        assert store.get(("secrets", "u-minji"), "bank") is None
        assert store.search(("secrets", "u-minji"), query="비밀번호 힌트") == []
        assert store.search((), query="보리 생일") == [] and store.search(()) == []
        assert store.list_namespaces() == []
        history = GieokChatMessageHistory("private-1", user="u-minji", client=rival)
        assert history.messages == []
        assert "보리" not in history.context("비밀번호 힌트")
        history.clear()  # the rival's clear has nothing of acme's to delete
    assert len(GieokChatMessageHistory("private-1", client=acme).messages) == 1


# -- the docs page --------------------------------------------------------------------------------

def test_the_docs_example_runs_as_written(served: Served, model: LLMServer, tmp_path: Path) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 1, "the page has one Python example"
    (tmp_path / "example.py").write_text(blocks[0], encoding="utf-8")
    # the example runs with every connection and lookup past loopback refused (LangSmith's tracing, a
    # telemetry ping, a tokenizer download would fail it)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **loopback_only_env(tmp_path), "GIEOK_URL": served.url,
           "GIEOK_API_KEY": served.keys["docs"], "OPENAI_BASE_URL": model.url + "/v1", "OPENAI_API_KEY": "sk-test"}
    asked = len(model.requests)
    done = subprocess.run([sys.executable, str(tmp_path / "example.py")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loopback only: refused" not in done.stderr, done.stderr
    assert f"graph: {ANSWER}" in done.stdout and "history: ['나 다음 주에 부산으로 여행 가!" in done.stdout

    graph, _, second = model.requests[asked:]
    assert "민지는 고양이 보리를 키운다" in _sent(graph)  # the store's memory in the graph's prompt
    assert "부산" in second.body["messages"][0]["content"]  # gieok's context in the chat's system prompt
    with served.client("docs") as docs:
        stored = GieokStore(docs).get(("users", "u-minji"), "last-question")
    assert stored is not None and stored.value == {"text": "우리 고양이 이름이 뭐였지?"}

"""Time as the conversation lived it, through the messages API (issue 38): the timeline test set
(tests/timeline_data.py) fed once in order and once shuffled, a scripted extraction model on a
loopback OpenAI-compatible server. Every fact's validity is its messages' dates, both feeds end
with the same facts and intervals, relative dates are resolved to the right day, the past is there
when a question asks for it and never instead of the present (A → B → A), and English is answered
in English."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import timeline_data as data
from gieok.chat.agent.pipeline import IncomingMessage
from gieok.chat.conversation.recent import conversation_of
from gieok.server import ServerState, create_app
from gieok.server.settings import ServerSettings
from gieok.types import scope_key
from llm_servers import Reply, openai_completion, serve

LOUNGE = {"channel": data.LOUNGE, "guild": data.GUILD}


class Feed:
    def __init__(self, state: ServerState, client: TestClient, key: str, model: Any) -> None:
        self.state, self.client, self.key, self.model = state, client, key, model

    def post(self, path: str, body: Any) -> Any:
        return self.client.post(path, json=body, headers={"Authorization": f"Bearer {self.key}"})

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params=params, headers={"Authorization": f"Bearer {self.key}"})

    def settle(self) -> None:
        """Wait until the tenant's background extractions are done."""
        deadline = time.monotonic() + 60
        with self.state.tenants.use("acme") as t:
            while time.monotonic() < deadline and t.pipeline._tasks:
                time.sleep(0.02)
            assert not t.pipeline._tasks, "extraction did not finish"

    def send(self, messages: list[data.Said], batch: int = 3) -> None:
        """The messages in requests of `batch`, each conversation's in its own, waiting for each
        request's extraction (so the model is shown the facts as they are)."""
        for start in range(0, len(messages), batch):
            for channel in (data.LOUNGE, data.DM):
                chunk = [m for m in messages[start:start + batch] if m.channel == channel]
                if chunk:
                    where = {"channel": channel, **({"guild": data.GUILD} if channel == data.LOUNGE else {})}
                    answer = self.post("/v1/conversations/messages", {**where, "messages": [data.wire(m)
                                                                                         for m in chunk]})
                    assert answer.status_code == 202, answer.text
                    self.settle()

    def versions(self) -> list[dict[str, Any]]:
        found = []
        for user in data.NAMES:
            found += self.get("/v1/facts", user=user, history="true").json()["facts"]
        return found


def _model_answer(received: Any) -> Reply:
    prompt_text = received.body["messages"][-1]["content"] if received.body.get("messages") else ""
    if "user_facts" in json.dumps(received.body.get("response_format") or {}) or "user_facts" in prompt_text:
        return Reply(body=openai_completion(json.dumps(data.script_extraction(prompt_text), ensure_ascii=False)))
    message = prompt_text.split("<<<")[-1].split(">>>")[0].strip() if "<<<" in prompt_text else ""
    return Reply(body=openai_completion(json.dumps({"response_needed": True, "retrieval_needed": True,
                                                    "search_query": message[:200]}, ensure_ascii=False)))


@contextmanager
def _feed(tmp_path: Path, name: str) -> Iterator[Feed]:
    with serve() as model:
        model.respond = _model_answer
        state = ServerState.open(ServerSettings(db=str(tmp_path / f"{name}.db"), llm_chain="openai:scripted",
                                                openai_base_url=f"{model.url}/v1", analysis_every=1,
                                                timezone="Asia/Seoul", server_duty_seconds=0))
        key = state.keys.create("acme", "write")[0]
        with TestClient(create_app(state)) as client:
            assert state.readiness.done.wait(180)
            yield Feed(state, client, key, model)


def _normal(versions: list[dict[str, Any]]) -> set[tuple[str, float, float | None]]:
    return {(data.plain(v["text"]), round(v["valid_from"], 3),
             None if v["valid_to"] is None else round(v["valid_to"], 3)) for v in versions}


@pytest.fixture(scope="module")
def feeds(tmp_path_factory: pytest.TempPathFactory, no_proxy_module: None) -> Iterator[dict[str, Any]]:
    """The set fed in order and shuffled; what each feed stored, and the in-order server for the
    context checks."""
    tmp = tmp_path_factory.mktemp("timeline")
    with _feed(tmp, "shuffled") as feed:
        shuffled = list(data.MESSAGES)
        random.Random(38).shuffle(shuffled)
        feed.send(shuffled)
        stored_shuffled = feed.versions()
    with _feed(tmp, "ordered") as feed:
        feed.send(sorted(data.MESSAGES, key=lambda m: m.time))
        yield {"ordered": feed.versions(), "shuffled": stored_shuffled, "feed": feed}


@pytest.fixture(scope="module")
def no_proxy_module() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield
    mp.undo()


def test_every_fact_is_valid_from_its_messages_dates_in_either_order(feeds: dict[str, Any]) -> None:
    expected = data.expected_versions()
    assert len(data.STATED) >= 20 and len(expected) >= 20
    want = {(v.text, round(v.valid_from, 3), None if v.valid_to is None else round(v.valid_to, 3)) for v in expected}
    ordered, shuffled = _normal(feeds["ordered"]), _normal(feeds["shuffled"])
    assert ordered == want, {"missing": want - ordered, "unexpected": ordered - want}
    assert shuffled == want, {"missing": want - shuffled, "unexpected": shuffled - want}
    current = {(data.plain(v["text"]), v["valid_from"]) for v in feeds["ordered"] if v["valid_to"] is None}
    assert current == {(data.plain(v["text"]), v["valid_from"]) for v in feeds["shuffled"] if v["valid_to"] is None}
    # each fact names the message that first stated it
    by_id = {m.id: m for m in data.MESSAGES}
    for version in feeds["ordered"]:
        source = by_id[version["source_message"]]
        assert source.fact == data.plain(version["text"]) and source.time == version["valid_from"], version


def test_relative_dates_are_resolved_against_the_day_they_were_said(feeds: dict[str, Any]) -> None:
    dated = [m for m in data.STATED if m.dated]
    assert len(dated) >= 4
    for feed in ("ordered", "shuffled"):
        texts = {data.plain(v["text"]): v["text"] for v in feeds[feed]}
        for message in dated:
            stored = texts[str(message.fact)]
            assert f"({message.dated})" in stored, (feed, stored, message.dated)


def test_history_comes_when_the_question_asks_for_the_past(feeds: dict[str, Any]) -> None:
    feed: Feed = feeds["feed"]
    before = feed.post("/v1/conversations/context", {**LOUNGE, "user": "u-minji", "query": "민지 전에 어디 살았어?",
                                                      "include": ["facts"]}).json()
    facts = before["parts"]["facts"]
    old = [f for f in facts if "서울" in f["text"]]
    assert old and not old[0]["current"], facts
    assert "2026-09-21 ~ 2026-10-11, 지난 사실" in before["text"], before["text"]
    now = feed.post("/v1/conversations/context", {**LOUNGE, "user": "u-minji", "query": "민지 어디 살아?",
                                                   "include": ["facts"]}).json()
    assert any("부산" in f["text"] and f["current"] for f in now["parts"]["facts"])
    assert not any("서울" in f["text"] for f in now["parts"]["facts"]), "the past is not told as the present"
    english = feed.post("/v1/conversations/context", {**LOUNGE, "user": "u-alex",
                                                       "query": "Where did Alex live before?",
                                                       "include": ["facts"]}).json()
    assert "(2026-09-02 – 2026-09-16, superseded)" in english["text"], english["text"]
    assert "since" in english["text"] and "2026-09-16since" not in english["text"]


@pytest.mark.parametrize(("user", "query", "now", "then"), [
    ("u-minji", "민지 어디 살아?", "부산", "서울"),
    ("u-alex", "Where does Alex work?", "Nuvola Labs", "Brightline"),
    ("u-jisoo", "지수 취미가 뭐야?", "클라이밍", "테니스"),
])
def test_a_value_that_came_back_is_current_in_the_agent_context_and_the_bot_prompt(
        feeds: dict[str, Any], user: str, query: str, now: str, then: str) -> None:
    feed: Feed = feeds["feed"]
    context = feed.post("/v1/conversations/context", {**LOUNGE, "user": user, "query": query}).json()
    current = [f["text"] for f in context["parts"]["facts"] if f["current"]]
    assert any(now in text for text in current), context["parts"]["facts"]
    assert not any(then in text for text in current)
    with feed.state.tenants.use("acme") as t:
        plan = feed.client.portal.call(t.pipeline.preview, IncomingMessage(  # type: ignore[union-attr]
            query, user_id=user, channel=data.LOUNGE, guild=data.GUILD, display_name=data.NAMES[user], explicit=True))
    assert plan.prompt is not None
    system = plan.prompt.messages[0].content
    facts_section = system.split("# 알고 있는 사실")[1].split("\n#")[0]
    assert now in facts_section, system
    assert then not in facts_section.replace("지난 사실", ""), facts_section


def test_an_english_direct_conversation_is_extracted_in_english(feeds: dict[str, Any]) -> None:
    feed: Feed = feeds["feed"]
    prompts = [r.body["messages"][-1]["content"] for r in feed.model.requests if r.body.get("messages")]
    dm = [p for p in prompts if "tomorrow I fly to Tokyo" in p]
    lounge = [p for p in prompts if "나 부산에 살아" in p]
    assert dm and all(p.startswith("You are the memory step") for p in dm)
    assert lounge and all(p.startswith("너는 디스코드 봇") for p in lounge)
    assert "[m1 2026-09-24 (Thu) 10:00] <user:u-alex>: tomorrow I fly to Tokyo for work" in dm[-1]


def test_a_context_for_a_conversation_never_seen_says_so_and_where_it_is(feeds: dict[str, Any]) -> None:
    feed: Feed = feeds["feed"]
    wrong = feed.post("/v1/conversations/context", {"channel": data.LOUNGE, "user": "u-minji", "query": "고양이"})
    assert wrong.status_code == 200
    body = wrong.json()
    assert body["conversation"] is None and "recalled" not in body["parts"] and "recent" not in body["parts"]
    assert "without a guild" in body["warnings"][0] and repr(data.GUILD) in body["warnings"][0]
    # (a direct conversation with 민지 may know her own facts: the isolation rule of a DM)
    assert all(f["user"] == "u-minji" for f in body["parts"].get("facts", []))
    right = feed.post("/v1/conversations/context", {**LOUNGE, "user": "u-minji", "query": "고양이"}).json()
    assert right["conversation"] == {"guild": data.GUILD, "channel": data.LOUNGE} and right["warnings"] == []


# -- times that cannot be real, and stored times that cannot be shown ---------------------------

@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[Feed]:
    state = ServerState.open(ServerSettings(db=str(tmp_path / "home.db"), timezone="Asia/Seoul",
                                            tenant_timezones="berlin=Europe/Berlin"))
    key = state.keys.create("acme", "write")[0]
    with TestClient(create_app(state)) as client:
        assert state.readiness.done.wait(180)
        yield Feed(state, client, key, None)


def _counts(feed: Feed) -> tuple[int, int]:
    with feed.state.tenants.use("acme") as t:
        return t.conversation.tables.l1_count(), len(t.memory)


@pytest.mark.parametrize(("when", "said"), [
    (1_790_000_000_000, "milliseconds"), (-5, "1970"), (0, "1970"), ("1900-01-01", "1970"),
    ("1969-12-31T23:59:59Z", "1970"), ("in three days", "future"), ("2999-01-01T00:00:00", "future"),
    ("9999-12-31T23:59:59+00:00", "future"), ("not a date", "ISO-8601"), ("", "ISO-8601"), (True, "bool"),
])
def test_a_time_no_message_can_have_is_refused_by_name_and_nothing_is_stored(plain_server: Feed, when: Any,
                                                                           said: str) -> None:
    before = _counts(plain_server)
    when = time.time() + 3 * 86_400 if when == "in three days" else when
    good = {"id": "ok", "role": "user", "user": "u1", "text": "멀쩡한 메시지", "time": 1_790_000_000}
    bad = {"id": "bad", "role": "user", "user": "u1", "text": "시간이 이상한 메시지", "time": when}
    answer = plain_server.post("/v1/conversations/messages", {"channel": "c", "messages": [good, bad]})
    assert 400 <= answer.status_code < 500, answer.text
    error = answer.json()["error"]["message"]
    assert ("time" in error and said in error and "epoch seconds" in error) or said == "bool", error
    assert _counts(plain_server) == before


def test_a_time_without_a_zone_is_read_in_the_tenants_zone(plain_server: Feed) -> None:
    message = {"id": "n1", "role": "user", "user": "u1", "text": "점심 맛있었다", "time": "2026-11-15T09:00:00"}
    plain_server.post("/v1/conversations/messages", {"channel": "c", "messages": [message]})
    recent = plain_server.get("/v1/conversations/messages", channel="c").json()["messages"]
    assert recent[-1]["created_at"] == 1_794_700_800.0  # 09:00 in Seoul = 00:00 UTC
    berlin = plain_server.state.keys.create("berlin", "write")[0]
    plain_server.client.post("/v1/conversations/messages", json={"channel": "c", "messages": [message]},
                             headers={"Authorization": f"Bearer {berlin}"})
    with plain_server.state.tenants.use("berlin") as t:
        row = t.conversation.l1.recent(conversation_of(None, "c"))[-1]
    assert row.created_at == 1_794_700_800.0 + 8 * 3600  # 09:00 in Berlin = 08:00 UTC


def test_recent_messages_sent_out_of_order_read_in_the_order_they_were_said(plain_server: Feed) -> None:
    """History sent late, newest first (an agent's backfill, one request each): the recent
    messages and the context's recent part listed them as they arrived — the model read
    [11-20] [11-01] [11-10]."""
    for number, day in ((3, 20), (1, 1), (2, 10)):
        plain_server.post("/v1/conversations/messages", {"channel": "late", "messages": [
            {"id": f"s{number}", "role": "user", "user": "u1", "text": f"{day}일에 한 이야기 {number}",
             "time": f"2026-11-{day:02d}T12:00:00"}]})
    listed = plain_server.get("/v1/conversations/messages", channel="late").json()["messages"]
    assert [m["external_id"] for m in listed] == ["s1", "s2", "s3"]
    context = plain_server.post("/v1/conversations/context", {"channel": "late", "user": "u1", "query": "이야기"}
                                ).json()["text"]
    assert context.index("이야기 1") < context.index("이야기 2") < context.index("이야기 3"), context


def test_no_stored_time_turns_a_read_into_an_error(plain_server: Feed) -> None:
    """Times stored before they were refused (an epoch in milliseconds, a negative one): the
    context renders what it can and says the time is unknown."""
    plain_server.post("/v1/conversations/messages", {"channel": "c", "messages": [
        {"id": "a", "role": "user", "user": "u1", "name": "민지", "text": "우리 고양이 보리 좋아해",
         "time": 1_790_000_000}]})
    with plain_server.state.tenants.use("acme") as t:
        key = scope_key(conversation_of(None, "c"))
        for number, bad in enumerate((1_790_000_000_000.0, -62_200_000_000_000.0, 1e300)):
            t.conversation.tables.l1_append(key, "user", f"고양이 {number} 보리", "u1", "민지", bad, False, False,
                                            None, 50)
        t.memory.add("고양이 보리는 츄르를 좋아해", scope={"channel": "c"}, event_time=1_790_000_000)
        kept = t.conversation.facts.add("<user:u1>는 고양이 보리를 키운다.", fact_type="user_fact", user_id="u1",
                                        when=1_790_000_000)
        _store_as_before_times_were_checked(t.memory, kept.fact.block_index, 1_790_000_000_000.0)
    for query in ("고양이 보리", "what does the cat eat?"):
        answer = plain_server.post("/v1/conversations/context", {"channel": "c", "user": "u1", "query": query})
        assert answer.status_code == 200, answer.text
        assert "시각 불명" in answer.json()["text"] or "unknown time" in answer.json()["text"]


def _store_as_before_times_were_checked(memory: Any, block_index: int, when: float) -> None:
    """A fact and its block given a time no write accepts now, as a memory written before the
    checks may hold (straight into its SQLite file)."""
    with closing(sqlite3.connect(memory.store.path)) as db, db:
        db.execute("UPDATE blocks SET event_time = ? WHERE block_index = ?", (when, block_index))
        db.execute("UPDATE facts SET valid_from = ? WHERE block_index = ?", (when, block_index))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(when=st.one_of(st.integers(min_value=-2**63, max_value=2**63), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=40), st.datetimes().map(lambda d: d.isoformat()), st.none(), st.booleans()))
def test_fuzzing_the_time_field_never_makes_a_later_read_fail(plain_server: Feed, when: Any) -> None:
    answer = plain_server.client.post("/v1/conversations/messages", content=json.dumps(
        {"channel": "fuzz", "messages": [{"id": f"m{time.monotonic_ns()}", "role": "user", "user": "u1",
                                          "text": "시간 퍼징", "time": when}]}, allow_nan=True),
        headers={"Authorization": f"Bearer {plain_server.key}", "Content-Type": "application/json"})
    assert answer.status_code < 500, answer.text
    for path, body in (("/v1/conversations/context", {"channel": "fuzz", "user": "u1", "query": "퍼징"}),):
        assert plain_server.post(path, body).status_code == 200
    assert plain_server.get("/v1/conversations/messages", channel="fuzz").status_code == 200


# -- edits and deletions -------------------------------------------------------------------------

def test_a_resent_id_with_new_text_is_an_edit_and_delete_erases_a_message(tmp_path: Path,
                                                                         no_proxy_module: None) -> None:
    with _feed(tmp_path, "edits") as feed:
        first = [data.wire(m) for m in data.MESSAGES if m.id in ("t01", "t02")]
        feed.post("/v1/conversations/messages", {**LOUNGE, "messages": first})
        feed.settle()
        assert {data.plain(f["text"]) for f in feed.versions()} == {"<user:u-minji>는 부산에 산다.",
                                                                     "<user:u-minji>는 카페에서 일한다."}
        # t01 edited: she lives in 서울 (the scripted model knows that sentence as t07's)
        edited = {**first[0], "text": data.BY_TEXT["서울로 이사 왔어, 짐 정리 중"].text}
        answer = feed.post("/v1/conversations/messages", {**LOUNGE, "messages": [edited, first[1]]}).json()
        assert [m["id"] for m in answer["edited"]] == ["t01"] and answer["duplicates"] == ["t02"]
        assert answer["edited"][0]["block_index"] and answer["extraction"] == "started"
        feed.settle()
        facts = {data.plain(f["text"]): f for f in feed.versions()}
        assert set(facts) == {"<user:u-minji>는 서울에 산다.", "<user:u-minji>는 카페에서 일한다."}, facts
        # dated by the edited message's time
        assert facts["<user:u-minji>는 서울에 산다."]["valid_from"] == data.MESSAGES[0].time
        search = feed.post("/v1/search", {"query": "부산에 살아", "k": 10}).json()
        assert not any("부산" in hit["block"]["text"] for hit in search["hits"]), "the old text is gone"
        with feed.state.tenants.use("acme") as t:
            assert t.memory.verify().ok
        # t02 deleted: its fact and its turn go; the id stays taken
        gone = feed.client.delete("/v1/conversations/messages/t02", params=LOUNGE,
                                  headers={"Authorization": f"Bearer {feed.key}"})
        assert gone.status_code == 200 and gone.json()["erased"] == {"messages": 1, "blocks": 1, "facts": 1,
                                                                   "summary_items": 0}
        again = feed.client.delete("/v1/conversations/messages/t02", params=LOUNGE,
                                   headers={"Authorization": f"Bearer {feed.key}"})
        assert again.status_code == 200 and again.json()["already_deleted"] is True
        never = feed.client.delete("/v1/conversations/messages/t99", params=LOUNGE,
                                   headers={"Authorization": f"Bearer {feed.key}"})
        assert never.status_code == 404 and never.json()["error"]["type"] == "not_found"
        assert {data.plain(f["text"]) for f in feed.versions()} == {"<user:u-minji>는 서울에 산다."}
        resent = feed.post("/v1/conversations/messages", {**LOUNGE, "messages": [first[1]]}).json()
        assert resent["duplicates"] == ["t02"] and resent["stored"] == []
        context = feed.post("/v1/conversations/context", {**LOUNGE, "user": "u-minji", "query": "카페에서 일해"}).json()
        assert "카페" not in context["text"], context["text"]
        with feed.state.tenants.use("acme") as t:
            assert t.memory.verify().ok

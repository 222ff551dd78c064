"""The data about people over REST (issue 39): a tenant's users, everything held about one (an
access request, streamed), erasure of one, and facts stated, corrected, forgotten and traced by
hand — each route with read, write and admin keys, two users (erasing one leaves the other) and two
tenants (nothing of one reachable from the other). Real SQLite, the real embedder, a real app."""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from gieok.chat.conversation.facts import Statement
from gieok.chat.conversation.memory import ConversationMemory
from gieok.errors import DatabaseUnavailableError
from gieok.server import ServerState, compact, create_app
from gieok.server.settings import ServerSettings

CAFE = {"channel": "cafe", "guild": "g1"}
T0 = 1_790_000_000.0


class Served:
    def __init__(self, state: ServerState, client: TestClient, keys: dict[str, str]) -> None:
        self.state, self.client, self.keys = state, client, keys

    def call(self, method: str, path: str, key: str = "admin", **kwargs: Any) -> Any:
        return self.client.request(method, path, headers={"Authorization": f"Bearer {self.keys[key]}"}, **kwargs)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    state = ServerState.open(ServerSettings(db=str(tmp_path / "home.db"), timezone="Asia/Seoul"))
    keys = {role: state.keys.create("acme", role)[0] for role in ("read", "write", "admin")}
    keys["other"] = state.keys.create("other", "admin")[0]
    with TestClient(create_app(state)) as client:
        assert state.readiness.done.wait(180)
        served = Served(state, client, keys)
        messages = [
            {"id": "1", "role": "user", "user": "u-minji", "name": "민지", "text": "나 해운대 살아", "time": T0},
            {"id": "2", "role": "user", "user": "u-alex", "name": "Alex", "text": "I live in Berlin", "time": T0 + 60},
            {"id": "3", "role": "user", "user": "u-minji", "name": "민지", "text": "고양이 쿼카빌 키워",
             "time": T0 + 120},
        ]
        assert served.call("POST", "/v1/conversations/messages", "write", json={**CAFE, "messages": messages}
                           ).status_code == 202
        yield served


def test_users_are_listed_with_what_is_known_of_them(served: Served) -> None:
    listed = served.call("GET", "/v1/users", "read").json()
    users = {u["user"]: u for u in listed["users"]}
    assert set(users) == {"u-alex", "u-minji"} and listed["next"] is None
    assert users["u-minji"]["names"] == ["민지"] and users["u-minji"]["messages"] == 2
    assert users["u-minji"]["conversations"] == 1 and users["u-minji"]["first_seen"] == T0
    page = served.call("GET", "/v1/users", "read", params={"limit": 1}).json()
    assert [u["user"] for u in page["users"]] == ["u-alex"] and page["next"] == "u-alex"
    rest = served.call("GET", "/v1/users", "read", params={"after": page["next"]}).json()
    assert [u["user"] for u in rest["users"]] == ["u-minji"]
    assert served.call("GET", "/v1/users", "other").json()["users"] == [], "another tenant has none of them"


def test_an_access_request_is_an_admins_and_holds_everything_about_one_user(served: Served) -> None:
    served.call("POST", "/v1/facts", "write", json={"text": "<user:u-minji>는 해운대에 산다.", "user": "u-minji",
                                                    "guild": "g1", "valid_from": T0})
    for key in ("read", "write"):
        refused = served.call("GET", "/v1/users/u-minji", key)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    answer = served.call("GET", "/v1/users/u-minji")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    data = answer.json()
    assert data["user"] == "u-minji" and [n["name"] for n in data["names"]] == ["민지"]
    assert sorted(m["text"] for m in data["messages"]) == ["고양이 쿼카빌 키워", "나 해운대 살아"]
    assert all(m["conversation"] == {"guild": "g1", "channel": "cafe"} and m["message_id"] for m in data["messages"])
    assert [f["text"] for f in data["facts"]] == ["<user:u-minji>는 해운대에 산다."]
    assert data["facts"][0]["sources"][0]["author"].startswith("key:")
    assert "Berlin" not in answer.text, "nothing of the other user"
    theirs = served.call("GET", "/v1/users/u-minji", "other").json()
    assert theirs["messages"] == [] and theirs["facts"] == [], "another tenant's key reads its own (empty) memory"
    bad = served.call("GET", "/v1/users/not%20an%20id")
    assert bad.status_code == 400


def test_erasing_one_user_leaves_the_other_and_needs_a_write_key(served: Served) -> None:
    refused = served.call("DELETE", "/v1/users/u-minji", "read")
    assert refused.status_code == 403
    other = served.call("DELETE", "/v1/users/u-minji", "other").json()
    assert other["erased"]["messages"] == 0, "another tenant's erasure reaches nothing here"
    receipt = served.call("DELETE", "/v1/users/u-minji", "write").json()
    assert receipt["user"] == "u-minji" and receipt["erased"]["messages"] == 2 and receipt["erased"]["names"] == 1
    assert receipt["erased"]["l1_rows"] == 2, "her recent messages, counted before their turns took them along"
    assert [u["user"] for u in served.call("GET", "/v1/users", "read").json()["users"]] == ["u-alex"]
    found = served.call("POST", "/v1/search", "read", json={"query": "해운대 고양이 쿼카빌", "k": 10}).json()
    assert all("쿼카빌" not in hit["block"]["text"] and "해운대" not in hit["block"]["text"] for hit in found["hits"])
    assert any("Berlin" in hit["block"]["text"] for hit in served.call(
        "POST", "/v1/search", "read", json={"query": "Berlin", "k": 5}).json()["hits"])
    assert served.call("GET", "/v1/verify", "read").json()["ok"]
    alias = served.call("DELETE", "/v1/facts/users/u-alex", "write").json()
    assert alias["erased"]["messages"] == 1


def test_an_erasure_cut_short_is_finished_by_the_retry_which_says_it_resumed(served: Served,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes away after the erasure's work and before its record is closed: a 503, which
    clients retry. The retry finishes it, counts only what was left (nothing) and says `resumed`."""
    with served.state.tenants.use("acme") as tenant:
        tables = tenant.conversation.tables
    real_end = tables.erasure_end

    def away(user_id: str) -> None:
        raise DatabaseUnavailableError("the database server is not answering (a fault injected by the test)")

    monkeypatch.setattr(tables, "erasure_end", away)
    cut = served.call("DELETE", "/v1/users/u-minji", "write")
    assert cut.status_code == 503 and cut.json()["error"]["type"] == "store_unavailable", cut.text
    assert served.call("GET", "/v1/users/u-minji").json()["messages"] == [], "the work was done before the cut"
    monkeypatch.setattr(tables, "erasure_end", real_end)
    retried = served.call("DELETE", "/v1/users/u-minji", "write").json()
    assert retried["resumed"] is True and retried["erased"]["messages"] == 0, retried
    assert tables.erasures_pending() == []
    again = served.call("DELETE", "/v1/users/u-minji", "write").json()
    assert again["resumed"] is False and again["erased"]["messages"] == 0


def test_facts_are_stated_corrected_traced_and_forgotten_by_hand(served: Served) -> None:
    def state_fact(text: str, key: str = "write", **extra: Any) -> Any:
        return served.call("POST", "/v1/facts", key, json={"text": text, "user": "u-alex", "guild": "g1", **extra})

    assert state_fact("<user:u-alex> lives in Berlin.", "read").status_code == 403
    first = state_fact("<user:u-alex> lives in Berlin.", valid_from="2026-09-01T09:00:00")
    assert first.status_code == 201 and first.json()["action"] == "stored"
    assert first.json()["fact"]["valid_from"] == 1_788_220_800.0  # 09:00 in Seoul
    assert state_fact("<user:u-alex> lives in Berlin", valid_from=1_789_000_000).json()["action"] == "duplicate"
    moved = state_fact("<user:u-alex> lives in Lisbon.", valid_from="2026-10-01T09:00:00+09:00").json()
    assert moved["action"] == "superseded" and moved["replaced"]["text"] == "<user:u-alex> lives in Berlin."
    wrong = moved["fact"]["block_index"]
    fixed = served.call("PATCH", f"/v1/facts/{wrong}", "write", json={"text": "<user:u-alex> lives in Porto."})
    assert fixed.status_code == 200 and fixed.json()["fact"]["valid_from"] == moved["fact"]["valid_from"]
    history = served.call("GET", f"/v1/facts/{fixed.json()['fact']['block_index']}/history", "read").json()
    texts = [(v["text"], v["current"]) for v in history["versions"]]
    assert texts == [("<user:u-alex> lives in Berlin.", False), ("<user:u-alex> lives in Lisbon.", False),
                     ("<user:u-alex> lives in Porto.", True)]
    assert history["versions"][1]["valid_from"] == history["versions"][1]["valid_to"], "wrong from the start"
    assert history["versions"][2]["sources"][0]["author"].startswith("key:")
    assert served.call("GET", f"/v1/facts/{wrong}/history", "other").status_code == 404
    assert served.call("DELETE", f"/v1/facts/{wrong}", "other").status_code == 404
    assert served.call("DELETE", f"/v1/facts/{wrong}", "read").status_code == 403
    gone = served.call("DELETE", f"/v1/facts/{fixed.json()['fact']['block_index']}", "write").json()
    assert gone["erased"] == [fixed.json()["fact"]["block_index"]]
    now = served.call("GET", "/v1/facts", "read", params={"user": "u-alex"}).json()["facts"]
    assert [f["text"] for f in now] == ["<user:u-alex> lives in Lisbon."], "the history forms again without it"
    assert served.call("POST", "/v1/facts", "write", json={"text": "nobody"}).status_code == 400
    assert served.call("POST", "/v1/facts", "write", json={"text": "x", "user": "u", "tenant": "acme"}
                       ).status_code == 422


def test_an_access_request_is_streamed_its_memory_does_not_grow_with_the_user(tmp_path: Path) -> None:
    """The export is written as it is read: the peak memory of writing 4,000 messages is that of
    writing 1,000 (pages of 500), not four times it. (Its time and the server's memory at 10,000
    messages: `gieok bench users`.)"""
    from gieok import Memory

    def peak_of(conversation: ConversationMemory, user: str) -> tuple[int, int]:
        tracemalloc.start()
        size = sum(len(part) for part in conversation.user_data(user))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return size, peak

    with Memory(tmp_path / "big.db") as memory:
        dim = memory.embedder.dimension
        rng = np.random.default_rng(39)
        for user, count in (("u-small", 1_000), ("u-big", 4_000)):
            for start in range(0, count, 1_000):
                # a sentence, not a run of one syllable: kiwi reads "가" * 40 three times as slowly
                items = [{"text": f"메시지 {i}: 오늘 있었던 일 친구랑 점심 먹고 공원에서 산책했는데 날씨가 좋았어",
                          "speaker": user, "scope": {"channel": f"c{i % 7}", "user": user}, "event_time": T0 + i}
                         for i in range(start, start + 1_000)]
                vectors = rng.normal(size=(len(items), dim)).astype(np.float32)
                memory.add_many(items, vectors=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        conversation = ConversationMemory(memory)
        conversation.facts.add("<user:u-big>는 바쁘다.", fact_type="user_fact", user_id="u-big",
                               statement=Statement(T0, author="test"))
        small_size, small_peak = peak_of(conversation, "u-small")
        big_size, big_peak = peak_of(conversation, "u-big")
        data = json.loads("".join(conversation.user_data("u-big")))
    assert len(data["messages"]) == 4_000 and big_size > 3.5 * small_size
    assert big_peak < 1.5 * small_peak, (small_peak, big_peak)


# -- times: refused when no calendar shows them, and never an error when stored ------------------

@pytest.mark.parametrize("when", [1_794_103_200_000, 1e300, -1e12, "9999-12-31T00:00:00", "in three days"])
def test_a_time_no_calendar_shows_or_still_to_come_is_refused_for_a_fact_by_name(served: Served, when: Any) -> None:
    """Epoch milliseconds were stored as the year 58822 and then failed every page that showed the
    fact; a start still to come made a fact "known" before it was true."""
    when = (datetime.now(UTC) + timedelta(days=3)).isoformat() if when == "in three days" else when
    listed = {"user": "u-alex", "history": "true"}
    before = served.call("GET", "/v1/facts", "read", params=listed).json()["facts"]
    told = served.call("POST", "/v1/facts", "write", json={"text": "<user:u-alex> likes coffee.", "user": "u-alex",
                                                           "valid_from": when})
    assert told.status_code == 400 and "valid_from" in told.json()["error"]["message"], told.text
    fact = served.call("POST", "/v1/facts", "write", json={"text": "<user:u-alex> likes tea.", "user": "u-alex"})
    fixed = served.call("PATCH", f"/v1/facts/{fact.json()['fact']['block_index']}", "write",
                        json={"text": "<user:u-alex> likes green tea.", "valid_from": when})
    assert fixed.status_code == 400 and "valid_from" in fixed.json()["error"]["message"], fixed.text
    after = served.call("GET", "/v1/facts", "read", params=listed).json()["facts"]
    assert [f["text"] for f in after] == [f["text"] for f in before] + ["<user:u-alex> likes tea."]


@pytest.mark.parametrize("when", [1_794_103_200_000, 1e300, -1e12, "9999-12-31T00:00:00"])
def test_a_memorys_time_and_a_query_bound_no_calendar_shows_are_refused_by_name(served: Served, when: Any) -> None:
    blocks = served.call("GET", "/v1/stats", "read").json()["blocks"]
    added = served.call("POST", "/v1/memories", "write", json={"text": "coffee at nine", "event_time": when})
    assert added.status_code == 400 and "event_time" in added.json()["error"]["message"], added.text
    assert served.call("GET", "/v1/stats", "read").json()["blocks"] == blocks
    asked = served.call("GET", "/v1/facts", "read", params={"as_of": str(when)})
    assert asked.status_code == 400 and "as_of" in asked.json()["error"]["message"], asked.text
    found = served.call("POST", "/v1/search", "read", json={"query": "coffee", "since": when})
    assert found.status_code == 400 and "since" in found.json()["error"]["message"], found.text
    if when == 1_794_103_200_000:
        assert "milliseconds" in added.json()["error"]["message"]


def test_a_stored_time_no_calendar_shows_fails_no_page_and_no_read(served: Served) -> None:
    """A memory written before times were checked may hold one (the year 58822): every page and
    answer that shows it says it cannot, and the rest of the page is there."""
    fact = served.call("POST", "/v1/facts", "write", json={"text": "<user:u-alex> likes coffee.", "user": "u-alex",
                                                           "guild": "g1"}).json()["fact"]["block_index"]
    turn = served.call("POST", "/v1/memories", "write", json={"text": "Alex drank coffee every morning in September",
                                                               "scope": CAFE, "speaker": "u-alex"}).json()
    with served.state.tenants.use("acme") as t, closing(sqlite3.connect(t.memory.store.path)) as db, db:
        for block in (fact, turn["block_index"]):
            db.execute("UPDATE blocks SET event_time = ? WHERE block_index = ?", (1_794_103_200_000.0, block))
        db.execute("UPDATE facts SET valid_from = ? WHERE block_index = ?", (1_794_103_200_000.0, fact))
    signed_in = served.client.post("/login", data={"key": served.keys["admin"], "next": "/"},
                                   headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert signed_in.status_code == 303, signed_in.text
    for page in ("/facts", "/facts?user=u-alex", "/users/u-alex", f"/blocks/{fact}", f"/blocks/{turn['block_index']}",
                 "/search?q=coffee", "/search?q=what+did+Alex+drink+in+September%3F"):
        shown = served.client.get(page)
        assert shown.status_code == 200 and "coffee" in shown.text, (page, shown.status_code)
    answers = [served.call("GET", "/v1/facts", "read", params={"user": "u-alex"}),
               served.call("GET", "/v1/users/u-alex"),
               served.call("POST", "/v1/search", "read", json={"query": "what did Alex drink in September?"}),
               served.call("POST", "/v1/conversations/context", "read",
                           json={**CAFE, "user": "u-alex", "query": "what does Alex drink in September?"})]
    assert [a.status_code for a in answers] == [200] * 4 and all("coffee" in a.text for a in answers)
    with served.state.tenants.use("acme") as t:  # what an MCP tool answers of it
        told = compact.fact(t.conversation.facts.get(fact))
    assert told["text"] == "<user:u-alex> likes coffee." and told["valid_from"] is None


def test_a_correction_is_made_of_its_own_words_and_the_wrong_version_is_no_past(served: Served) -> None:
    """The right version's keywords came from the wrong one's (its wrong words outlived its
    erasure), and a context asked about the past showed the wrong version as where Alex once lived."""
    def state_fact(text: str, when: str) -> Any:
        return served.call("POST", "/v1/facts", "write", json={"text": text, "user": "u-alex", "guild": "g1",
                                                               "valid_from": when}).json()["fact"]

    state_fact("<user:u-alex> lives in Berlin.", "2026-09-01T09:00:00")
    wrong = state_fact("<user:u-alex> lives in Lisbon.", "2026-10-01T09:00:00")["block_index"]
    right = served.call("PATCH", f"/v1/facts/{wrong}", "write", json={"text": "<user:u-alex> lives in Porto."}
                        ).json()["fact"]
    assert "porto" in right["keywords"] and "lisbon" not in right["keywords"], right["keywords"]
    assert "user" not in right["keywords"] and "alex" not in right["keywords"], "of its words, not the <user:ID>"
    asked = served.call("POST", "/v1/conversations/context", "read",
                        json={**CAFE, "user": "u-alex", "query": "where did Alex live before?"}).json()["text"]
    assert "Berlin" in asked and "Porto" in asked and "Lisbon" not in asked, asked
    served.call("DELETE", f"/v1/facts/{wrong}", "write")
    held = served.call("GET", "/v1/users/u-alex").text + served.call("GET", "/v1/export", "read").text
    assert "lisbon" not in held.lower()


def test_a_fact_stated_or_corrected_by_hand_is_said_on_the_live_stream(served: Served) -> None:
    """Only the extraction's facts reached the stream: a `fact.*` webhook or subscriber heard
    nothing of a fact a key stated or corrected (REST and MCP share the path)."""
    def state_fact(text: str) -> Any:
        return served.call("POST", "/v1/facts", "write", json={"text": text, "user": "u-alex", "guild": "g1"}).json()

    first = state_fact("<user:u-alex> lives in Berlin.")
    state_fact("<user:u-alex> lives in Berlin")
    moved = state_fact("<user:u-alex> lives in Lisbon.")
    fixed = served.call("PATCH", f"/v1/facts/{moved['fact']['block_index']}", "write",
                        json={"text": "<user:u-alex> lives in Porto."}).json()
    said = [(e.type, e.data["block"], e.data["source"].startswith("key:"))
            for e in served.state.bus.recent("acme", n=1000) if e.type.startswith("fact.")]
    assert said == [("fact.added", first["fact"]["block_index"], True),
                    ("fact.duplicate", first["fact"]["block_index"], True),
                    ("fact.superseded", moved["fact"]["block_index"], True),
                    ("fact.corrected", fixed["fact"]["block_index"], True)]
    assert not [e for e in served.state.bus.recent("other", n=1000) if e.type.startswith("fact.")]

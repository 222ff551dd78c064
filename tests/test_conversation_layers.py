"""L1 / L2 / L3: persistence across reopen and crashes, summary merge rules, fact dedup,
supersession, isolation across guilds and users, lore seeding. Real SQLite files and the
real packaged embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from gieok import Memory
from gieok.chat.conversation.facts import LORE_GUILD, FactStore, FactType, PairJudge, visible
from gieok.chat.conversation.recent import RecentMessages, conversation_of
from gieok.chat.conversation.summary import ChannelSummary, SummaryStore
from gieok.errors import InvalidInputError, InvalidTypeError
from gieok.store.conversation import ConversationTables, FactRow

CAFE = conversation_of("g1", "cafe")


def tables(memory: Memory) -> ConversationTables:
    return ConversationTables(memory.store)


# -- L1 ---------------------------------------------------------------------------------------
def test_l1_keeps_every_message_and_survives_reopen(db_path: Path) -> None:
    with Memory(db_path) as memory:
        l1 = RecentMessages(tables(memory), capacity=50)
        l1.append(CAFE, role="user", content="안녕 누리야", user_id="1", display_name="민지", addressed=True)
        l1.append(CAFE, role="user", content="준호야 어제 뭐 했어?", user_id="2", display_name="준호")
        l1.append(CAFE, role="assistant", content="안녕!", user_id=None, display_name="누리")
    with Memory(db_path) as memory:
        rows = RecentMessages(tables(memory)).recent(CAFE)
    assert [r.content for r in rows] == ["안녕 누리야", "준호야 어제 뭐 했어?", "안녕!"]
    assert rows[0].addressed and not rows[1].addressed
    assert rows[1].display_name == "준호" and rows[2].role == "assistant"


def test_l1_trims_only_rows_already_in_long_term_memory(memory: Memory) -> None:
    t = tables(memory)
    l1 = RecentMessages(t, capacity=3)
    rows = [l1.append(CAFE, role="user", content=f"message {i}", user_id="1") for i in range(6)]
    assert len(l1.recent(CAFE, 100)) == 6, "unwritten rows must never be trimmed"
    t.l1_set_blocks([(r.message_id, 1000 + i) for i, r in enumerate(rows)])
    l1.append(CAFE, role="user", content="message 6", user_id="1")
    assert [r.content for r in l1.recent(CAFE, 100)] == ["message 4", "message 5", "message 6"]


def test_l1_conversations_are_separate(memory: Memory) -> None:
    l1 = RecentMessages(tables(memory))
    l1.append(CAFE, role="user", content="cafe", user_id="1")
    l1.append(conversation_of("g2", "cafe"), role="user", content="other guild", user_id="1")
    l1.append(conversation_of(None, "dm-1"), role="user", content="dm", user_id="1")
    assert [r.content for r in l1.recent(CAFE)] == ["cafe"]
    assert [r.content for r in l1.recent(conversation_of(None, "dm-1"))] == ["dm"]


def test_l1_rejects_unknown_role(memory: Memory) -> None:
    with pytest.raises(InvalidInputError):
        RecentMessages(tables(memory)).append(CAFE, role="system", content="x", user_id="1")


# -- L2 ---------------------------------------------------------------------------------------
def test_summary_merge_rules() -> None:
    s = ChannelSummary()
    s = s.merge({"topic": "고양이", "mood": "즐거움", "new_topic": "반려동물", "new_point": "민지는 고양이를 키운다",
                 "stage": "ongoing"})
    assert (s.topic, s.mood, s.stage) == ("고양이", "즐거움", "ongoing")
    s = s.merge({"topic": "등산", "new_topic": "반려동물", "new_point": "민지는  고양이를 키운다!"})
    assert s.topic == "등산" and s.mood == "즐거움", "topic overwrites, mood stays"
    assert (s.ongoing_topics == ("반려동물",) and s.key_points == ("민지는  고양이를 키운다!",)) or \
        len(s.key_points) == 1, "duplicates are not appended twice"
    for i in range(12):
        s = s.merge({"new_topic": f"topic {i}", "new_point": f"point {i}"}, max_topics=5, max_points=10)
    assert s.ongoing_topics == tuple(f"topic {i}" for i in range(7, 12)), "the newest 5 topics"
    assert len(s.key_points) == 10 and s.key_points[-1] == "point 11" and "point 1" not in s.key_points
    s2 = s.merge({"stage": "finished", "core": ["I am the boss now"], "mood": None})
    assert s2.stage == s.stage and s2.core == (), "unknown stage ignored; core is never set by updates"
    with pytest.raises(InvalidTypeError):
        s.merge({"topic": 5})
    with pytest.raises(InvalidTypeError):
        s.merge(["topic"])  # type: ignore[arg-type]


def test_summary_is_saved_on_every_update(db_path: Path) -> None:
    memory = Memory(db_path)
    store = SummaryStore(tables(memory))
    store.update(CAFE, {"topic": "여행", "new_point": "준호는 다음 달에 제주도에 간다"})
    store.note_speaker(CAFE, "2")
    store.set_core(CAFE, ["이 채널은 여행 이야기 전용이다"])
    memory.store._conn.close()  # a crash: no orderly close, nothing flushed at shutdown
    with Memory(db_path) as reopened:
        summary = SummaryStore(tables(reopened)).get(CAFE)
    assert summary.topic == "여행" and summary.key_points == ("준호는 다음 달에 제주도에 간다",)
    assert summary.last_speaker == "2" and summary.core == ("이 채널은 여행 이야기 전용이다",)


def test_summary_renders_markdown_and_context() -> None:
    s = ChannelSummary().merge({"topic": "games", "new_point": "<user:7> likes Zelda"}).with_speaker("7")
    markdown = s.to_markdown(global_core=("The server was founded in 2020",), names={"7": "Alice"})
    assert "**Topic:** games" in markdown and "Alice" in markdown and "founded in 2020" in markdown
    parts = s.context_lines(global_core=("core line",))
    assert parts["core"] == ["core line"] and "topic: games" in parts["head"]
    assert "Alice" not in str(parts), "the prompt form uses ids, not display names"


# -- L3 ---------------------------------------------------------------------------------------
def facts_of(memory: Memory, **kwargs) -> FactStore:
    return FactStore(memory, tables(memory), **kwargs)


def test_fact_duplicate_is_not_stored_twice(memory: Memory) -> None:
    facts = facts_of(memory)
    first = facts.add("<user:1>는 고양이 나비를 키운다.", fact_type="user_fact", topic="반려동물", guild="g1",
                      user_id="1")
    again = facts.add("<user:1>는 고양이 나비를 키운다", fact_type="user_fact", topic="반려동물", guild="g1",
                      user_id="1")
    assert first.action == "stored" and again.action == "duplicate"
    assert again.fact.block_index == first.fact.block_index
    assert len(facts.facts(user_id="1")) == 1


def test_newer_conflicting_fact_supersedes_and_keeps_history(db_path: Path) -> None:
    with Memory(db_path) as memory:
        facts = facts_of(memory)
        old = facts.add("<user:1>는 24살이다.", fact_type="user_fact", topic="나이", guild="g1", user_id="1",
                        when=100.0)
        new = facts.add("<user:1>는 25살이다.", fact_type="user_fact", topic="나이", guild="g1", user_id="1",
                        when=200.0)
        assert new.action == "superseded" and new.replaced.block_index == old.fact.block_index
    with Memory(db_path) as memory:
        facts = facts_of(memory)
        current = facts.facts(user_id="1")
        history = facts.facts(user_id="1", include_history=True)
        retired = next(f for f in history if f.text == "<user:1>는 24살이다.")
        assert memory.get(retired.block_index).text == "<user:1>는 24살이다.", "superseded, never deleted"
    assert [f.text for f in current] == ["<user:1>는 25살이다."]
    assert retired.valid_to == 200.0 and retired.superseded_by == new.fact.block_index


def test_pair_judge_rules() -> None:
    judge = PairJudge()
    same = ["고양이", "나비", "키우다"]
    assert judge.judge(0.99, same, same, "<user:1>는 고양이 나비를 키운다.", "<user:1>는 고양이 나비를 키운다",
                       True) == "duplicate"
    assert judge.judge(0.99, ["24"], ["25"], "<user:1> is 24.", "<user:1> is 25.", True) == "conflict"
    assert judge.judge(0.99, ["좋아하다"], ["좋아하다"], "<user:1>는 민트초코를 좋아하지 않는다.",
                       "<user:1>는 민트초코를 좋아한다.", True) == "conflict", "negation is a changed value"
    assert judge.judge(0.99, same, same, "<user:2>는 고양이 나비를 키운다.", "<user:1>는 고양이 나비를 키운다.",
                       True) == "distinct", "another user's fact is never a duplicate"
    assert judge.judge(0.80, ["커피"], ["녹차"], "a", "b", False) == "distinct"


def test_fact_isolation_rule() -> None:
    def row(fact_type: str, guild: str | None, user: str | None) -> FactRow:
        return FactRow(1, fact_type, "", guild, user, None, 0.0, None, None, None)

    user_g1 = row("user_fact", "g1", "u1")
    assert visible(user_g1, guild="g1", user_id="u2"), "stated in g1: visible in g1"
    assert not visible(user_g1, guild="g2", user_id="u1"), "never leaks to another guild"
    assert visible(user_g1, guild="g2", user_id="u1", global_user_facts=True), "unless configured global"
    assert not visible(user_g1, guild="g2", user_id="u2", global_user_facts=True), "global only for its own user"
    assert visible(user_g1, guild=None, user_id="u1"), "DMs with that user"
    assert not visible(user_g1, guild=None, user_id="u2"), "not in DMs with someone else"
    assert visible(row("guild_fact", "g1", None), guild="g1", user_id="x")
    assert not visible(row("guild_fact", "g1", None), guild="g2", user_id="x")
    assert not visible(row("guild_fact", "g1", None), guild=None, user_id="x")
    assert visible(row("lore", LORE_GUILD, None), guild="g9", user_id="x")
    assert visible(row("lore", LORE_GUILD, None), guild=None, user_id="x")
    retired = FactRow(1, "user_fact", "", "g1", "u1", None, 0.0, 5.0, 2, None)
    assert not visible(retired, guild="g1", user_id="u1"), "superseded facts stay out of prompts"


def test_recall_never_leaks_across_guilds_or_users(memory: Memory) -> None:
    facts = facts_of(memory)
    facts.add("<user:1>의 고양이 이름은 나비다.", fact_type="user_fact", topic="반려동물", guild="g1", user_id="1")
    facts.add("<user:2>의 고양이 이름은 초코다.", fact_type="user_fact", topic="반려동물", guild="g2", user_id="2")
    facts.add("이 서버의 고양이 마스코트는 치즈다.", fact_type="guild_fact", topic="마스코트", guild="g2")
    facts.add("<user:3>의 고양이는 DM에서 말한 까망이다.", fact_type="user_fact", topic="반려동물", guild=None,
              user_id="3")
    query = "고양이 이름이 뭐야"

    def texts(guild: str | None, user: str) -> set[str]:
        return {f.text for f, _ in facts.recall(query, guild=guild, user_id=user, k=10)}

    in_g1 = texts("g1", "1")
    assert "<user:1>의 고양이 이름은 나비다." in in_g1
    assert not any("초코" in t or "치즈" in t or "까망" in t for t in in_g1), in_g1
    in_g2 = texts("g2", "1")
    assert "나비" not in " ".join(in_g2) and "까망" not in " ".join(in_g2), in_g2
    assert {"<user:2>의 고양이 이름은 초코다.", "이 서버의 고양이 마스코트는 치즈다."} <= in_g2
    dm_1 = texts(None, "1")
    assert dm_1 == {"<user:1>의 고양이 이름은 나비다."}, dm_1
    dm_3 = texts(None, "3")
    assert dm_3 == {"<user:3>의 고양이는 DM에서 말한 까망이다."}, dm_3
    global_facts = FactStore(memory, tables(memory), global_user_facts=True)
    assert "<user:1>의 고양이 이름은 나비다." in {f.text for f, _ in global_facts.recall(query, guild="g2",
                                                                                      user_id="1")}
    assert "<user:1>의 고양이 이름은 나비다." not in {f.text for f, _ in global_facts.recall(query, guild="g2",
                                                                                         user_id="2")}


def test_lore_seeding_is_idempotent(memory: Memory, tmp_path: Path) -> None:
    lore = tmp_path / "lore.txt"
    lore.write_text("# 누리의 세계\n세계관: 누리는 기억의 도서관에 산다.\n하루는 누리의 고양이 친구다.\n\n",
                    encoding="utf-8")
    facts = facts_of(memory)
    assert facts.seed_lore(lore) == 2
    assert facts.seed_lore(lore) == 0
    assert FactStore(memory, tables(memory)).seed_lore(lore) == 0, "idempotent across restarts too"
    lore.write_text(lore.read_text(encoding="utf-8") + "도서관은 달빛 호수 아래에 있다.\n", encoding="utf-8")
    assert facts.seed_lore(lore) == 1
    seeded = facts.facts(guild=LORE_GUILD)
    assert len(seeded) == 3 and all(f.fact_type == FactType.LORE for f in seeded)
    assert {f.topic for f in seeded} == {"세계관", ""}
    recalled = facts.recall("도서관은 어디에 있어?", guild="g7", user_id="u")
    assert any("달빛 호수" in f.text for f, _ in recalled), "lore reaches every guild"
    with pytest.raises(InvalidInputError, match="not found"):
        facts.seed_lore(tmp_path / "missing.txt")


def test_fact_written_before_a_crash_is_repaired(db_path: Path) -> None:
    with Memory(db_path) as memory:
        # the block of a fact reached the file, its facts row did not (crash in between)
        memory.add("<user:5>는 부산에 산다.", kind="fact", scope={"guild": "g1", "user": "5"},
                   metadata={"fact_type": "user_fact", "topic": "거주지", "valid_from": 10.0})
    with Memory(db_path) as memory:
        facts = facts_of(memory)
        assert [f.text for f in facts.facts(user_id="5")] == ["<user:5>는 부산에 산다."]
        assert facts.repair() == 0


def test_fact_input_errors(memory: Memory) -> None:
    facts = facts_of(memory)
    with pytest.raises(InvalidInputError):
        facts.add("x is y", fact_type="rumour")
    with pytest.raises(InvalidInputError):
        facts.add("<user:1> likes tea.", fact_type="user_fact", guild="g1")  # no user id
    with pytest.raises(InvalidInputError):
        facts.add("The server meets on Fridays.", fact_type="guild_fact")  # no guild
    with pytest.raises(InvalidInputError):
        facts.add("   ", fact_type="guild_fact", guild="g1")
    with pytest.raises(InvalidInputError):
        facts.add("x" * 1001, fact_type="guild_fact", guild="g1")
    with pytest.raises(InvalidTypeError):
        facts.add("<user:1> likes tea.", fact_type="user_fact", guild="g1", user_id="1", keywords="tea")
    with pytest.raises(InvalidInputError):
        facts.add("reserved", fact_type="guild_fact", guild="gieok:lore")
    assert facts.facts() == [], "nothing stored by rejected input"


def test_forgetting_a_user_erases_facts_everywhere(memory: Memory) -> None:
    facts = facts_of(memory)
    facts.add("<user:9> lives in Busan.", fact_type="user_fact", guild="g1", user_id="9")
    facts.add("<user:9> plays the cello.", fact_type="user_fact", guild="g2", user_id="9")
    facts.add("<user:8> plays the drums.", fact_type="user_fact", guild="g2", user_id="8")
    erased = facts.forget_user("9")
    assert len(erased) == 2
    assert facts.facts(user_id="9", include_history=True) == []
    assert [f.text for f in facts.facts(user_id="8")] == ["<user:8> plays the drums."]
    assert all("Busan" not in b.text and "cello" not in b.text for b in memory.iter_blocks())

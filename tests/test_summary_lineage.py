"""L2 summaries and what they were made from: a deleted or edited message takes the summary items
made from it along (as it takes its turn and its facts), and processes sharing a database change
one summary in turn — a copy one of them read earlier is never written back over another's
erasure. Real SQLite files, the real packaged embedder, a scripted extraction model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.agent.gatekeeper import ExtractedFact, Extraction
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.conversation.recent import conversation_of, scope_key
from gieok.chat.conversation.summary import ChannelSummary, SummaryStore
from gieok.chat.llm import ScriptedLLM
from gieok.chat.llm.scripted import Request
from gieok.chat.settings import ChatSettings
from gieok.store.sqlite.store import SQLiteStore

CAFE = conversation_of("g1", "cafe")
ADDRESS = "<user:42>의 집 주소는 마포구 연남로 12다"


class Brain:
    """The extraction model: the summary update it is told to give, no facts, no replies."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary

    def __call__(self, request: Request) -> dict[str, Any]:
        if "user_facts" in request.messages[0].content:
            return {"guild_facts": [], "user_facts": [], "summary_updates": self.summary}
        return {"response_needed": False, "retrieval_needed": False, "search_query": "", "suspicious": False}


def said(message_id: str, text: str, user: str = "42") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "text": text, "user": user}


def items(summary: ChannelSummary) -> set[str]:
    return {*summary.ongoing_topics, *summary.key_points, *(x for x in (summary.topic, summary.mood) if x)}


def l1_id(pipeline: ConversationPipeline, message_id: str) -> int:
    return pipeline.tables.messages_known(scope_key(CAFE), [message_id])[message_id].message_id


def test_a_deleted_message_takes_the_summary_items_made_from_it(memory: Memory) -> None:
    brain = Brain({"topic": "이사 온 집", "new_point": ADDRESS})
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain))

    async def scenario() -> dict[str, Any]:
        first = await pipeline.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어"),
                                                           said("m2", "짐 정리 중이야")])
        assert first.extraction == "started"
        await pipeline.drain()
        summary = pipeline.summaries.get(CAFE)
        assert {"이사 온 집", ADDRESS} <= items(summary)
        assert summary.spans[f"key_points:{ADDRESS}"] == (l1_id(pipeline, "m1"), l1_id(pipeline, "m2"))
        # a later batch's point, and the operator's core, which no message made
        later = await pipeline.add_messages("g1", "cafe", [said("m3", "나는 주말마다 등산 가", user="7")])
        pipeline.summaries.update(CAFE, {"new_point": "<user:7>는 주말마다 등산한다"}, users=["7"],
                                  messages=[l1_id(pipeline, "m3")])
        pipeline.summaries.set_core(CAFE, ["반말로 대화한다"])
        assert later.stored
        return await pipeline.delete_message("g1", "cafe", "m1")

    receipt = asyncio.run(scenario())
    assert receipt["erased"] == {"messages": 1, "blocks": 1, "facts": 0, "summary_items": 2}, receipt
    summary = pipeline.summaries.get(CAFE)
    assert items(summary) == {"<user:7>는 주말마다 등산한다"} and summary.core == ("반말로 대화한다",)
    assert "마포구" not in str(summary.as_dict()) and "마포구" not in pipeline.conversation.summary_markdown(CAFE)
    assert set(summary.spans) == set(summary.sources) == {"key_points:<user:7>는 주말마다 등산한다"}
    deleted = [e for e in pipeline.events if e.kind == "message_deleted"]
    assert deleted and deleted[-1].data["summary_items"] == 2
    again = asyncio.run(pipeline.delete_message("g1", "cafe", "m1"))
    assert again["already_deleted"] and again["erased"]["summary_items"] == 0


def test_an_edit_takes_what_the_old_text_fed_the_summary(memory: Memory) -> None:
    brain = Brain({"new_point": ADDRESS})
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain))

    async def scenario() -> None:
        await pipeline.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어")])
        await pipeline.drain()
        assert ADDRESS in items(pipeline.summaries.get(CAFE))
        brain.summary = {}  # what the new text says adds nothing to the summary
        edited = await pipeline.add_messages("g1", "cafe", [said("m1", "나 이사 왔어")])
        assert [m.id for m in edited.edited] == ["m1"]
        await pipeline.drain()

    asyncio.run(scenario())
    assert items(pipeline.summaries.get(CAFE)) == set()


def test_an_extraction_that_read_a_message_deleted_meanwhile_keeps_nothing_of_it(
        memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model read the batch; the message was deleted before its answer was written. The summary
    items and the facts that answer made from it are erased all the same — both when the deletion
    is seen before they are written and when it lands between the look and the write."""
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(Brain({})))
    asyncio.run(pipeline.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어"),
                                                     said("m2", "짐 정리 중이야")]))
    asyncio.run(pipeline.drain())
    rows = pipeline.l1.since(CAFE, 0, limit=10)  # the batch as the model was shown it
    refs = {f"m{n}": row for n, row in enumerate(rows, start=1)}
    fact = ExtractedFact("<user:42>는 마포구 연남로에 산다.", "주소", ("연남로",), "42", source="m1")
    extraction = Extraction(user_facts=(fact,), summary_updates={"new_point": ADDRESS})
    asyncio.run(pipeline.delete_message("g1", "cafe", "m1"))

    looks: list[set[int]] = []
    real = pipeline._withdrawn

    def facts_looked_before_the_deletion(batch: Any) -> set[int]:  # it lands between their look and write
        looks.append(set() if len(looks) == 1 else real(batch))
        return looks[-1]

    monkeypatch.setattr(pipeline, "_withdrawn", facts_looked_before_the_deletion)
    pipeline._apply_extraction(CAFE, "g1", extraction, rows, {}, refs=refs)
    assert len(looks) == 3, "summary: one look after writing; facts: before and after"
    assert ADDRESS not in items(pipeline.summaries.get(CAFE))
    assert pipeline.facts.facts(user_id="42") == [], "the fact only the deleted message stated is gone"
    assert any(e.kind == "fact_statements_withdrawn" and e.data["facts"] for e in pipeline.events)


def test_a_second_process_never_writes_back_what_an_erasure_took(tmp_path: Path) -> None:
    """Two processes on one file (`gieok serve --workers 2`): one erases a user, the other — which
    had read the summary before — shows it without the user's items and, at its next message,
    does not write them back; and two processes' updates both stay."""
    path = tmp_path / "shared.db"
    mine, theirs, reader = SQLiteStore(str(path)), SQLiteStore(str(path)), SQLiteStore(str(path))
    a, b = SummaryStore(mine.conversation), SummaryStore(theirs.conversation)
    a.update(CAFE, {"new_point": ADDRESS}, users=["42"])
    assert ADDRESS in items(b.get(CAFE))  # the other process has it in view
    assert a.forget_user("42") == 1
    assert ADDRESS not in items(b.get(CAFE))
    b.note_speaker(CAFE, "7")  # its next message
    b.update(CAFE, {"new_point": "<user:7>는 등산을 좋아한다"}, users=["7"])
    a.update(CAFE, {"new_point": "<user:9>는 고양이를 키운다"}, users=["9"])
    stored = SummaryStore(reader.conversation).get(CAFE)
    assert items(stored) == {"<user:7>는 등산을 좋아한다", "<user:9>는 고양이를 키운다"}
    assert stored.last_speaker == "7"


def test_an_erasure_takes_the_user_from_a_summary_whose_items_a_deletion_took(tmp_path: Path) -> None:
    """Their messages deleted first (the items made of them went), then the user erased: they
    stayed a participant and the last speaker — in the summary, and hidden from their access request."""
    store = SQLiteStore(str(tmp_path / "chat.db"))
    summaries = SummaryStore(store.conversation)
    summaries.note_speaker(CAFE, "7")
    summaries.update(CAFE, {"new_point": ADDRESS}, users=["42"], messages=[3])
    summaries.note_speaker(CAFE, "42")
    assert summaries.forget_messages(CAFE, [3]) == 1
    assert summaries.items_of("42") == [{"conversation": CAFE.as_dict(), "field": "participants",
                                         "text": "<user:42>"}]
    assert summaries.forget_user("42") == 1
    kept = summaries.get(CAFE)
    assert kept.participants == ("7",) and kept.last_speaker is None and summaries.items_of("42") == []
    assert "42" not in str(kept.as_dict())


def test_items_with_no_known_messages_go_at_a_deletion(tmp_path: Path) -> None:
    """A summary written before items kept their messages (or by a caller that named none): which
    messages made an item is not known, so any deletion in the conversation takes it."""
    store = SQLiteStore(str(tmp_path / "old.db"))
    summaries = SummaryStore(store.conversation)
    summaries.update(CAFE, {"topic": "예전 요약", "new_point": "출처를 모르는 항목"}, users=["42"])
    summaries.update(CAFE, {"new_point": "m9에서 나온 항목"}, users=["42"], messages=[9])
    summaries.set_core(CAFE, ["운영자가 쓴 줄"])
    assert summaries.forget_messages(CAFE, [5]) == 2
    kept = summaries.get(CAFE)
    assert items(kept) == {"m9에서 나온 항목"} and kept.core == ("운영자가 쓴 줄",)
    assert summaries.forget_messages(CAFE, [9]) == 1 and items(summaries.get(CAFE)) == set()
    assert summaries.forget_messages(CAFE, []) == 0


def test_a_deletion_a_crash_cut_short_is_finished_by_a_retry_or_the_next_start(memory: Memory) -> None:
    """The message was marked deleted (its line gone, its id taken) and the process died before its
    turn, facts and summary items were erased. A retried DELETE used to answer `already_deleted`
    and leave them; it finishes them now, and so does the next start if nobody retries."""
    brain = Brain({"new_point": ADDRESS})
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain))

    async def store(*messages: dict[str, Any]) -> None:
        await pipeline.add_messages("g1", "cafe", list(messages))
        await pipeline.drain()

    def cut_short(message_id: str) -> int:  # what `delete_message` does before a crash: the mark alone
        seen = pipeline.tables.messages_known(scope_key(CAFE), [message_id])[message_id]
        assert seen.block_index is not None
        pipeline.tables.message_delete(scope_key(CAFE), message_id, seen.message_id, 1_790_000_000.0)
        return seen.block_index

    asyncio.run(store(said("m1", "나 연남로 12로 이사 왔어")))
    block = cut_short("m1")
    assert ADDRESS in items(pipeline.summaries.get(CAFE)) and not memory.get(block).forgotten
    retried = asyncio.run(pipeline.delete_message("g1", "cafe", "m1"))
    assert retried["already_deleted"] and retried["erased"]["blocks"] == 1 and retried["erased"]["summary_items"] == 1
    assert memory.get(block).forgotten and ADDRESS not in items(pipeline.summaries.get(CAFE))
    assert pipeline.tables.deletions_unfinished() == []

    asyncio.run(store(said("m2", "내 전화번호는 010-1234-5678이야")))
    block = cut_short("m2")
    assert [row[1] for row in pipeline.tables.deletions_unfinished()] == ["m2"]
    ConversationPipeline(memory, llm=ScriptedLLM(brain))  # the next start
    assert memory.get(block).forgotten and pipeline.tables.deletions_unfinished() == []
    assert "5678" not in str(pipeline.summaries.get(CAFE).as_dict())


def test_the_message_after_a_deleted_newest_one_is_read_by_the_extraction(memory: Memory) -> None:
    """The newest message deleted, the next one took its id (SQLite's rowid) — at the extraction's
    mark, which reads only messages after it: what it said was never extracted."""
    shown: list[str] = []

    def brain(request: Request) -> dict[str, Any]:
        if "user_facts" in request.messages[0].content:
            shown.append(request.messages[0].content)
        return Brain({})(request)

    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain), settings=ChatSettings(analysis_every=1))

    async def store(*messages: dict[str, Any]) -> str:
        done = await pipeline.add_messages("g1", "cafe", list(messages))
        await pipeline.drain()
        return done.extraction

    assert asyncio.run(store(said("m1", "안녕"), said("m2", "반가워"))) == "started"
    asyncio.run(pipeline.delete_message("g1", "cafe", "m2"))
    assert asyncio.run(store(said("m3", "나 다음 달에 부산으로 이사 가"))) == "started"
    assert "부산으로 이사" in shown[-1]


def test_an_edit_a_crash_cut_short_is_finished_at_the_next_start(memory: Memory) -> None:
    """The line took the new text and the process died before the old turn, its facts and summary
    items were erased: the old turn stayed searchable, no longer named by the message's id, and a
    resent edit was a duplicate. The next start erases them before the new turn is written."""
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(Brain({"new_point": ADDRESS})))

    async def store() -> None:
        await pipeline.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어")])
        await pipeline.drain()

    asyncio.run(store())
    seen = pipeline.tables.messages_known(scope_key(CAFE), ["m1"])["m1"]
    assert seen.block_index is not None and ADDRESS in items(pipeline.summaries.get(CAFE))
    pipeline.tables.l1_edit(seen.message_id, "나 이사 왔어", False)  # what an edit does before a crash
    assert pipeline.tables.edits_unfinished() == [(scope_key(CAFE), "m1", seen.message_id, seen.block_index)]
    ConversationPipeline(memory, llm=ScriptedLLM(Brain({})))  # the next start
    assert memory.get(seen.block_index).forgotten and pipeline.tables.edits_unfinished() == []
    assert ADDRESS not in items(pipeline.summaries.get(CAFE))
    now = pipeline.tables.messages_known(scope_key(CAFE), ["m1"])["m1"]
    assert now.block_index not in (None, seen.block_index) and memory.get(now.block_index).text.endswith("나 이사 왔어")
    assert not any("연남로" in hit.block.text for hit in memory.search("연남로 이사", k=5).hits)


def test_a_turn_another_message_wrote_under_a_reused_id_is_not_erased(memory: Memory) -> None:
    """Before L1 ids stopped being reused on SQLite, a deleted message's id record could share its
    id with the next message, and writing that message's turn named it in the deleted one's record
    too. Finishing deletions at start-up must not take that turn for the deleted message's."""
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(Brain({})))
    asyncio.run(pipeline.add_messages("g1", "cafe", [said("m2", "오늘 점심 뭐 먹지")]))
    live = pipeline.tables.messages_known(scope_key(CAFE), ["m2"])["m2"]
    with memory.store.transaction() as tx:  # type: ignore[attr-defined]  # the record an old version left
        tx.execute("INSERT INTO message_ids(scope_key, external_id, message_id, created_at, block_index, deleted_at) "
                   "VALUES (?, 'm1', ?, 1, ?, 2)", (scope_key(CAFE), live.message_id, live.block_index))
    assert [row[1] for row in pipeline.tables.deletions_unfinished()] == ["m1"]
    ConversationPipeline(memory, llm=ScriptedLLM(Brain({})))  # the next start
    assert not memory.get(live.block_index).forgotten, "the live message's turn stays"
    assert pipeline.tables.deletions_unfinished() == []
    again = asyncio.run(pipeline.delete_message("g1", "cafe", "m1"))
    assert again["already_deleted"] and again["erased"]["blocks"] == 0 and not memory.get(live.block_index).forgotten


def test_a_stored_summary_that_cannot_be_read_fails_no_read_and_no_message(tmp_path: Path) -> None:
    """A summary row that is not what summaries write (a hand edit, a damaged copy) is read as no
    summary — logged — and the next change writes a whole one over it; nothing raises."""
    store = SQLiteStore(str(tmp_path / "odd.db"))
    summaries = SummaryStore(store.conversation)
    for stored in ("not json", "[1, 2]", '{"key_points": 5, "sources": 7}'):
        with store.transaction() as tx:
            tx.execute("INSERT INTO summaries(scope_key, data, updated_at) VALUES (?, ?, 1) ON CONFLICT(scope_key) "
                       "DO UPDATE SET data = excluded.data", (scope_key(CAFE), stored))
        assert summaries.get(CAFE) == ChannelSummary()
        assert summaries.items_of("42") == [] and summaries.forget_messages(CAFE, [1]) == 0
        summaries.note_speaker(CAFE, "42")
        assert summaries.get(CAFE).last_speaker == "42"

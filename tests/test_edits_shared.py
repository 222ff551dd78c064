"""One message edited, or edited and deleted, by two processes of one memory at the same moment
(`gieok serve --workers 2` and an agent that retried its request on the other worker; two bot
replicas). Each process serialised its own edits only: both wrote a new turn for the message, the
message's id named the last one, and the other stayed — unnamed, so a later deletion of the message
left its words searchable. A real SQLite file and a real PostgreSQL, the real packaged embedder,
two pipelines."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.conversation.recent import conversation_of, scope_key
from gieok.chat.settings import ChatSettings

CAFE = conversation_of("g1", "cafe")
SETTINGS = ChatSettings(l1_size=2)  # the edited message has left L1: its new turn goes straight to memory


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where two processes' memories open the same data: a SQLite file, a PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_server").new_database())
    return str(tmp_path / "shared.db")


def said(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "text": text, "user": "42", "name": "민지"}


def live_turns_saying(memory: Memory, words: str) -> list[int]:
    return [block.block_index for block in memory.store.iter_blocks()
            if block.kind == "turn" and not block.forgotten and words in block.text]


def stored_and_trimmed(pipeline: ConversationPipeline) -> None:
    """m1 stored as a turn, then trimmed from L1 by the messages after it."""
    asyncio.run(pipeline.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어"),
                                                     said("m2", "오늘 날씨 좋다"), said("m3", "점심 뭐 먹지")]))
    asyncio.run(pipeline.add_messages("g1", "cafe", [said("m4", "배고프다")]))
    assert pipeline.tables.l1_by_external_id(scope_key(CAFE), "m1") is None


def paused(owner: Any, method: str) -> tuple[threading.Event, threading.Event]:
    """`owner.method`'s next call stops before it runs until `go` is set; `there` is set once it
    has stopped (the edit's erasure of the old turn, or its write of the new one)."""
    there, go = threading.Event(), threading.Event()
    call = getattr(owner, method)

    def held(*args: Any, **kwargs: Any) -> Any:
        there.set()
        assert go.wait(30)
        return call(*args, **kwargs)

    setattr(owner, method, held)
    return there, go


def alongside(pipeline: ConversationPipeline, work: Any) -> threading.Thread:
    """`work()` in a thread of its own; returns once it has finished or is waiting for the
    message's lease (another process holds the message)."""
    waiting, leases = threading.Event(), pipeline.memory.store.leases
    acquire = leases.acquire

    def watched(*args: Any, **kwargs: Any) -> bool:
        taken = acquire(*args, **kwargs)
        if not taken:
            waiting.set()
        return taken

    leases.acquire = watched  # type: ignore[method-assign]
    thread = threading.Thread(target=work)
    thread.start()
    while thread.is_alive() and not waiting.wait(0.01):
        pass
    return thread


def while_the_edit_writes(pipeline: ConversationPipeline, beside: Any) -> threading.Thread:
    """m1 edited by `pipeline`, stopped between its erasure of the old turn and its write of the new
    one while `beside()` starts another process's work (returning once that is done or waiting);
    then the edit goes on to its end. The other work's thread, to join."""
    there, go = paused(pipeline.memory, "remember_many")
    edit = threading.Thread(target=lambda: asyncio.run(
        pipeline.add_messages("g1", "cafe", [said("m1", "나 망원로 7로 이사 왔어")])))
    edit.start()
    try:
        assert there.wait(30), "the edit never reached its write"
        other: threading.Thread = beside()
    finally:
        go.set()
        edit.join(30)
    assert not edit.is_alive()
    return other


def test_two_processes_editing_one_message_leave_one_turn_and_a_deletion_takes_it(shared: str) -> None:
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        stored_and_trimmed(first)
        there, go = paused(first, "_erase_from_message")  # it has read which turn the message names
        edit = threading.Thread(target=lambda: asyncio.run(
            first.add_messages("g1", "cafe", [said("m1", "나 망원로 7로 이사 왔어")])))
        edit.start()
        try:
            assert there.wait(30), "the first edit never reached its write"
            # the same edit, resent to the other process while the first is still at it
            resent = alongside(second, lambda: asyncio.run(
                second.add_messages("g1", "cafe", [said("m1", "나 망원로 7로 이사 왔어")])))
        finally:
            go.set()
            edit.join(30)
        resent.join(30)
        assert not edit.is_alive() and not resent.is_alive()
        turns = live_turns_saying(other, "망원로")
        assert len(turns) == 1, f"one message, one turn: {turns}"
        assert first.tables.messages_known(scope_key(CAFE), ["m1"])["m1"].block_index == turns[0]

        asyncio.run(second.delete_message("g1", "cafe", "m1"))
        assert live_turns_saying(other, "망원로") == [] and live_turns_saying(other, "연남로") == []
        assert not any("망원로" in hit.block.text for hit in other.search("망원로 이사", k=5).hits)
        assert one.verify().ok


def test_an_edit_and_a_deletion_at_once_leave_nothing_of_the_message(shared: str) -> None:
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        stored_and_trimmed(first)
        deletion = while_the_edit_writes(first, lambda: alongside(
            second, lambda: asyncio.run(second.delete_message("g1", "cafe", "m1"))))
        deletion.join(30)
        assert not deletion.is_alive()
        assert live_turns_saying(other, "망원로") == [] and live_turns_saying(other, "연남로") == []
        assert second.tables.messages_known(scope_key(CAFE), ["m1"])["m1"].deleted


def test_an_edit_while_another_process_writes_the_turn_of_the_old_text(shared: str) -> None:
    """One process writing a new message's turn (its text read, its vector made) as another stores
    an edit of it: the turn was linked with the text read before the edit, the line took the new
    text, and no turn of the new text was ever written — the words the author edited away stayed
    the message's turn."""
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        there, go = paused(first.memory, "remember_many")  # the line read, its turn not yet written
        sent = threading.Thread(target=lambda: asyncio.run(
            first.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어")])))
        sent.start()
        try:
            assert there.wait(30), "the message's turn was never written"

            async def edit() -> None:  # its turn written behind, after the first process's write
                await second.add_messages("g1", "cafe", [said("m1", "나 망원로 7로 이사 왔어")], index="behind")
                go.set()
                sent.join(30)
                await second.drain()

            asyncio.run(edit())
        finally:
            go.set()
            sent.join(30)
        assert not sent.is_alive()
        second.commit_pending()
        named = second.tables.messages_known(scope_key(CAFE), ["m1"])["m1"].block_index
        assert named is not None and other.get(named).text.endswith("나 망원로 7로 이사 왔어")
        assert live_turns_saying(other, "연남로") == [], "the edited-away text is still a turn"
        assert live_turns_saying(other, "망원로") == [named]


def test_an_edit_stored_during_the_authors_erasure_elsewhere_keeps_nothing(shared: str) -> None:
    """The author asked to be forgotten while an edit of an old message of theirs was being stored
    by another process: the erasure listed their blocks before the edit wrote its new turn, and that
    turn stayed — their words, after their erasure."""
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        stored_and_trimmed(first)
        erasure = while_the_edit_writes(first, lambda: alongside(second, lambda: second.forget_user("42")))
        erasure.join(60)
        assert not erasure.is_alive()
        for words in ("망원로", "연남로", "날씨", "배고프다"):
            assert live_turns_saying(other, words) == [], words
        assert not other.search("망원로 이사", k=5, scope={"user": "42"}).hits


def test_an_edit_after_the_authors_erasure_began_elsewhere_writes_no_turn(shared: str) -> None:
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        stored_and_trimmed(first)
        there, go = paused(second.conversation, "_erase")  # begun (recorded), nothing erased yet
        erasure = threading.Thread(target=lambda: second.forget_user("42"))
        erasure.start()
        try:
            assert there.wait(30), "the erasure never began"
            done = asyncio.run(first.add_messages("g1", "cafe", [said("m1", "나 망원로 7로 이사 왔어")]))
            assert done.edited == [], "no turn of the author's is written once their erasure began"
        finally:
            go.set()
            erasure.join(60)
        assert not erasure.is_alive()
        for words in ("망원로", "연남로", "날씨", "배고프다"):
            assert live_turns_saying(other, words) == [], words


def test_a_message_written_elsewhere_during_its_authors_erasure_keeps_no_turn(shared: str) -> None:
    """The erasure lists the user's blocks, erases them, then deletes their lines; a process that
    wrote one of their lines as a turn in between linked a turn no step after it looks for."""
    with Memory(shared) as one, Memory(shared) as other:
        first, second = ConversationPipeline(one, settings=SETTINGS), ConversationPipeline(other, settings=SETTINGS)
        asyncio.run(first.add_messages("g1", "cafe", [said("m1", "나 연남로 12로 이사 왔어")], index="behind"))
        there, go = paused(second.memory, "forget_with_neighbours")  # the user's blocks listed
        erasure = threading.Thread(target=lambda: second.forget_user("42"))
        erasure.start()
        try:
            assert there.wait(30), "the erasure never listed the blocks"
            first.commit_pending()  # the line written behind, now
        finally:
            go.set()
            erasure.join(60)
        assert not erasure.is_alive()
        assert live_turns_saying(other, "연남로") == []
        assert first.tables.l1_count(scope_key(CAFE)) == 0

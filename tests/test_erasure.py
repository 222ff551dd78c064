"""Erasure that reaches every copy (issue 39): a conversation of three users — facts, summaries,
working-memory promotions, STM, checkpoints, cached searches, events (the in-process buffer and the
Redis stream) and a kept idempotent answer — then one user erased, and every table of the store
(enumerated from its catalogue, so a table added later is scanned too), the search indexes and the
event logs scanned for her messages and her words: nothing. Real SQLite and PostgreSQL, the real
embedder, a real Redis; the extraction model is scripted in process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.conversation.memory import ConversationMemory
from gieok.chat.conversation.recent import conversation_of
from gieok.chat.llm import ScriptedLLM
from gieok.chat.llm.scripted import Request
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection, SharedEventLog
from gieok.server.events import EventBus
from gieok.store.factory import open_store
from store_backends import Backend

MINJI, ALEX, JISOO = "u-minji", "u-alex", "u-jisoo"
CAFE = {"channel": "cafe", "guild": "g1"}
T0 = 1_790_000_000.0
# What only 민지 ever wrote: none of it may survive her erasure.
HER_WORDS = ("해운대", "라벤더차", "쿼카빌", "Quokkaville", "초코칩쿠키")
MESSAGES = [
    ("m1", MINJI, "민지", "나 해운대 근처로 이사했어, 라벤더차 마시면서 바다 봐"),
    ("m2", ALEX, "Alex", "Nice! I still live in Berlin, the weather is grey"),
    ("m3", MINJI, "민지", "우리 고양이 이름은 Quokkaville 이야 ㅋㅋ 쿼카빌"),
    ("m4", JISOO, "지수", "나는 주말에 등산 가려고, 같이 갈 사람?"),
    ("m5", MINJI, "민지", "Alex 너 베를린 회사 그만둔다며? 초코칩쿠키 사 갈게"),
    ("m6", ALEX, "Alex", "민지 말이 맞아, I am leaving Nuvola next month"),
    ("m7", JISOO, "지수", "오늘 점심은 김밥"),
    ("m8", MINJI, "민지", "해운대 바다 사진 보내줄게 라벤더차 한잔 하면서"),
]


def _brain(request: Request) -> dict[str, Any]:
    """The extraction model: facts about 민지 from her messages, a fact about Alex that she
    stated, one Alex stated himself, and a summary point made from the whole batch."""
    text = request.messages[-1].content
    if "user_facts" not in text:
        return {"response_needed": False, "retrieval_needed": False, "search_query": ""}
    refs = {line.split()[0].lstrip("["): line for line in text.splitlines() if line.startswith("[m")}
    by_text = {m[3]: ref for ref, line in refs.items() for m in MESSAGES if line.endswith(m[3])}
    facts = []
    for message_id, _user, _, said in MESSAGES:
        ref = by_text.get(said)
        if ref is None:
            continue
        if message_id == "m1":
            facts.append({"user_id": MINJI, "fact": f"<user:{MINJI}>는 해운대 근처에 산다.", "source": ref})
        if message_id == "m3":
            facts.append({"user_id": MINJI, "fact": f"<user:{MINJI}>의 고양이 이름은 쿼카빌이다.", "source": ref})
        if message_id == "m5":  # 민지 says something about Alex: derived from her message
            facts.append({"user_id": ALEX, "fact": f"<user:{ALEX}>는 초코칩쿠키를 좋아한다.", "source": ref})
        if message_id == "m2":
            facts.append({"user_id": ALEX, "fact": f"<user:{ALEX}> lives in Berlin.", "source": ref})
    return {"guild_facts": [], "user_facts": facts,
            "summary_updates": {"topic": "이사와 고양이", "new_point": "민지가 해운대로 이사했다 (라벤더차)"}}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _needles() -> list[str]:
    return [*HER_WORDS, *(said for _, user, _, said in MESSAGES if user == MINJI)]


def _tables(store: Any, backend: str) -> list[tuple[str, list[str]]]:
    """Every table of the store and its columns, from the database's own catalogue."""
    if backend == "sqlite":
        names = [r[0] for r in store.fetch("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return [(name, [c[1] for c in store.fetch(f'PRAGMA table_info("{name}")')]) for name in names]
    rows = store.db.fetch("SELECT table_name, column_name FROM information_schema.columns "
                          "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")
    tables: dict[str, list[str]] = {}
    for table, column in rows:
        tables.setdefault(table, []).append(column)
    return list(tables.items())


def _scan(location: str, backend: str, needles: list[str]) -> list[str]:
    """(table.column: needle) for every stored value holding a needle, text or bytes (UTF-8)."""
    store = open_store(location)
    found: list[str] = []
    try:
        fetch = store.fetch if backend == "sqlite" else store.db.fetch
        tables = _tables(store, backend)
        assert {"blocks", "facts", "fact_sources", "l1_messages", "summaries", "wm_slots", "stm_entries",
                "idempotency_keys", "user_names"} <= {t for t, _ in tables}
        for table, columns in tables:
            for row in fetch(f'SELECT {", ".join(chr(34) + c + chr(34) for c in columns)} FROM "{table}"'):
                for column, value in zip(columns, row):
                    if isinstance(value, memoryview):
                        value = bytes(value)
                    text = value.decode("utf-8", "ignore") if isinstance(value, bytes) else value
                    if isinstance(text, str):
                        found += [f"{table}.{column}: {n}" for n in needles if n in text]
    finally:
        store.close()
    return found


def _cached_with(cache: Any, needles: list[str]) -> list[str]:
    """The keys of an embedding cache (its private table: no API lists them) that hold a needle."""
    return [text for _, text in list(cache._cache) if any(n in text for n in needles)]


def test_erasure_reaches_every_copy(backend: Backend, redis_url: str, redis_namespace: str) -> None:
    shared = SharedEventLog(RedisConnection(redis_url, redis_namespace))
    bus = EventBus()
    memory = Memory(backend.location)
    memory.listener = lambda kind, data: (bus.publish("acme", kind, data), shared.append("acme", kind, 0.0, data))
    try:
        pipeline = ConversationPipeline(memory, llm=ScriptedLLM(_brain), classifier=None,
                                        settings=ChatSettings.over(memory.settings, analysis_every=1))
        async def feed() -> None:  # one loop: the extractions run in its background
            wire = [{"id": message_id, "role": "user", "user": user, "name": name, "text": said,
                     "time": T0 + 60 * number} for number, (message_id, user, name, said) in enumerate(MESSAGES)]
            for pair in range(0, len(wire), 2):  # a batch with Alex in it: a fact about him may be learned
                await pipeline.add_messages("g1", "cafe", wire[pair:pair + 2])
                await pipeline.drain()
                memory.search("해운대 라벤더차 바다", k=3, scope=conversation_of("g1", "cafe"))  # cached
                for slot in memory.working.slots(conversation_of("g1", "cafe")):  # recalled from working
                    if slot.metadata.get("speaker") == MINJI:                     # memory: promoted when
                        memory.working.touch(slot)                                # evicted

        _run(feed())
        for slot in memory.working.slots(conversation_of("g1", "cafe")):  # as an eviction does
            if slot.metadata.get("speaker") == MINJI:
                memory.working.promote_slot(slot, reason="evicted")
        conversation = pipeline.conversation
        facts = conversation.facts.facts(include_history=True)
        assert {f.user_id for f in facts} >= {MINJI, ALEX} and len(facts) >= 4
        assert any("해운대" in p for p in conversation.summaries.get(conversation_of("g1", "cafe")).key_points)
        notes = [b for b in memory.iter_blocks() if b.kind == "note" and not b.forgotten]
        assert any("해운대" in b.text for b in notes), "a working-memory slot of hers was promoted"
        assert memory.stm_entries(conversation_of("g1", "cafe")), "STM holds the turns"
        # a kept answer of an idempotent write that returned her block
        idem = memory.store.idempotency
        assert idem.claim("retry-1", "fp", "me", time.time(), expire_before=0, stale_before=0) is None
        her_block = next(b for b in memory.iter_blocks() if b.text == MESSAGES[0][3])
        idem.finish("retry-1", "me", 201, json.dumps({"block_index": her_block.block_index, "text": her_block.text},
                                                     ensure_ascii=False))
        assert _scan(backend.location, backend.name, _needles()), "the scan sees her data before the erasure"
        next_turn = next(b for b in memory.iter_blocks() if b.text == MESSAGES[1][3])  # embedded with m1 as context
        before = memory.vectors_of([next_turn.block_index])[0]
        # the vectors cached by text in this process: e5's (passages, her newest message's query) and the
        # guard's encoder's (each user message); her messages, not the searches that used her words
        caches = {"e5": memory.embedder, "guard encoder": pipeline.encoder}
        hers = [said for _, user, _, said in MESSAGES if user == MINJI]
        assert all(_cached_with(cache, hers) for cache in caches.values())

        receipt = conversation.forget_user(MINJI)

        assert receipt["messages"] >= 4 and receipt["facts"] >= 3 and receipt["summary_items"] >= 1
        assert receipt["neighbours_reembedded"] >= 1 and receipt["stored_answers"] == 1
        left = _scan(backend.location, backend.name, _needles())
        assert left == [], left
        for name, cache in caches.items():
            assert _cached_with(cache, hers) == [], name
        # the event logs up to now: nothing that held her data, in process or in Redis
        held = [e for e in bus.recent("acme", n=10_000) if any(n in json.dumps(e.data, ensure_ascii=False)
                                                                 for n in [*_needles(), MINJI])]
        assert held == [], held[:3]
        logged = [e for e in shared.after("acme", 0) if any(n in json.dumps(e.data, ensure_ascii=False)
                                                            for n in [*_needles(), MINJI])]
        assert logged == [], logged[:3]
        erased = bus.recent("acme", "user.erased", 1)[0].data
        assert set(erased) == {"blocks"} and erased["blocks"] >= receipt["blocks"], "a count, not whose"
        # the neighbour's vector no longer holds her words: it is its own passage now
        after = memory.vectors_of([next_turn.block_index])[0]
        alone = memory.embedder.embed_passages(["Alex: " + MESSAGES[1][3]])[0]
        assert float(np.dot(after, alone)) > 0.999 and float(np.dot(before, alone)) < 0.999
        # what the others see: nothing of hers in search or context, their own data intact
        for query in (*HER_WORDS, "민지 어디 살아", "고양이 이름"):
            hits = memory.search(query, k=20)
            assert not any(n in hit.block.text for hit in hits for n in _needles()), query
        context = pipeline.agent_context("g1", "cafe", user=ALEX, query="민지 해운대 라벤더차")
        assert not any(n in context.text for n in HER_WORDS), context.text
        assert [f.text for f in conversation.facts.facts(user_id=ALEX)] == [f"<user:{ALEX}> lives in Berlin."]
        assert any(m.content == MESSAGES[5][3] for m in conversation.l1.recent(conversation_of("g1", "cafe"))), \
            "Alex's message that names her stays (his speech)"
        assert memory.verify().ok
        # an access request for her now holds nothing
        data = json.loads("".join(conversation.user_data(MINJI)))
        assert data["messages"] == [] and data["facts"] == [] and data["summary_items"] == []
    finally:
        memory.close()
        shared.connection.close()


def test_a_deleted_message_leaves_no_copy_in_the_store_the_stream_or_the_caches(backend: Backend) -> None:
    """One message deleted (`DELETE /v1/conversations/messages/m1`): its words are in no table (the
    catalogue's every table, scanned), in no event the stream still holds — its turn's
    `memory.added`, the `search.answered` that showed it, the fact's event, the `summary.updated`
    that showed the point made from it (`summary.withdrawn` redacts those), in no note working memory
    promoted from it — and in no cache kept by text; the other messages' facts and turns stay."""
    bus = EventBus()
    memory = Memory(backend.location)
    memory.listener = bus.listener("acme")
    first = ("나 해운대 근처로 이사했어, 라벤더차 마시면서 바다 봐", "해운대", "라벤더차")
    try:
        pipeline = ConversationPipeline(memory, llm=ScriptedLLM(_brain), classifier=None,
                                        settings=ChatSettings.over(memory.settings, analysis_every=1))

        async def feed() -> None:
            wire = [{"id": message_id, "role": "user", "user": user, "name": name, "text": said,
                     "time": T0 + 60 * number} for number, (message_id, user, name, said) in enumerate(MESSAGES[:4])]
            for pair in range(0, len(wire), 2):
                await pipeline.add_messages("g1", "cafe", wire[pair:pair + 2])
                await pipeline.drain()
            memory.search("해운대 라벤더차 바다", k=3, scope=conversation_of("g1", "cafe"))

        _run(feed())
        working = memory.layers.working  # her turn recalled, then let go: kept as a note, a copy of it
        slot = next(s for s in working.all_slots() if s.content == first[0])
        working.touch(slot)
        assert working.promote_slot(slot, reason="evicted") is not None
        assert [b.text for b in memory.iter_blocks() if b.kind == "note"] == [first[0]]
        shown = json.dumps([e.data for e in bus.recent("acme", n=10_000)], ensure_ascii=False)
        assert all(word in shown for word in first), "the stream showed her message before"
        assert any(e.type == "summary.updated" and "해운대" in json.dumps(e.data, ensure_ascii=False)
                   for e in bus.recent("acme", n=10_000))
        receipt = _run(pipeline.delete_message("g1", "cafe", "m1"))
        assert receipt["erased"]["blocks"] == 2 and receipt["erased"]["facts"] >= 1  # her turn and its note
        assert _scan(backend.location, backend.name, list(first)) == []
        held = [e for e in bus.recent("acme", n=10_000) if any(w in json.dumps(e.data, ensure_ascii=False)
                                                               for w in first)]
        assert held == [], held[:3]
        assert bus.recent("acme", "summary.withdrawn", 1), "the stream says the summary lost items"
        # her message in no cached vector (the search that used her words is the searcher's own query)
        assert _cached_with(memory.embedder, [first[0]]) == [] and _cached_with(pipeline.encoder, [first[0]]) == []
        facts = pipeline.conversation.facts.facts(include_history=True)
        assert any("쿼카빌" in f.text for f in facts) and not any("해운대" in f.text for f in facts)
        assert any(e.type == "memory.added" and "Quokkaville" in json.dumps(e.data, ensure_ascii=False)
                   for e in bus.recent("acme", n=10_000)), "the others' events stay"
    finally:
        memory.close()


def test_what_the_model_made_of_a_deleted_message_leaves_the_stream(tmp_path: Path) -> None:
    """A fact the model read in a message and gieok did not keep (here: it does not name its user)
    is on the stream with the message it came from (`"source"`); deleting the message redacts it,
    as the message's own events. A fact of a message deleted while the model read it is said
    withdrawn without its text."""
    def brain(request: Request) -> dict[str, Any]:
        text = request.messages[-1].content
        if "user_facts" not in text:
            return {"response_needed": False, "retrieval_needed": False, "search_query": ""}
        refs = [line.split()[0].lstrip("[") for line in text.splitlines() if line.startswith("[m")]
        return {"guild_facts": [], "summary_updates": {},
                "user_facts": [{"user_id": MINJI, "fact": "해운대 근처 라벤더 농장 옆에 산다.", "source": refs[0]}]}

    bus = EventBus()
    with Memory(tmp_path / "m.db") as memory:
        memory.listener = bus.listener("acme")
        pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain), classifier=None,
                                        settings=ChatSettings.over(memory.settings, analysis_every=1))

        async def feed() -> None:
            await pipeline.add_messages("g1", "cafe", [{"id": "m1", "role": "user", "user": MINJI, "name": "민지",
                                                        "text": MESSAGES[0][3], "time": T0}])
            await pipeline.drain()

        _run(feed())
        rejected = [e for e in bus.recent("acme", n=1000) if e.type == "pipeline.fact_rejected"]
        assert rejected and rejected[0].data["source"] == "m1" and "라벤더 농장" in rejected[0].data["fact"]
        _run(pipeline.delete_message("g1", "cafe", "m1"))
        shown = json.dumps([e.data for e in bus.recent("acme", n=1000)], ensure_ascii=False)
        assert "라벤더" not in shown and "해운대" not in shown, shown


def test_an_erasure_before_the_turns_written_behind_leaves_nothing(tmp_path: Path) -> None:
    """Messages added with `index="behind"` are erased before their turn blocks are written: the
    background write that follows finds her rows gone and writes no block of hers (every table
    scanned), nor a vector of her messages in the cache; the others' turns are written."""
    location = str(tmp_path / "behind.db")
    memory = Memory(location)
    try:
        pipeline = ConversationPipeline(memory, classifier=None)

        async def add_then_erase() -> dict[str, Any]:
            wire = [{"id": message_id, "role": "user", "user": user, "name": name, "text": said,
                     "time": T0 + 60 * number} for number, (message_id, user, name, said) in enumerate(MESSAGES)]
            added = await pipeline.add_messages("g1", "cafe", wire, index="behind")
            assert added.index == "behind" and all(m.block_index is None for m in added.stored)
            receipt = pipeline.conversation.forget_user(MINJI)  # before the write behind has run
            await pipeline.drain()
            return receipt

        receipt = _run(add_then_erase())
        assert receipt["l1_rows"] == 4 and receipt["blocks"] == 0  # no turn block of hers existed yet
        assert _scan(location, "sqlite", _needles()) == []
        hers = [said for _, user, _, said in MESSAGES if user == MINJI]
        assert _cached_with(memory.embedder, hers) == []
        written = sorted(b.text for b in memory.iter_blocks() if not b.forgotten)
        assert written == sorted(said for _, user, _, said in MESSAGES if user != MINJI)
        assert memory.store.conversation.l1_pending() == []
    finally:
        memory.close()


def test_a_delete_or_an_edit_meeting_the_write_behind_leaves_no_block_of_the_old_text(tmp_path: Path) -> None:
    """The write behind links a message's turn block just after a delete (or an edit) first looked
    the message up (here: forced, right after that look). The delete still forgets the block and
    the edit still forgets the old text's block: both look the message up again under the commit
    lock. (Seen in CI: the delete answered 200 and the deleted message's turn stayed live.)"""
    memory = Memory(str(tmp_path / "race.db"))
    try:
        pipeline = ConversationPipeline(memory, classifier=None)
        pipeline._write_behind = lambda *args, **kwargs: None  # type: ignore[assignment,method-assign,return-value]
        cafe = conversation_of("g1", "cafe")
        looked_up = pipeline.tables.messages_known
        armed: set[str] = set()
        writers: list[threading.Thread] = []

        def look_then_write_behind(key: str, ids: list[str]) -> Any:
            seen = looked_up(key, ids)
            if armed & set(ids):  # the write behind comes right after this look
                armed.difference_update(ids)
                writer = threading.Thread(target=pipeline.commit_pending, args=(cafe,))
                writer.start()
                writer.join(2)  # done, or waiting for the commit lock the caller holds
                writers.append(writer)
            return seen

        pipeline.tables.messages_known = look_then_write_behind  # type: ignore[method-assign]

        async def scenario() -> None:
            secret = {"id": "d1", "role": "user", "user": MINJI, "name": "민지",
                      "text": "비밀번호 힌트는 보리 생일이야", "time": T0}
            first = {"id": "e1", "role": "user", "user": ALEX, "name": "Alex", "text": "I moved to Busan last week",
                     "time": T0 + 60}
            await pipeline.add_messages("g1", "cafe", [secret, first], index="behind")
            armed.add("d1")
            await pipeline.delete_message("g1", "cafe", "d1")
            armed.add("e1")
            await pipeline.add_messages("g1", "cafe", [{**first, "text": "I moved to Daegu last week"}],
                                        index="behind")

        _run(scenario())
        for writer in writers:
            writer.join(30)
        assert len(writers) == 2 and not any(writer.is_alive() for writer in writers)
        live = {b.text for b in memory.iter_blocks() if not b.forgotten}
        assert "비밀번호 힌트는 보리 생일이야" not in live and "I moved to Busan last week" not in live, live
    finally:
        memory.close()


def test_an_erasure_empties_the_function_caches_keyed_by_stored_text(tmp_path: Path) -> None:
    """Caches of functions whose keys hold a message, a fact or a name (callbacks.cleared_on_erasure:
    the context's dates, the fact judge's parses, name keys) are emptied by any erasure, so an erased
    text does not stay in memory as a key."""
    from zoneinfo import ZoneInfo

    from gieok.chat.agent.context import _resolved
    from gieok.chat.conversation.fact_align import _tokens_with_pronoun, _word_roles
    from gieok.text.romanize import name_key
    from gieok.text.tokenize import _stem_word

    said = "민지: 다음 주 금요일에 해운대 가"
    with Memory(tmp_path / "m.db") as memory:
        block = memory.add(said)
        english = memory.add("Minji: my wifi password is hunter2 and the door code is brambleworth")
        _resolved(said, T0, ZoneInfo("Asia/Seoul"))
        _tokens_with_pronoun("<user:1>는 해운대에 산다.")
        _word_roles("그는 해운대에 산다.")
        name_key("민지")
        caches = (_resolved, _tokens_with_pronoun, _word_roles, name_key, _stem_word)
        assert all(cache.cache_info().currsize > 0 for cache in caches)
        memory.forget([block.block_index, english.block_index])
        assert [cache.cache_info().currsize for cache in caches] == [0, 0, 0, 0, 0]


KILLED = textwrap.dedent("""
    import sys
    from gieok import Memory
    from gieok.chat.conversation.memory import ConversationMemory
    with Memory(sys.argv[1]) as memory:
        ConversationMemory(memory).forget_user("u-many")
""")


def test_an_erasure_killed_midway_finishes_on_the_next_open(tmp_path: Path) -> None:
    """kill -9 while 2,000 messages of one user are being erased: the next open finishes it."""
    path = tmp_path / "big.db"
    rng = np.random.default_rng(39)
    with Memory(path) as memory:
        dim = memory.embedder.dimension
        items = [{"text": f"비밀 메시지 {i} 쿼카빌{i}", "scope": {"channel": "mine", "user": "u-many"},
                  "speaker": "u-many", "event_time": T0 + i} for i in range(2000)]
        vectors = rng.normal(size=(len(items), dim)).astype(np.float32)
        memory.add_many(items, vectors=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        memory.add("someone else's note", scope={"channel": "other"})
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], env={**os.environ})
    probe = open_store(str(path))
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and child.poll() is None:
            if probe.conversation.erasures_pending():
                break
            time.sleep(0.002)
        live = probe.conversation.erasures_pending()
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        probe.close()
    assert live == ["u-many"], "the erasure was under way when it was killed"
    with Memory(path) as memory:
        reopened = ConversationMemory(memory)  # finishes what the crash cut short
        assert reopened.tables.erasures_pending() == []
        assert not [b for b in memory.iter_blocks() if not b.forgotten and b.scope.user == "u-many"]
        assert memory.verify().ok
        assert memory.search("비밀 메시지 쿼카빌", k=5).hits[0].block.text == "someone else's note" or \
            not memory.search("비밀 메시지 쿼카빌", k=5).hits
    assert _scan(str(path), "sqlite", ["쿼카빌", "비밀 메시지"]) == []


def test_a_users_erasure_takes_the_replies_that_answered_them(backend: Backend) -> None:
    """"forgetme" left the bot's replies to the user — which repeat what they said — in every table
    and in the next prompt; a deleted message's reply already went with it. A reply answers what was
    said since the last reply: found in the recent rows, and among the turns once those have moved
    on (`l1_size` 3 here). Another user's reply, and the user's erasure's neighbours, stay."""
    memory = Memory(backend.location)
    try:
        pipeline = ConversationPipeline(memory, llm=None, classifier=None,
                                        settings=ChatSettings.over(memory.settings, l1_size=3))

        def said(number: int, role: str, text: str, user: str | None = None) -> dict[str, Any]:
            return {"id": f"m{number}", "role": role, "text": text, "time": T0 + 60 * number,
                    **({"user": user, "name": user} if user else {})}

        async def feed() -> None:
            for number, message in enumerate([
                    said(1, "user", "내 사물함 비밀번호는 ZZOLDLOCK 이야", MINJI),
                    said(2, "assistant", "알겠어, ZZOLDLOCK 잘 기억해둘게"),
                    said(3, "user", "I like hiking on weekends", ALEX),
                    said(4, "assistant", "Hiking sounds lovely, Alex"),
                    said(5, "user", "그리고 새 비번은 ZZNEWLOCK 으로 바꿨어", MINJI),
                    said(6, "user", "what's for lunch?", ALEX),
                    said(7, "assistant", "점심은 모르겠지만 ZZNEWLOCK 은 기억했어")]):
                await pipeline.add_messages("g1", "cafe", [message])
                assert number < 6 or pipeline.tables.l1_count() == 3

        _run(feed())
        data = json.loads("".join(pipeline.conversation.user_data(MINJI)))
        assert sorted(r["text"] for r in data["replies"]) == ["알겠어, ZZOLDLOCK 잘 기억해둘게",
                                                                "점심은 모르겠지만 ZZNEWLOCK 은 기억했어"]
        receipt = pipeline.forget_user(MINJI)
        assert receipt["messages"] == 4, receipt  # her two turns, and the two replies that answered them
        assert _scan(backend.location, backend.name, ["ZZOLDLOCK", "ZZNEWLOCK"]) == []
        kept = sorted(b.text for b in memory.iter_blocks() if b.kind == "turn" and not b.forgotten)
        assert kept == ["Hiking sounds lovely, Alex", "I like hiking on weekends", "what's for lunch?"]
    finally:
        memory.close()

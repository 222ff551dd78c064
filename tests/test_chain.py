"""The SHA-256 chain: verify, forget (erase content, keep the chain) and tamper detection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gieok import BlockNotFoundError, GieokError, InvalidTypeError, Memory
from gieok.chain import GENESIS, block_hash, content_digest


def _raw(path: Path) -> sqlite3.Connection:
    """A second, plain connection to the file: what an attacker or a bad script would use."""
    return sqlite3.connect(path, isolation_level=None)


def test_verify_ok_after_adds(seeded) -> None:
    memory, blocks = seeded
    memory.add("하나 더", scope={"channel": "cafe"})
    memory.add_many(["one more", "and another"])
    report = memory.verify()
    assert report.ok
    assert report.checked == len(blocks) + 3
    assert report.forgotten == 0 and report.first_bad_index is None and report.reason == ""
    assert report.as_dict() == {"ok": True, "checked": 18, "forgotten": 0, "first_bad_index": None, "reason": ""}


def test_empty_store_verifies(memory: Memory) -> None:
    report = memory.verify()
    assert report.ok and report.checked == 0


def test_hashes_recompute_from_public_fields(seeded) -> None:
    _memory, blocks = seeded
    prev = GENESIS
    for b in blocks:
        digest = content_digest(b.text, b.speaker, list(b.keywords), list(b.tags), b.metadata)
        assert digest == b.content_digest
        assert b.prev_hash == prev
        assert b.hash == block_hash(block_index=b.block_index, prev_hash=b.prev_hash, kind=b.kind,
                                    guild=b.scope.guild, channel=b.scope.channel, user=b.scope.user,
                                    event_time=b.event_time, insert_time=b.insert_time, importance=b.importance,
                                    conv_pos=b.conv_pos, digest=digest)
        prev = b.hash


def test_forget_erases_content_and_keeps_chain(seeded, db_path: Path) -> None:
    memory, blocks = seeded
    victim = blocks[13]  # the fact "민지는 서울 마포구에 살아", with metadata and keywords
    assert victim.metadata and victim.keywords and victim.kind == "fact"
    turn = blocks[7]  # "A golden retriever. His name is Max ...", speaker Alice, channel lounge
    assert turn.speaker == "Alice"

    # both are found before
    assert victim.block_index in {h.block.block_index for h in memory.search("마포구 서울", mode="bm25")}
    assert turn.block_index in {h.block.block_index for h in memory.search("golden retriever Max", mode="vector", k=3)}

    assert memory.forget([victim.block_index, turn.block_index]) == [victim.block_index, turn.block_index]

    report = memory.verify()
    assert report.ok and report.checked == 15 and report.forgotten == 2

    for original in (victim, turn):
        gone = memory.get(original.block_index)
        assert gone.forgotten
        assert gone.text == "" and gone.speaker is None
        assert gone.keywords == () and gone.tags == () and gone.metadata == {}
        # the header and the digest stay: the chain still proves something was there
        assert gone.content_digest == original.content_digest
        assert gone.hash == original.hash and gone.prev_hash == original.prev_hash
        assert (gone.kind, gone.scope, gone.event_time, gone.conv_pos) == (
            original.kind, original.scope, original.event_time, original.conv_pos)

    for query in ("마포구 서울 민지", "golden retriever Max beach", "민지는 서울 마포구에 살아"):
        for mode in ("bm25", "vector", "hybrid"):
            got = {h.block.block_index for h in memory.search(query, k=50, mode=mode)}
            assert victim.block_index not in got and turn.block_index not in got, (query, mode)
    # nor through neighbour spreading from the turn before it
    got = {h.block.block_index for h in memory.search("That's great! What breed is he?", k=50)}
    assert turn.block_index not in got

    with _raw(db_path) as conn:
        row = conn.execute("SELECT text, speaker, keywords, tags, metadata, forgotten_at FROM blocks "
                           "WHERE block_index = ?", (turn.block_index,)).fetchone()
        assert row[:5] == ("", None, "[]", "[]", "{}") and row[5] is not None
        for table, column in (("embeddings", "block_index"), ("blocks_fts", "rowid")):
            count = conn.execute(f"SELECT count(*) FROM {table} WHERE {column} IN (?, ?)",
                                 (victim.block_index, turn.block_index)).fetchone()[0]
            assert count == 0, table

    # forgetting again is a no-op, not an error
    assert memory.forget(turn.block_index) == []
    assert memory.verify().forgotten == 2


def test_forget_survives_reopen(seeded, db_path: Path) -> None:
    memory, _blocks = seeded
    memory.forget(1)
    memory.close()
    with Memory(db_path) as reopened:
        assert reopened.get(1).forgotten
        assert 1 not in {h.block.block_index for h in reopened.search("민지는 고양이를 키워", k=50)}
        assert reopened.verify().ok


def test_forget_leaves_no_trace_of_the_text_in_the_file(memory: Memory, db_path: Path) -> None:
    memory.add_many(["an ordinary line", "my passphrase is zebraunicorn quokkaflamingo", "another line"])
    memory.forget(2)
    memory.close()
    data = db_path.read_bytes()
    wal = Path(f"{db_path}-wal")
    if wal.exists():
        data += wal.read_bytes()
    assert b"zebraunicorn" not in data and b"quokkaflamingo" not in data


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("UPDATE blocks SET text = '민지는 개를 키워' WHERE block_index = 3", "content does not match its digest"),
        ("UPDATE blocks SET importance = 1.0 WHERE block_index = 3", "hash does not match"),
        ("UPDATE blocks SET channel = 'elsewhere' WHERE block_index = 3", "hash does not match"),
        ("UPDATE blocks SET metadata = '{\"x\": 1}' WHERE block_index = 3", "content does not match its digest"),
    ],
)
def test_tampering_is_detected(seeded, db_path: Path, sql: str, reason: str) -> None:
    memory, _ = seeded
    with _raw(db_path) as conn:
        conn.execute(sql)
    report = memory.verify()
    assert not report.ok
    assert report.first_bad_index == 3
    assert report.checked == 3
    assert reason in report.reason


def test_deleted_row_is_a_gap(seeded, db_path: Path) -> None:
    memory, _ = seeded
    with _raw(db_path) as conn:
        conn.execute("DELETE FROM embeddings WHERE block_index = 5")
        conn.execute("DELETE FROM blocks WHERE block_index = 5")
    report = memory.verify()
    assert not report.ok and report.first_bad_index == 6 and "gap" in report.reason


def test_tampered_digest_is_detected(seeded, db_path: Path) -> None:
    """Rewriting the digest to hide an edit breaks the block hash, which covers the digest."""
    memory, _ = seeded
    with _raw(db_path) as conn:
        conn.execute("UPDATE blocks SET content_digest = ? WHERE block_index = 2", ("0" * 64,))
    report = memory.verify()
    assert not report.ok and report.first_bad_index == 2


def test_forget_missing_index_changes_nothing(seeded) -> None:
    memory, _blocks = seeded
    before = ([b.as_dict() for b in memory.iter_blocks()], memory.verify().as_dict())

    with pytest.raises(BlockNotFoundError) as info:
        memory.forget(999)
    assert isinstance(info.value, GieokError) and "999" in str(info.value)

    # a batch with one missing index is refused as a whole: block 1 stays
    with pytest.raises(BlockNotFoundError):
        memory.forget([1, 0])
    with pytest.raises(InvalidTypeError):
        memory.forget(["1"])
    with pytest.raises(InvalidTypeError):
        memory.forget(True)

    after = ([b.as_dict() for b in memory.iter_blocks()], memory.verify().as_dict())
    assert after == before
    assert not memory.get(1).forgotten
    assert memory.search("민지는 고양이를 키워", mode="bm25").hits[0].block.block_index == 1

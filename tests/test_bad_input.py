"""Bad input gets a typed GieokError and never damages what is stored."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import gieok
from gieok import (
    BlockNotFoundError,
    CorruptDatabaseError,
    DatabaseUnwritableError,
    GieokError,
    InvalidInputError,
    InvalidTypeError,
    Memory,
    SchemaTooNewError,
    SearchResult,
    TextTooLongError,
    UnknownScopeKeyError,
)


def _snapshot(memory: Memory) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    return len(memory), memory.verify().as_dict(), [b.as_dict() for b in memory.iter_blocks()]


@pytest.fixture
def small(tmp_path: Path):
    """A store holding three blocks, with a low text limit so over-long text is cheap to build."""
    with Memory(tmp_path / "small.db", max_text_chars=50) as memory:
        memory.add_many([
            {"text": "민지는 고양이를 키워", "scope": {"channel": "cafe"}},
            {"text": "Alice adopted a puppy", "scope": {"channel": "lounge"}},
            {"text": "foo bar near baz", "scope": {"channel": "lounge"}},
        ])
        yield memory


ADD_CASES: list[tuple[str, dict[str, Any], type[GieokError]]] = [
    ("empty text", {"text": ""}, InvalidInputError),
    ("whitespace text", {"text": " \n\t\u3000 "}, InvalidInputError),
    ("text over max_text_chars", {"text": "가" * 51}, TextTooLongError),
    ("NUL byte", {"text": "hello\x00world"}, InvalidInputError),
    ("lone surrogate", {"text": "bad \ud800 text"}, InvalidInputError),
    ("text=123", {"text": 123}, InvalidTypeError),
    ("text=None", {"text": None}, InvalidTypeError),
    ("text=bytes", {"text": b"hello"}, InvalidTypeError),
    ("importance='high'", {"text": "ok", "importance": "high"}, InvalidTypeError),
    ("importance=1.5", {"text": "ok", "importance": 1.5}, InvalidInputError),
    ("importance=-0.1", {"text": "ok", "importance": -0.1}, InvalidInputError),
    ("importance=nan", {"text": "ok", "importance": float("nan")}, InvalidInputError),
    ("importance=True", {"text": "ok", "importance": True}, InvalidTypeError),
    ("scope='general'", {"text": "ok", "scope": "general"}, InvalidTypeError),
    ("scope room", {"text": "ok", "scope": {"room": "x"}}, UnknownScopeKeyError),
    ("scope channel=list", {"text": "ok", "scope": {"channel": ["a"]}}, InvalidTypeError),
    ("scope channel NUL", {"text": "ok", "scope": {"channel": "a\x00"}}, InvalidInputError),
    ("scope guild surrogate", {"text": "ok", "scope": {"guild": "\ud800"}}, InvalidInputError),
    ("scope user 201 chars", {"text": "ok", "scope": {"user": "u" * 201}}, InvalidInputError),
    ("event_time epoch ms", {"text": "ok", "event_time": 1_794_103_200_000}, InvalidInputError),
    ("metadata='x'", {"text": "ok", "metadata": "x"}, InvalidTypeError),
    ("metadata not JSON", {"text": "ok", "metadata": {"s": {1, 2}}}, InvalidInputError),
    ("metadata too long", {"text": "ok", "metadata": {"k": "v" * 60}}, InvalidInputError),
    ("metadata surrogate", {"text": "ok", "metadata": {"k": "a\udc80"}}, InvalidInputError),
    ("keywords='abc'", {"text": "ok", "keywords": "abc"}, InvalidTypeError),
    ("keywords=[1]", {"text": "ok", "keywords": [1]}, InvalidTypeError),
    ("keywords=['']", {"text": "ok", "keywords": [""]}, InvalidInputError),
    ("tags='x'", {"text": "ok", "tags": "x"}, InvalidTypeError),
    ("unknown kind", {"text": "ok", "kind": "memo"}, InvalidInputError),
    ("kind=1", {"text": "ok", "kind": 1}, InvalidTypeError),
    ("speaker NUL", {"text": "ok", "speaker": "a\x00"}, InvalidInputError),
    ("speaker=5", {"text": "ok", "speaker": 5}, InvalidTypeError),
    ("event_time words", {"text": "ok", "event_time": "yesterday"}, InvalidInputError),
    ("event_time inf", {"text": "ok", "event_time": float("inf")}, InvalidInputError),
    ("event_time list", {"text": "ok", "event_time": [2024]}, InvalidTypeError),
]


@pytest.mark.parametrize(("case", "kwargs", "error"), ADD_CASES, ids=[c[0] for c in ADD_CASES])
def test_bad_add_is_refused_and_harmless(small: Memory, case: str, kwargs: dict[str, Any],
                                         error: type[GieokError]) -> None:
    assert issubclass(error, GieokError)
    before = _snapshot(small)
    fields = dict(kwargs)
    text = fields.pop("text")
    with pytest.raises(error):
        small.add(text, **fields)
    # the same item inside add_many is refused too, naming its position
    with pytest.raises(error, match=r"^item 1: "):
        small.add_many(["a fine line", {"text": text, **fields}, "another fine line"])
    assert _snapshot(small) == before


SEARCH_CASES: list[tuple[str, dict[str, Any], type[GieokError]]] = [
    ("k='10'", {"k": "10"}, InvalidTypeError),
    ("k=0", {"k": 0}, InvalidInputError),
    ("k=1.5", {"k": 1.5}, InvalidTypeError),
    ("k=True", {"k": True}, InvalidTypeError),
    ("k too large", {"k": 1_000_000}, InvalidInputError),
    ("scope room", {"scope": {"room": "x"}}, UnknownScopeKeyError),
    ("scope='general'", {"scope": "general"}, InvalidTypeError),
    ("unknown kind", {"kinds": ["memo"]}, InvalidInputError),
    ("kinds=5", {"kinds": 5}, InvalidTypeError),
    ("since words", {"since": "last tuesday"}, InvalidInputError),
    ("until bool", {"until": True}, InvalidTypeError),
    ("mode", {"mode": "fuzzy"}, InvalidInputError),
    ("empty query", {"query": "   "}, InvalidInputError),
    ("query=None", {"query": None}, InvalidTypeError),
    ("query NUL", {"query": "a\x00"}, InvalidInputError),
    ("query surrogate", {"query": "\udfff"}, InvalidInputError),
    ("query too long", {"query": "x" * 51}, TextTooLongError),
]


@pytest.mark.parametrize(("case", "kwargs", "error"), SEARCH_CASES, ids=[c[0] for c in SEARCH_CASES])
def test_bad_search_is_refused(small: Memory, case: str, kwargs: dict[str, Any], error: type[GieokError]) -> None:
    before = _snapshot(small)
    fields = dict(kwargs)
    query = fields.pop("query", "고양이")
    with pytest.raises(error):
        small.search(query, **fields)
    assert _snapshot(small) == before


@pytest.mark.parametrize("query", ['"foo AND (', "NEAR(a b", "*", "foo OR", "NOT bar", "tokens:foo", "^baz", '""',
                                   "a*b-c"])
@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_fts_syntax_in_queries_is_just_text(small: Memory, query: str, mode: str) -> None:
    before = _snapshot(small)
    result = small.search(query, mode=mode)
    assert isinstance(result, SearchResult)
    assert result.query == query.strip()
    for hit in result:
        assert hit.block.block_index in (1, 2, 3)
        assert hit.score == hit.breakdown.final
    assert _snapshot(small) == before


def test_nul_byte_inside_metadata_is_refused(small: Memory) -> None:
    before = _snapshot(small)
    try:
        with pytest.raises(InvalidInputError):
            small.add("ok", metadata={"note": "a\x00b"})
    finally:
        # whatever happened, nothing else of the store may be damaged
        assert _snapshot(small)[1]["ok"]
    assert _snapshot(small) == before


def test_fts_words_still_match_literally(small: Memory) -> None:
    # "near" and "foo" are ordinary words here, not operators
    hits = small.search('"foo AND (', mode="bm25").hits
    assert [h.block.block_index for h in hits] == [3]
    assert [h.block.block_index for h in small.search("NEAR(a b", mode="bm25")] == [3]


@pytest.mark.parametrize("items", ["고양이", {"text": "hello world"}, None, 5, b"bytes"])
def test_add_many_of_a_text_or_a_mapping_is_refused_not_split(small: Memory, items: Any) -> None:
    """A text was stored a block a character (고, 양, 이); a mapping a block a key."""
    before = _snapshot(small)
    with pytest.raises(InvalidTypeError, match="list of texts or mappings"):
        small.add_many(items)
    assert _snapshot(small) == before


def test_get_and_forget_bad_indices(small: Memory) -> None:
    before = _snapshot(small)
    with pytest.raises(BlockNotFoundError):
        small.get(42)
    with pytest.raises(InvalidTypeError):
        small.get("1")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        small.get(True)  # type: ignore[arg-type]
    with pytest.raises(BlockNotFoundError):
        small.forget(42)
    for beyond in (10**30, 2**63, -1):  # past a database integer failed the store's query (OverflowError)
        with pytest.raises(BlockNotFoundError):
            small.get(beyond)
        with pytest.raises(BlockNotFoundError):
            small.forget([1, beyond])
        with pytest.raises(BlockNotFoundError):
            small.neighbours(beyond)
    assert _snapshot(small) == before


def test_add_many_with_one_bad_item_writes_nothing(small: Memory) -> None:
    before = _snapshot(small)
    good = [{"text": f"good line {i} 좋은 줄", "scope": {"channel": "lounge"}} for i in range(5)]
    for bad, error in [
        ({"text": "ok", "importance": 2}, InvalidInputError),
        ({"text": "ok", "colour": "red"}, InvalidInputError),  # unknown field
        ({"kind": "turn"}, InvalidInputError),  # missing text
        (42, InvalidTypeError),  # neither a string nor a mapping
        ("", InvalidInputError),
    ]:
        with pytest.raises(error, match=r"^item 3: "):
            small.add_many([*good[:3], bad, *good[3:]])
        assert _snapshot(small) == before
    # the good items alone go in, positions continuing in their channel
    written = small.add_many(good)
    assert [b.block_index for b in written] == [4, 5, 6, 7, 8]
    assert [b.conv_pos for b in written] == [3, 4, 5, 6, 7]
    assert small.verify().ok


def test_closed_memory_refuses_work(tmp_path: Path) -> None:
    memory = Memory(tmp_path / "closed.db")
    memory.close()
    for call in (lambda: memory.add("x"), lambda: memory.search("x"), lambda: memory.stats(),
                 lambda: memory.verify(), lambda: memory.get(1), lambda: memory.forget(1)):
        with pytest.raises(InvalidInputError, match="closed"):
            call()


def test_every_public_error_is_a_gieok_error() -> None:
    for name in gieok.errors.__all__:
        assert issubclass(getattr(gieok, name), GieokError), name


# -- the database file -------------------------------------------------------------------------

def _unwritable_path(tmp_path: Path) -> Path:
    """A path where no database can be created, for root (which ignores chmod) and everyone else."""
    if os.geteuid() == 0:
        blocker = tmp_path / "afile"
        blocker.write_text("I am a file, not a folder")
        return blocker / "m.db"
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked / "m.db"


def test_unwritable_path(tmp_path: Path) -> None:
    path = _unwritable_path(tmp_path)
    try:
        with pytest.raises(DatabaseUnwritableError) as info:
            Memory(path)
        assert isinstance(info.value, GieokError)
        assert not path.exists()
    finally:
        if path.parent.is_dir():
            path.parent.chmod(0o700)  # let pytest clean tmp_path up


def test_directory_as_database_path(tmp_path: Path) -> None:
    folder = tmp_path / "i-am-a-folder.db"
    folder.mkdir()
    with pytest.raises(DatabaseUnwritableError):
        Memory(folder)


def test_random_bytes_are_a_corrupt_database(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    junk = os.urandom(8192)
    path.write_bytes(junk)
    with pytest.raises(CorruptDatabaseError):
        Memory(path)
    assert path.read_bytes() == junk  # refused, not "repaired"


def test_unrelated_sqlite_file_is_a_corrupt_database(tmp_path: Path) -> None:
    path = tmp_path / "other-app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE recipes (name TEXT, minutes INTEGER)")
        conn.execute("INSERT INTO recipes VALUES ('kimchi jjigae', 30)")
    conn.close()
    with pytest.raises(CorruptDatabaseError, match="not a gieok database"):
        Memory(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM recipes").fetchall() == [("kimchi jjigae", 30)]
        assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} == {"recipes"}
    conn.close()


def test_unrelated_sqlite_file_keeps_its_journal_mode(tmp_path: Path) -> None:
    path = tmp_path / "other-app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE recipes (name TEXT)")
    conn.close()
    header = path.read_bytes()[:100]
    with pytest.raises(CorruptDatabaseError):
        Memory(path)
    assert path.read_bytes()[:100] == header  # a refused file is left exactly as it was


def test_newer_schema_is_refused(db_path: Path) -> None:
    with Memory(db_path) as memory:
        memory.add("hello")
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SchemaTooNewError, match="99"):
        Memory(db_path)


def test_empty_file_becomes_a_new_database(tmp_path: Path) -> None:
    path = tmp_path / "touched.db"
    path.touch()
    with Memory(path) as memory:
        assert memory.add("첫 기록").block_index == 1
        assert memory.verify().ok


def test_failed_open_is_unaffected_by_later_good_open(tmp_path: Path) -> None:
    """A refused file does not poison the process: the next good path opens normally."""
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"\x00" * 100 + b"not sqlite at all" * 50)
    with pytest.raises(CorruptDatabaseError):
        Memory(bad)
    with Memory(tmp_path / "good.db") as memory:
        memory.add("still fine")
        assert memory.search("fine").hits[0].block.text == "still fine"



def test_a_damaged_row_fails_no_read_and_verify_finds_it(db_path: Path) -> None:
    """One damaged cell in a healthy file (JSON a disk or a hand broke) gave a traceback in every
    command, verify's too; a damaged vector a NumPy error instead of the store's."""
    with Memory(db_path) as memory:
        memory.add_many([{"text": "민지는 고양이를 키워", "metadata": {"mood": "happy"}}, {"text": "Alex likes tea"}])
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE blocks SET metadata = '{bad', keywords = 'nope' WHERE block_index = 1")
    conn.close()
    with Memory(db_path) as memory:
        assert memory.get(1).metadata == {} and memory.get(1).keywords == ()
        assert [h.block.block_index for h in memory.search("고양이", k=2)][:1] == [1]
        report = memory.verify()
        assert not report.ok and report.first_bad_index == 1, report.as_dict()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE embeddings SET vector = x'00' WHERE block_index = 2")
    conn.close()
    with pytest.raises(CorruptDatabaseError, match=r"block 2's vector is damaged.*gieok reindex"):
        Memory(db_path)

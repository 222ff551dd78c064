"""Shape of the hand-labelled fact-pair set used to evaluate duplicate/conflict detection.

`benchmarks/data/fact_pairs.jsonl` holds pairs of stored facts (old, new) labelled as
duplicate (same information), conflict (same subject and attribute, different value)
or distinct (both kept). An evaluation is only meaningful if the file is well formed,
bilingual, roughly balanced across the three labels and free of repeated pairs; these
tests pin those properties, not the labels' correctness (that is a human judgement).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from benchmarks.datasets import FACT_PAIRS

REQUIRED_KEYS = {"old", "new", "topic_old", "topic_new", "label", "lang", "note"}
LABELS = {"duplicate", "conflict", "distinct"}
LANGS = {"ko", "en", "mixed"}
MIN_PAIRS = 240
MIN_SHARE, MAX_SHARE = 0.25, 0.45

HANGUL = re.compile(r"[\uac00-\ud7a3]")
# A well-formed reference is exactly "<user:" + digits (no leading zero) + ">".
USER_REF = re.compile(r"<user:[1-9][0-9]*>")
# Anything that looks like an attempt at a user reference, well-formed or not.
USER_REF_ATTEMPT = re.compile(r"<\s*user\b[^>]*>?|\buser:\s*\S+", re.IGNORECASE)


def _raw_lines() -> list[str]:
    text = FACT_PAIRS.read_text(encoding="utf-8")
    return text.splitlines()


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    parsed = []
    for number, line in enumerate(_raw_lines(), start=1):
        assert line.strip(), f"line {number}: blank line"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:  # pragma: no cover - failure path
            pytest.fail(f"line {number}: not JSON ({exc.msg})")
        assert isinstance(row, dict), f"line {number}: not a JSON object"
        parsed.append(row)
    return parsed


def test_file_ends_with_one_newline() -> None:
    text = FACT_PAIRS.read_text(encoding="utf-8")
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_required_keys_and_types(rows: list[dict[str, Any]]) -> None:
    for number, row in enumerate(rows, start=1):
        assert set(row) == REQUIRED_KEYS, f"line {number}: keys {sorted(row)}"
        for key in REQUIRED_KEYS:
            value = row[key]
            assert isinstance(value, str), f"line {number}: {key} is not a string"
            assert value.strip() == value and value, f"line {number}: {key} empty or padded"
        assert row["label"] in LABELS, f"line {number}: label {row['label']!r}"
        assert row["lang"] in LANGS, f"line {number}: lang {row['lang']!r}"
        assert row["old"] != row["new"], f"line {number}: old and new are identical"


def test_enough_pairs(rows: list[dict[str, Any]]) -> None:
    assert len(rows) >= MIN_PAIRS


def test_label_mix(rows: list[dict[str, Any]]) -> None:
    counts = Counter(row["label"] for row in rows)
    assert set(counts) == LABELS
    for label in LABELS:
        share = counts[label] / len(rows)
        assert MIN_SHARE <= share <= MAX_SHARE, f"{label}: {share:.1%} of {len(rows)}"


def test_both_languages_present_and_balanced(rows: list[dict[str, Any]]) -> None:
    counts = Counter(row["lang"] for row in rows)
    assert counts["ko"] > 0 and counts["en"] > 0
    # "about half and half": neither monolingual side may dwarf the other
    assert min(counts["ko"], counts["en"]) / max(counts["ko"], counts["en"]) >= 0.75
    # every label is exercised in both languages
    for lang in ("ko", "en"):
        labels = {row["label"] for row in rows if row["lang"] == lang}
        assert labels == LABELS, f"{lang}: only {sorted(labels)}"


def test_lang_tag_matches_text(rows: list[dict[str, Any]]) -> None:
    for number, row in enumerate(rows, start=1):
        korean = [bool(HANGUL.search(row[side])) for side in ("old", "new")]
        if row["lang"] == "ko":
            assert all(korean), f"line {number}: tagged ko but a side has no Hangul"
        elif row["lang"] == "en":
            assert not any(korean), f"line {number}: tagged en but contains Hangul"
        else:
            assert korean[0] != korean[1], f"line {number}: tagged mixed but both sides same language"


def test_no_repeated_pairs(rows: list[dict[str, Any]]) -> None:
    ordered = Counter((row["old"], row["new"]) for row in rows)
    repeated = [pair for pair, n in ordered.items() if n > 1]
    assert not repeated, f"repeated (old, new) pairs: {repeated[:3]}"
    unordered = Counter(frozenset((row["old"], row["new"])) for row in rows)
    swapped = [tuple(pair) for pair, n in unordered.items() if n > 1]
    assert not swapped, f"same pair in both orders: {swapped[:3]}"


def test_user_references_well_formed(rows: list[dict[str, Any]]) -> None:
    for number, row in enumerate(rows, start=1):
        for side in ("old", "new"):
            text = row[side]
            for attempt in USER_REF_ATTEMPT.finditer(text):
                start = attempt.start()
                well_formed = USER_REF.match(text, start)
                assert well_formed, f"line {number} {side}: malformed reference near {text[start:start + 30]!r}"
            # the remainder after removing good references must not mention user: at all
            assert "user:" not in USER_REF.sub("", text).lower(), f"line {number} {side}: stray 'user:'"


def test_most_facts_name_a_user(rows: list[dict[str, Any]]) -> None:
    # guild and lore facts legitimately name no user, but they must stay a minority
    with_user = sum(1 for row in rows if USER_REF.search(row["old"]) or USER_REF.search(row["new"]))
    assert with_user / len(rows) >= 0.7


def test_same_sentence_other_user_pairs_exist(rows: list[dict[str, Any]]) -> None:
    # the hardest distinct case: same attribute, different users
    def users(text: str) -> set[str]:
        return set(USER_REF.findall(text))

    cross_user = [
        row
        for row in rows
        if row["label"] == "distinct"
        and users(row["old"])
        and users(row["new"])
        and users(row["old"]).isdisjoint(users(row["new"]))
    ]
    assert len(cross_user) >= 5

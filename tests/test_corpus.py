"""Tests for the synthetic benchmark corpus and the demo conversation.

The latency benchmark is only comparable across runs if the corpus is a pure
function of (n, seed) and realistic enough (bilingual, mostly distinct texts);
the demo is only convincing if its questions point at turns that really hold
the answer.  These tests pin both properties.
"""

from __future__ import annotations

import itertools
import json
import re
from importlib import resources

import pytest
from benchmarks.corpus import ChatMessage, generate_messages, generate_queries


@pytest.fixture(scope="module")
def corpus_20k() -> list[ChatMessage]:
    return generate_messages(20_000)


def test_same_seed_same_output() -> None:
    assert generate_messages(2_000, seed=3) == generate_messages(2_000, seed=3)
    assert generate_queries(500, seed=11) == generate_queries(500, seed=11)


def test_different_seed_different_output() -> None:
    a = [m.text for m in generate_messages(1_000, seed=1)]
    b = [m.text for m in generate_messages(1_000, seed=2)]
    assert a != b
    assert generate_queries(200, seed=1) != generate_queries(200, seed=2)


def test_global_random_state_untouched() -> None:
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    generate_messages(500)
    generate_queries(100)
    assert random.random() == expected


@pytest.mark.parametrize("n", [0, 1, 7, 1_000])
def test_n_respected(n: int) -> None:
    assert len(generate_messages(n)) == n
    assert len(generate_queries(n)) == n


def test_negative_n_rejected() -> None:
    with pytest.raises(ValueError):
        generate_messages(-1)
    with pytest.raises(ValueError):
        generate_queries(-1)


def test_message_fields(corpus_20k: list[ChatMessage]) -> None:
    channels = {m.channel for m in corpus_20k}
    guilds = {m.guild for m in corpus_20k}
    speakers = {m.speaker for m in corpus_20k}
    assert 15 <= len(channels) <= 25
    assert 3 <= len(guilds) <= 4
    assert 30 <= len(speakers) <= 50
    assert {m.language for m in corpus_20k} == {"ko", "en"}
    for m in corpus_20k[:500]:
        assert isinstance(m.text, str) and m.text.strip()
        assert isinstance(m.timestamp, float)
    with pytest.raises(AttributeError):
        corpus_20k[0].text = "mutated"  # type: ignore[misc]


def test_language_balance(corpus_20k: list[ChatMessage]) -> None:
    ko = sum(m.language == "ko" for m in corpus_20k) / len(corpus_20k)
    assert 0.35 <= ko <= 0.65
    hangul = re.compile("[가-힣ㄱ-ㅣ]")  # syllables or bare jamo (ㅋㅋ, ㅇㅈ)
    # the label matches the text: Korean messages contain Hangul
    assert all(hangul.search(m.text) for m in corpus_20k if m.language == "ko")
    # some English-labelled messages are code-mixed, and some Korean ones contain Latin words
    assert any(hangul.search(m.text) for m in corpus_20k if m.language == "en")
    assert any(re.search("[A-Za-z]{3,}", m.text) for m in corpus_20k if m.language == "ko")


def test_distinct_texts(corpus_20k: list[ChatMessage]) -> None:
    texts = [m.text for m in corpus_20k]
    assert len(set(texts)) / len(texts) >= 0.90


def test_lengths_vary(corpus_20k: list[ChatMessage]) -> None:
    words = [len(m.text.split()) for m in corpus_20k]
    assert min(words) >= 2
    assert max(words) >= 25
    assert sum(w <= 5 for w in words) > 0.02 * len(words)


def test_timestamps_non_decreasing(corpus_20k: list[ChatMessage]) -> None:
    ts = [m.timestamp for m in corpus_20k]
    assert all(a <= b for a, b in itertools.pairwise(ts))
    assert ts[-1] > ts[0]


def test_queries_never_copy_corpus() -> None:
    texts = {m.text for m in generate_messages(5_000)}
    queries = generate_queries(5_000)
    assert not texts.intersection(queries)
    hangul = re.compile("[가-힣]")
    ko = sum(bool(hangul.search(q)) for q in queries) / len(queries)
    assert 0.35 <= ko <= 0.75  # a few English queries are code-mixed


# ---------------------------------------------------------------------------
# sample_conversation.json (what `gieok demo` ingests)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> dict:
    path = resources.files("gieok") / "data" / "sample_conversation.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_sample_shape(sample: dict) -> None:
    assert {"title", "guild", "channel", "sessions", "questions"} <= set(sample)
    assert sample["guild"] == "demo-guild" and sample["channel"] == "demo-chat"
    sessions = sample["sessions"]
    assert len(sessions) == 6
    assert [s["session"] for s in sessions] == list(range(1, 7))
    dates = [s["date_time"] for s in sessions]
    assert dates == sorted(dates) and all(d.startswith("2026-") for d in dates)
    speakers = set()
    for s in sessions:
        assert 40 <= len(s["turns"]) <= 60
        for t in s["turns"]:
            assert t["speaker"].strip() and t["text"].strip()
            speakers.add(t["speaker"])
    assert len(speakers) == 4
    total = sum(len(s["turns"]) for s in sessions)
    assert 270 <= total <= 330


def test_sample_questions_point_at_answers(sample: dict) -> None:
    turns = {s["session"]: s["turns"] for s in sample["sessions"]}
    questions = sample["questions"]
    assert len(questions) == 8
    hangul = re.compile("[가-힣]")
    ko_questions = sum(bool(hangul.search(q["question"])) for q in questions)
    assert ko_questions == 4
    for q in questions:
        assert q["question"].strip() and q["answer"].strip() and q["evidence"]
        evidence_text = ""
        for session, turn in q["evidence"]:
            assert session in turns
            assert 1 <= turn <= len(turns[session]), (q["question"], session, turn)
            evidence_text += " " + turns[session][turn - 1]["text"]
        # at least one salient answer token must literally occur in the evidence
        tokens = [t for t in re.findall(r"[가-힣]{2,}|[A-Za-z]{3,}|\d+", q["answer"])]
        assert any(t in evidence_text for t in tokens), (q["question"], evidence_text)

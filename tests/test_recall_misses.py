"""benchmarks/recall_misses.py: why evidence turns miss the top 10, on a conversation written here.

One LoCoMo-format conversation: the first session holds Melanie's pottery class (half of the
answer, and neighbours that crowd the top 10), the second the other half in words the question
does not use, and the third Caroline's class talk in the question's words (distractors). The real
memory, embedder and tokenizer classify it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks.locomo import Question
from benchmarks.recall_misses import CAUSES, classify_misses, main, measure_misses

QUESTION = "What did Melanie make in her pottery class, and who did she give it to?"
SESSION_1 = [
    ("Melanie", "I made a bowl in my pottery class today, Melanie the potter!"),  # D1:1, evidence
    ("Caroline", "A pottery class? How was it?"),
    ("Melanie", "Fun, the teacher showed us the wheel."),
    ("Caroline", "Was the clay hard to shape?"),
    ("Melanie", "Very, my first try collapsed."),
    ("Caroline", "I'd love to come along some day."),
    ("Melanie", "It meets every Tuesday evening."),
    ("Caroline", "Is it expensive?"),
    ("Melanie", "Not really, the clay is included."),
    ("Caroline", "Then I'll bring a friend next week."),
    ("Melanie", "Great, the teacher will love that."),
    ("Caroline", "What colour glaze did you use?"),
]
SESSION_2 = [
    ("Caroline", "How was the weekend?"),
    ("Melanie", "Busy! Grandma turned eighty on Saturday."),
    ("Caroline", "Wow, happy birthday to her. Was there a party?"),
    ("Melanie", "A small one. Grandma got that little piece from me, she cried."),  # D2:4, evidence
    ("Caroline", "That's so sweet. I went hiking with my dog."),
    ("Melanie", "Which trail did you take?"),
    ("Caroline", "The river one, it was muddy after the rain."),
    ("Melanie", "I should get new running shoes for that trail."),
    ("Caroline", "The store downtown has a sale this month."),
    ("Melanie", "Thanks, 그럼 이번 주말에 같이 가자!"),
]
SESSION_3 = [
    ("Caroline", "My painting class starts again, what should I make first?"),
    ("Melanie", "Make a portrait! Who will you give it to?"),
    ("Caroline", "I'll give it to my mom, she loves class photos and art."),
    ("Melanie", "Did your class make anything last term?"),
    ("Caroline", "We made posters for the school and gave them away."),
    ("Melanie", "Which class was that, the pottery one or painting?"),
    ("Caroline", "Painting. Pottery class is your thing, not mine."),
    ("Melanie", "Ha, fair. My class teacher says hi."),
]


def _conversation() -> list[dict[str, Any]]:
    def session(n: int, turns: list[tuple[str, str]]) -> list[dict[str, str]]:
        return [{"speaker": who, "dia_id": f"D{n}:{i}", "text": text} for i, (who, text) in enumerate(turns, 1)]

    return [{"sample_id": "conv-test", "conversation": {
        "speaker_a": "Melanie", "speaker_b": "Caroline",
        "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session(1, SESSION_1),
        "session_2_date_time": "10:37 am on 27 June, 2023", "session_2": session(2, SESSION_2),
        "session_3_date_time": "2:10 pm on 3 July, 2023", "session_3": session(3, SESSION_3),
    }, "qa": [{"question": QUESTION, "answer": "a bowl, to her grandmother", "evidence": ["D1:1", "D2:4"],
               "category": 1}]}]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("misses")
    data = folder / "conv.json"
    data.write_text(json.dumps(_conversation(), ensure_ascii=False), encoding="utf-8")
    return measure_misses(data, db_dir=folder / "db")


def test_a_missed_turn_in_another_session_is_classified(report: dict[str, Any]) -> None:
    assert report["questions"] == 1
    [missed] = report["missed"]
    assert (missed["dia_id"], missed["category"], missed["conversation"]) == ("D2:4", "1", "conv-test")
    # the top 10 found the first session's evidence, so the second session's is in the wrong session
    assert missed["other_evidence_found"] and missed["other_session"]
    # the found turn's neighbours (D1:2 … D1:4, within 3 turns) are among the top 10
    assert 1 <= missed["crowding"] <= 3
    # "Grandma got that little piece from me, she cried.": no word of it is in the question
    assert missed["overlap"] == 0.0
    assert "wrong session" in missed["causes"] and "vocabulary mismatch" in missed["causes"]
    # 30 turns: every system ranks every turn of the conversation in its deep list
    for system in ("hybrid_rank", "bm25_rank", "vector_rank"):
        assert missed[system] is None or 2 <= missed[system] <= 30, system
    assert missed["hybrid_rank"] is not None and missed["hybrid_rank"] > 10

    row = report["by_category"]["1"]
    assert row["name"] == "multi-hop" and row["questions"] == 1 and row["missed_turns"] == 1
    assert row["turn_recall@10"] == 0.5 and row["another_evidence_in_top10"] == 1.0
    assert set(row["causes"]) == set(CAUSES)
    assert row["causes"]["wrong session"] == 1.0 and row["causes"]["vocabulary mismatch"] == 1.0
    assert report["by_category"]["all"]["missed_turns"] == 1


def test_causes_follow_the_rules() -> None:
    question = Question("c", "q?", "3", ["D1:5", "D1:20", "D4:2"], {1, 4})
    top = ["D1:5", "D1:6", "D1:3", "D2:9", "D1:8", "D1:9", "D3:1", "D3:2", "D3:3", "D3:4"]
    deep = {"hybrid": [*top, "D1:20", *[f"D5:{i}" for i in range(60)]],
            "bm25": ["D4:2"], "vector": ["D1:20"]}
    by_id = {m.dia_id: m for m in classify_misses(question, top, deep, {"D1:5": 1.0, "D1:20": 0.5, "D4:2": 0.0})}
    assert set(by_id) == {"D1:20", "D4:2"}
    same_session, other = by_id["D1:20"], by_id["D4:2"]
    # D1:6, D1:3 and D1:8 are within 3 turns of the found D1:5; D1:9 is 4 away, D2:9 another session
    assert same_session.crowding == other.crowding == 3
    assert (same_session.hybrid_rank, same_session.bm25_rank, same_session.vector_rank) == (11, None, 1)
    assert same_session.causes == ("crowded out by neighbours", "ranked 11–50")
    assert (other.hybrid_rank, other.bm25_rank) == (None, 1)
    assert other.other_session and other.causes == ("wrong session", "vocabulary mismatch", "not in top 200")
    # nothing found: no other evidence, no crowding, no wrong session
    [alone] = classify_misses(Question("c", "q?", "1", ["D2:1"], {2}), ["D1:1"], {"hybrid": [], "bm25": [],
                                                                                   "vector": []}, {"D2:1": 0.0})
    assert not alone.other_evidence_found and not alone.other_session and alone.crowding == 0


def test_without_the_data_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data", str(tmp_path / "missing.json")]) == 0
    assert "skipped: no LoCoMo data" in capsys.readouterr().out

"""Dates named in questions, resolved to time ranges (text/dates.py), and Korean names in
Latin letters (text/romanize.py): both feed the learned ranker's features."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from gieok.text.dates import MonthDay, asks_when, mentions_time, question_dates, resolve_zone
from gieok.text.romanize import hangul_name_keys, latin_name_keys, name_key, romanize
from gieok.text.tokenize import get_tokenizer

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC).timestamp()  # a Wednesday


def _days(query: str, zone=UTC) -> list[tuple[date, date]]:
    """Ranges as (first day, day after the last), read in `zone`."""
    found = question_dates(query, NOW, zone)
    return [(datetime.fromtimestamp(a, zone).date(), datetime.fromtimestamp(b, zone).date()) for a, b in found.ranges]


@pytest.mark.parametrize(("query", "expected"), [
    ("What did Nate do for Joanna on 25 May, 2022?", [(date(2022, 5, 25), date(2022, 5, 26))]),
    ("What book did Tim finish on 8th December, 2023?", [(date(2023, 12, 8), date(2023, 12, 9))]),
    ("Where was the picture shared by John on December 1,2023 taken?", [(date(2023, 12, 1), date(2023, 12, 2))]),
    ("What did Maria donate in December 2023?", [(date(2023, 12, 1), date(2024, 1, 1))]),
    ("What state did Joanna visit in summer 2021?", [(date(2021, 6, 1), date(2021, 9, 1))]),
    ("How many times has Melanie gone to the beach in 2023?", [(date(2023, 1, 1), date(2024, 1, 1))]),
    ("What did Joanna write yesterday?", [(date(2026, 3, 17), date(2026, 3, 18))]),
    ("what did we eat last week", [(date(2026, 3, 9), date(2026, 3, 16))]),
    ("2025년 3월에 이사했어?", [(date(2025, 3, 1), date(2025, 4, 1))]),
    ("2024년 12월 24일에 뭐 했지", [(date(2024, 12, 24), date(2024, 12, 25))]),
    ("작년 여름에 어디 갔었지?", [(date(2025, 6, 1), date(2025, 9, 1))]),
    ("작년에 산 거", [(date(2025, 1, 1), date(2026, 1, 1))]),
    ("올해 봄 계획", [(date(2026, 3, 1), date(2026, 6, 1))]),
    ("지난주에 뭐 샀어?", [(date(2026, 3, 9), date(2026, 3, 16))]),
    ("어제 뭐 먹었어", [(date(2026, 3, 17), date(2026, 3, 18))]),
    ("지난달 회식 어디서 했지", [(date(2026, 2, 1), date(2026, 3, 1))]),
])
def test_absolute_and_relative_ranges(query: str, expected: list[tuple[date, date]]) -> None:
    assert _days(query) == expected


def test_yearless_dates_are_patterns() -> None:
    assert question_dates("When did Melanie go camping in June?", NOW).patterns == (MonthDay(6),)
    assert question_dates("3월 5일에 뭐 했어?", NOW).patterns == (MonthDay(3, 5),)
    assert question_dates("민지 생일 5월이었나", NOW).patterns == (MonthDay(5),)
    assert not question_dates("3월 5일에 뭐 했어?", NOW).ranges


def test_an_absolute_date_anchors_relative_words() -> None:
    # "last weekend before April 10, 2023" is about April 2023, not the weekend before today
    found = question_dates("What did Maria participate in last weekend before April 10, 2023?", NOW)
    assert [datetime.fromtimestamp(a, UTC).date() for a, _ in found.ranges] == [date(2023, 4, 10)]


@pytest.mark.parametrize("query", [
    "What is Minji's favourite food?", "I may go", "민지 고양이 이름이 뭐였지?", "자료 올려줘",  # 올 is not 올해
    "What happened on February 30, 2023?",  # no such day
    "Emily 생일이 언제야?", "13월에 만나",
])
def test_no_date_no_range(query: str) -> None:
    assert not question_dates(query, NOW)


def test_ranges_are_read_in_the_zone() -> None:
    seoul = ZoneInfo("Asia/Seoul")
    found = question_dates("on 25 May, 2022", NOW, seoul)
    start, end = found.ranges[0]
    assert start == datetime(2022, 5, 25, tzinfo=seoul).timestamp() and end - start == 86_400
    assert resolve_zone("Asia/Seoul") == seoul
    assert resolve_zone("") is UTC and resolve_zone("Not/AZone") is UTC


@pytest.mark.parametrize(("hangul", "latin"), [
    ("민지", "Minji"), ("지훈", "Jihoon"), ("승민", "Seungmin"), ("하은", "Ha-eun"), ("지수", "Jisoo"),
    ("태현", "Taehyun"), ("서연", "Seoyeon"),
])
def test_korean_names_meet_their_romanisations(hangul: str, latin: str) -> None:
    assert name_key(hangul) == name_key(latin)
    assert name_key(hangul) in latin_name_keys(f"What did {latin}'s team say?")


@pytest.mark.parametrize(("hangul", "latin"), [
    ("다니엘은", "Daniel"), ("소피가", "Sophie"), ("케빈이", "Kevin"), ("에밀리", "Emily"), ("알렉스", "Alex"),
])
def test_english_names_written_in_hangul(hangul: str, latin: str) -> None:
    # a particle may follow the name: the Hangul word's key starts with the Latin name's
    assert any(k.startswith(name_key(latin)) for k in hangul_name_keys(f"{hangul} 요즘 어디 살아?"))
    assert not any(k.startswith(name_key(latin)) for k in hangul_name_keys("민지 요즘 어디 살아?"))


def test_romanize_leaves_other_text() -> None:
    assert romanize("민지: ok") == "minji: ok"
    assert name_key("민지") != name_key("지민")


def test_korean_weekends() -> None:
    # NOW is Wednesday 18 March 2026: this weekend is 21–22 March, last weekend 14–15 March
    assert _days("이번 주말에 뭐해") == [(date(2026, 3, 21), date(2026, 3, 23))]
    assert _days("지난 주말에 뭐했어") == [(date(2026, 3, 14), date(2026, 3, 16))]
    assert _days("last weekend?") == [(date(2026, 3, 14), date(2026, 3, 16))]


@pytest.mark.parametrize(("query", "expected"), [
    ("When is Jihoon going to Busan?", True), ("Emily 생일이 언제야?", True), ("몇 월에 이사해?", True),
    ("How long has Tim played piano?", True), ("What date did they meet?", True), ("결혼식 날짜 잡았어?", True),
    ("What is Minji's favourite food?", False), ("민지 고양이 이름이 뭐였지?", False),
])
def test_questions_that_ask_when(query: str, expected: bool) -> None:
    assert asks_when(query) is expected


@pytest.mark.parametrize(("text", "expected"), [
    ("저 다음 달에 성수동으로 이사 가요! 6월 20일에 이사해요", True), ("my birthday is May 9", True),
    ("we went camping last weekend", True), ("어제 피자 먹었어", True),
    ("ㅋㅋㅋ 진짜 웃기다", False), ("I love pottery and painting", False),
])
def test_texts_that_name_a_time(text: str, expected: bool) -> None:
    assert mentions_time(get_tokenizer().tokens(text)) is expected

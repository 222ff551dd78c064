"""Relative dates in chat messages, resolved against when the message was said (text/dates.py):
"어제 부산으로 이사했어" said on 15 November 2026 is about the 14th, however late it is read."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from gieok.text.dates import ResolvedDate, annotate_dates, message_dates

SEOUL = ZoneInfo("Asia/Seoul")
SUNDAY = datetime(2026, 11, 15, 12, 0, tzinfo=SEOUL).timestamp()  # its week is Mon 9 – Sun 15 November
NEW_YEAR = datetime(2026, 1, 1, 12, 0, tzinfo=SEOUL).timestamp()  # a Thursday: its week is 29 Dec – 4 Jan


def _labels(text: str, said_at: float = SUNDAY, zone=SEOUL) -> list[tuple[str, str]]:
    return [(found.phrase, found.label) for found in message_dates(text, said_at, zone)]


def test_said_dates_fall_on_the_expected_weekdays() -> None:
    assert date(2026, 11, 15).weekday() == 6 and date(2026, 1, 1).weekday() == 3
    assert date(2026, 12, 2).weekday() == 2


@pytest.mark.parametrize(("text", "phrase", "label"), [
    ("어제 부산으로 이사했어", "어제", "2026-11-14"),
    ("어저께 봤잖아", "어저께", "2026-11-14"),
    ("오늘 저녁 뭐 먹지", "오늘", "2026-11-15"),
    ("그제 만났어", "그제", "2026-11-13"),
    ("그저께 샀어", "그저께", "2026-11-13"),
    ("내일로 미루자", "내일", "2026-11-16"),
    ("모레 출발해", "모레", "2026-11-17"),
    ("글피에 시험이야", "글피", "2026-11-18"),
    ("지난주에 뭐 했어", "지난주", "2026-11-02~2026-11-08"),
    ("지난 주에 바빴어", "지난 주", "2026-11-02~2026-11-08"),
    ("저번 주는 바빴어", "저번 주", "2026-11-02~2026-11-08"),
    ("이번 주 내내 야근", "이번 주", "2026-11-09~2026-11-15"),
    ("다음 주에 보자", "다음 주", "2026-11-16~2026-11-22"),
    ("다음주부터 헬스 시작", "다음주", "2026-11-16~2026-11-22"),
    ("지난 주말에 캠핑 갔어", "지난 주말", "2026-11-07~2026-11-08"),
    ("이번 주말 어때", "이번 주말", "2026-11-14~2026-11-15"),
    ("다음 주말에 가자", "다음 주말", "2026-11-21~2026-11-22"),
    ("지난달 월급 들어왔어", "지난달", "2026-10"),
    ("저번 달에 이사했어", "저번 달", "2026-10"),
    ("이번 달 말에 여행", "이번 달", "2026-11"),
    ("다음 달에 성수동으로 이사 가요", "다음 달", "2026-12"),
    ("작년에 결혼했어", "작년", "2025"),
    ("지난해 겨울", "지난해", "2025"),
    ("재작년에 입사했어", "재작년", "2024"),
    ("올해 목표", "올해", "2026"),
    ("금년 계획", "금년", "2026"),
    ("내년에 졸업해", "내년", "2027"),
    ("지난주 금요일에 만났어", "지난주 금요일", "2026-11-06"),
    ("저번 주 금요일", "저번 주 금요일", "2026-11-06"),
    ("이번 주 금요일에 회식", "이번 주 금요일", "2026-11-13"),
    ("다음 주 금요일에 봐", "다음 주 금요일", "2026-11-20"),
    ("다음주금요일", "다음주금요일", "2026-11-20"),
    ("이번 금요일에 봐", "이번 금요일", "2026-11-13"),
    ("지난 금요일에 만났어", "지난 금요일", "2026-11-13"),
    ("지난 일요일에", "지난 일요일", "2026-11-08"),  # strictly before the Sunday it was said on
    ("다음 금요일에 봐", "다음 금요일", "2026-11-20"),
    ("다음 일요일에", "다음 일요일", "2026-11-22"),  # strictly after
    ("3일 전에 샀어", "3일 전", "2026-11-12"),
    ("3일전에 샀어", "3일전", "2026-11-12"),
    ("하루 전에", "하루 전", "2026-11-14"),
    ("이틀 전에 봤어", "이틀 전", "2026-11-13"),
    ("사흘 전", "사흘 전", "2026-11-12"),
    ("나흘 전", "나흘 전", "2026-11-11"),
    ("일주일 전에 시작했어", "일주일 전", "2026-11-08"),
    ("2주 전에", "2주 전", "2026-11-01"),
    ("한 달 전에 그만뒀어", "한 달 전", "2026-10"),
    ("두 달 전", "두 달 전", "2026-09"),
    ("3개월 전에", "3개월 전", "2026-08"),
    ("석 달 전", "석 달 전", "2026-08"),
    ("2년 전에 이사 왔어", "2년 전", "2024"),
    ("3일 후에 출발", "3일 후", "2026-11-18"),
    ("이틀 뒤에 와", "이틀 뒤", "2026-11-17"),
    ("2주 뒤에 봐", "2주 뒤", "2026-11-29"),
    ("네 달 후", "네 달 후", "2027-03"),
    ("3일 전부터 아팠어", "3일 전", "2026-11-12"),  # 전부터 (since): 전부 (all of it) is excluded below
])
def test_korean_phrases(text: str, phrase: str, label: str) -> None:
    assert _labels(text) == [(phrase, label)]


@pytest.mark.parametrize(("text", "phrase", "label"), [
    ("I moved to Busan yesterday", "yesterday", "2026-11-14"),
    ("Today was long", "Today", "2026-11-15"),
    ("dinner tonight?", "tonight", "2026-11-15"),
    ("I ran this morning", "this morning", "2026-11-15"),
    ("this afternoon I napped", "this afternoon", "2026-11-15"),
    ("what a party last night", "last night", "2026-11-14"),
    ("see you tomorrow", "tomorrow", "2026-11-16"),
    ("we met the day before yesterday", "the day before yesterday", "2026-11-13"),
    ("the day after tomorrow works", "the day after tomorrow", "2026-11-17"),
    ("I was sick last week", "last week", "2026-11-02~2026-11-08"),
    ("busy this week", "this week", "2026-11-09~2026-11-15"),
    ("Next week I fly out", "Next week", "2026-11-16~2026-11-22"),
    ("we went camping last weekend", "last weekend", "2026-11-07~2026-11-08"),
    ("free this weekend?", "this weekend", "2026-11-14~2026-11-15"),
    ("next weekend is the wedding", "next weekend", "2026-11-21~2026-11-22"),
    ("I got promoted last month", "last month", "2026-10"),
    ("rent is due this month", "this month", "2026-11"),
    ("I move next month", "next month", "2026-12"),
    ("we married last year", "last year", "2025"),
    ("my goal this year", "this year", "2026"),
    ("I graduate next year", "next year", "2027"),
    ("I saw her last Friday", "last Friday", "2026-11-13"),
    ("last Sunday was rainy", "last Sunday", "2026-11-08"),
    ("dinner this Friday?", "this Friday", "2026-11-13"),
    ("I start the new job next Monday", "next Monday", "2026-11-16"),
    ("the party is next Friday", "next Friday", "2026-11-20"),
    ("I bought it 3 days ago", "3 days ago", "2026-11-12"),
    ("two weeks ago we hiked", "two weeks ago", "2026-11-01"),
    ("a week ago", "a week ago", "2026-11-08"),
    ("a month ago I quit", "a month ago", "2026-10"),
    ("six months ago", "six months ago", "2026-05"),
    ("5 years ago", "5 years ago", "2021"),
    ("a couple of days ago", "a couple of days ago", "2026-11-13"),
    ("a few days ago", "a few days ago", "2026-11-12"),
    ("see you in 3 days", "in 3 days", "2026-11-18"),
    ("in two weeks I leave", "in two weeks", "2026-11-29"),
    ("in a month we move", "in a month", "2026-12"),
    ("in a few days", "in a few days", "2026-11-18"),
    ("in ten years", "in ten years", "2036"),
    ("two days from now", "two days from now", "2026-11-17"),
    ("next Friday에 보자", "next Friday", "2026-11-20"),  # a Korean particle after an English phrase
    ("yesterday에 말한 거", "yesterday", "2026-11-14"),
    ("3 days ago에 샀어", "3 days ago", "2026-11-12"),
])
def test_english_phrases(text: str, phrase: str, label: str) -> None:
    assert _labels(text) == [(phrase, label)]


@pytest.mark.parametrize("text", [
    "오늘날 사람들은 바빠",  # nowadays
    "3일에 만나", "15일에 월급 들어와",  # a day of the month, not a count back
    "5월 3일 전에 보내줘",  # before 3 May
    "세 번째 시도", "금요일에 보자", "지난번에 말했잖아", "저번에 그거",
    "그제야 알았어", "엊그제 일 같은데", "어제오늘 일이 아니야", "내일모레 마흔이야",
    "이번 주문 확인해줘", "다음 주제로 넘어가자", "이번 달러 환율", "6일 전쟁", "이틀 전부 놀았어", "시험 하루 전날",
    "todays", "see you on Friday", "within 3 days", "yesterdays", "the next week she left",
    "the last night of the trip", "I love pottery", "ㅋㅋㅋ 진짜 웃기다", "",
])
def test_no_relative_date(text: str) -> None:
    assert message_dates(text, SUNDAY, SEOUL) == []
    assert annotate_dates(text, SUNDAY, SEOUL) is text


def test_positions_and_days() -> None:
    text = "어제 만났고 next Friday에 또 봐"
    yesterday, friday = message_dates(text, SUNDAY, SEOUL)
    assert yesterday == ResolvedDate(0, 2, "어제", date(2026, 11, 14), date(2026, 11, 14), "2026-11-14")
    assert (friday.start, friday.end, friday.phrase) == (7, 18, "next Friday")
    assert text[friday.start:friday.end] == friday.phrase
    week = message_dates("지난주", SUNDAY, SEOUL)[0]
    assert (week.first, week.last) == (date(2026, 11, 2), date(2026, 11, 8))
    month = message_dates("last month", SUNDAY, SEOUL)[0]
    assert (month.first, month.last) == (date(2026, 10, 1), date(2026, 10, 31))


@pytest.mark.parametrize(("text", "expected"), [
    ("the day before yesterday", [("the day before yesterday", "2026-11-13")]),
    ("지난주 금요일", [("지난주 금요일", "2026-11-06")]),
    ("다음 주말", [("다음 주말", "2026-11-21~2026-11-22")]),
    ("재작년", [("재작년", "2024")]),
    ("어제 만났고 다음 주에 또 봐", [("어제", "2026-11-14"), ("다음 주", "2026-11-16~2026-11-22")]),
    ("yesterday and last week", [("yesterday", "2026-11-14"), ("last week", "2026-11-02~2026-11-08")]),
])
def test_longer_phrases_win_and_order_is_by_position(text: str, expected: list[tuple[str, str]]) -> None:
    assert _labels(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("어제", "2025-12-31"), ("지난달", "2025-12"), ("작년", "2025"), ("다음 달", "2026-02"),
    ("지난주", "2025-12-22~2025-12-28"), ("이번 주", "2025-12-29~2026-01-04"),  # a week across the year
    ("3개월 전", "2025-10"), ("two days ago", "2025-12-30"), ("last month", "2025-12"), ("last year", "2025"),
])
def test_year_and_month_boundaries(text: str, expected: str) -> None:
    assert [label for _, label in _labels(text, NEW_YEAR)] == [expected]


def test_a_week_across_months() -> None:
    wednesday = datetime(2026, 12, 2, 9, 0, tzinfo=SEOUL).timestamp()
    assert _labels("이번 주", wednesday) == [("이번 주", "2026-11-30~2026-12-06")]
    assert _labels("last weekend", wednesday) == [("last weekend", "2026-11-28~2026-11-29")]


def test_the_day_is_read_in_the_zone() -> None:
    # 07:00 Monday in Seoul is still 22:00 Sunday in UTC
    said = datetime(2026, 11, 16, 7, 0, tzinfo=SEOUL).timestamp()
    assert datetime.fromtimestamp(said, UTC).date() == date(2026, 11, 15)
    assert _labels("어제", said, SEOUL) == [("어제", "2026-11-15")]
    assert _labels("어제", said, UTC) == [("어제", "2026-11-14")]
    assert _labels("이번 주", said, SEOUL) == [("이번 주", "2026-11-16~2026-11-22")]
    assert _labels("이번 주", said, UTC) == [("이번 주", "2026-11-09~2026-11-15")]
    # 23:30 in Seoul is 14:30 UTC, the same day in both
    late = datetime(2026, 11, 15, 23, 30, tzinfo=SEOUL).timestamp()
    assert _labels("어제", late, SEOUL) == _labels("어제", late, UTC) == [("어제", "2026-11-14")]


@pytest.mark.parametrize(("text", "expected"), [
    ("어제 부산으로 이사했어", "어제(2026-11-14) 부산으로 이사했어"),
    ("I moved to Busan yesterday", "I moved to Busan yesterday (2026-11-14)"),
    ("지난주에 만났고 다음 달에 이사해", "지난주(2026-11-02~2026-11-08)에 만났고 다음 달(2026-12)에 이사해"),
    ("yesterday's game was fun", "yesterday's (2026-11-14) game was fun"),
    ("작년, 3일 전, last year", "작년(2025), 3일 전(2026-11-12), last year (2025)"),
    ("어제 (2026-11-14) 봤어", "어제 (2026-11-14) 봤어"),  # already resolved, with a space
])
def test_annotate(text: str, expected: str) -> None:
    assert annotate_dates(text, SUNDAY, SEOUL) == expected


@pytest.mark.parametrize("text", [
    "어제 부산으로 이사했어", "I start the new job next Monday", "yesterday's game, then the day before yesterday",
    "지난주 금요일, 2주 뒤, in a few days, 재작년", "오늘날 말고 오늘", "a week ago and in a week",
])
def test_annotate_is_idempotent(text: str) -> None:
    once = annotate_dates(text, SUNDAY, SEOUL)
    assert once != text
    assert annotate_dates(once, SUNDAY, SEOUL) == once

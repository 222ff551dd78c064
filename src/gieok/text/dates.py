"""Dates named in a question, as time ranges a search can compare with block event times.

"What did Maria donate in December 2023?", "What did Nate do on 25 May, 2022?", "작년 여름에
어디 갔었지?", "지난주에 뭐 샀어?": a question that names a time says which turns can answer it.
`question_ranges` finds such phrases in English and Korean and resolves them to half-open
[start, end) UNIX-time ranges in a given time zone; relative ones ("yesterday", "last week",
"작년", "지난달") against a reference time, the moment the question is asked.

A date without a year ("in June", "3월에") matches that month in any year: the reader rarely
says the year of something the group talked about, and the conversation's own span decides.
Those come back as `MonthDay` patterns rather than ranges.

The parser is deliberately small and literal: it recognises the forms chat questions use and
returns nothing for anything else (a question without a date is not penalised; the ranking
feature is only "this turn lies in a range the question named").

Messages name dates the same way, relative to when they were said: "어제 부산으로 이사했어", "I start
the new job next Monday". Read weeks later, "어제" no longer says which day. `message_dates` resolves
such phrases against the moment the message was said, and `annotate_dates` writes the resolution
beside them ("어제(2026-11-14)"), for facts extracted from the message and for recalled turns in a
prompt. Only phrases whose day does not depend on tense are read: a bare weekday ("on Friday",
"금요일에") may be last week's or next week's, so it is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["DateQuery", "MonthDay", "asks_when", "mentions_time", "question_dates", "resolve_zone",
           "ResolvedDate", "annotate_dates", "message_dates", "calendar_time"]

_MONTHS = {
    name: number
    for number, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
         ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"),
         ("november", "nov"), ("december", "dec")], start=1)
    for name in names
}
_MONTH = r"(january|february|march|april|may|june|july|august|september|october|november|december|" \
         r"jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d{2})"
# Seasons as (first month, number of months); winter runs December to February.
_SEASONS = {"spring": (3, 3), "summer": (6, 3), "autumn": (9, 3), "fall": (9, 3), "winter": (12, 3),
            "봄": (3, 3), "여름": (6, 3), "가을": (9, 3), "겨울": (12, 3)}

_EN_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s*{_YEAR}\b", re.I)
_EN_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY},?\s*{_YEAR}\b", re.I)
_EN_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.I)
_EN_DAY_MONTH = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b", re.I)
_EN_MONTH_DAY = re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?!\s*(?:,?\s*\d{{4}}|:))", re.I)
_EN_MONTH = re.compile(rf"\b(?:in|during|of|since|early|late|mid|last|this|next)\s+(?:the\s+)?"
                       rf"(?:beginning\s+of\s+|end\s+of\s+)?{_MONTH}\b", re.I)
_EN_SEASON_YEAR = re.compile(rf"\b(spring|summer|autumn|fall|winter)\s+(?:of\s+)?{_YEAR}\b", re.I)
_EN_YEAR = re.compile(rf"\b(?:in|during|of|since|by)\s+{_YEAR}\b", re.I)
_EN_RELATIVE = re.compile(r"\b(yesterday|today|tonight|last\s+night|this\s+morning|"
                          r"(?:last|this|past)\s+(?:week|weekend|month|year|spring|summer|autumn|fall|winter)|"
                          r"(?:a|one|two|three|few|couple\s+of)\s+(?:days?|weeks?)\s+ago)\b", re.I)

_KO_FULL = re.compile(r"(?:((?:19|20)\d{2})\s*년\s*)?(\d{1,2})\s*월\s*(?:(\d{1,2})\s*일)?")
_KO_YEAR = re.compile(r"((?:19|20)\d{2})\s*년")
_KO_RELATIVE_YEAR = re.compile(r"(재작년|작년|지난\s*해|올해|금년|올(?=\s*(?:봄|여름|가을|겨울)))"
                               r"\s*(봄|여름|가을|겨울)?")
# Anything a date phrase needs; most questions have none of it and skip the parse.
_TRIGGER = re.compile(r"\d|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|yesterday|today|tonight|"
                      r"last|this|past|ago|spring|summer|autumn|fall|winter|"
                      r"어제|어저께|그제|그저께|오늘|지난|이번|저번|요번|작년|올해|올\s*[봄여가겨]|금년", re.I)
_KO_RELATIVE = re.compile(r"(그저께|그제|어제|어저께|오늘|지난\s*주말|이번\s*주말|지난\s*주|이번\s*주|저번\s*주|"
                          r"지난\s*달|저번\s*달|이번\s*달|요번\s*달)")


@dataclass(frozen=True, slots=True)
class MonthDay:
    """A month (and maybe a day) without a year: matches that date in any year."""

    month: int
    day: int | None = None


@dataclass(frozen=True, slots=True)
class DateQuery:
    """What a question said about time: absolute ranges [start, end) in UNIX seconds, and
    yearless month/day patterns. Empty when the question names no time."""

    ranges: tuple[tuple[float, float], ...] = ()
    patterns: tuple[MonthDay, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ranges or self.patterns)


def calendar_time(epoch: float, zone: tzinfo = UTC) -> datetime | None:
    """`epoch` (UNIX seconds) as a time in `zone`, or None for one no calendar holds. Times are
    checked where they are written (`validate.check_time`), but a memory written before a check
    existed may hold one (epoch milliseconds: the year 58822), and a stored value must never turn
    a read — a page, a search, a prompt — into an error."""
    try:
        return datetime.fromtimestamp(epoch, zone)
    except (OverflowError, OSError, ValueError):
        return None


def resolve_zone(name: str | None) -> tzinfo:
    """The zone dates are read in; UTC for an empty or unknown name."""
    if not name or name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _stamp(day: date, zone: tzinfo) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


def _day_range(day: date, zone: tzinfo) -> tuple[float, float]:
    return _stamp(day, zone), _stamp(day + timedelta(days=1), zone)


def _month_start(year: int, month: int) -> date:
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    return date(year, month, 1)


def _months_range(year: int, month: int, count: int, zone: tzinfo) -> tuple[float, float]:
    return _stamp(_month_start(year, month), zone), _stamp(_month_start(year, month + count), zone)


def _valid_day(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def _season_range(season: str, year: int, zone: tzinfo) -> tuple[float, float]:
    first, count = _SEASONS[season]
    return _months_range(year, first, count, zone)


class _Finder:
    """Collects ranges and patterns; every matched span is consumed so that "7 July, 2023"
    is not read again as "July" in any year."""

    def __init__(self, text: str, now: datetime, zone: tzinfo) -> None:
        self.text = text
        self.now = now
        self.today = now.date()
        self.zone = zone
        self.ranges: list[tuple[float, float]] = []
        self.patterns: list[MonthDay] = []

    def scan(self, pattern: re.Pattern[str], handle) -> None:
        def replace(match: re.Match[str]) -> str:
            return " " * len(match.group(0)) if handle(match) else match.group(0)

        self.text = pattern.sub(replace, self.text)

    def add_day(self, year: int, month: int, day: int) -> bool:
        found = _valid_day(year, month, day)
        if found is None:
            return False
        self.ranges.append(_day_range(found, self.zone))
        return True

    def add_relative_en(self, phrase: str) -> bool:
        phrase = " ".join(phrase.lower().split())
        today, zone = self.today, self.zone
        if phrase in ("today", "tonight", "this morning"):
            self.ranges.append(_day_range(today, zone))
        elif phrase in ("yesterday", "last night"):
            self.ranges.append(_day_range(today - timedelta(days=1), zone))
        elif phrase.endswith("ago"):
            self.ranges.append((_stamp(today - timedelta(days=21 if "week" in phrase else 7), zone),
                                _stamp(today, zone)))
        else:
            which, unit = phrase.split(" ", 1)
            last = which in ("last", "past")
            if unit in ("week", "weekend"):
                monday = today - timedelta(days=today.weekday())
                start = monday - timedelta(days=7) if last else monday
                if unit == "weekend":
                    start += timedelta(days=5)
                    self.ranges.append((_stamp(start, zone), _stamp(start + timedelta(days=2), zone)))
                else:
                    self.ranges.append((_stamp(start, zone), _stamp(start + timedelta(days=7), zone)))
            elif unit == "month":
                self.ranges.append(_months_range(today.year, today.month - (1 if last else 0), 1, zone))
            elif unit == "year":
                year = today.year - (1 if last else 0)
                self.ranges.append(_months_range(year, 1, 12, zone))
            else:
                first, _ = _SEASONS[unit]
                year = today.year - (1 if last else 0)
                if first == 12 and not last and today.month < 3:
                    year -= 1  # "this winter" in January began last December
                self.ranges.append(_season_range(unit, year, zone))
        return True

    def add_relative_ko(self, phrase: str) -> bool:
        phrase = phrase.replace(" ", "")
        today, zone = self.today, self.zone
        days_back = {"오늘": 0, "어제": 1, "어저께": 1, "그저께": 2, "그제": 2}
        if phrase in days_back:
            self.ranges.append(_day_range(today - timedelta(days=days_back[phrase]), zone))
            return True
        monday = today - timedelta(days=today.weekday())
        last = phrase.startswith(("지난", "저번"))
        if phrase.endswith("주말"):
            saturday = monday + timedelta(days=5 - (7 if last else 0))
            self.ranges.append((_stamp(saturday, zone), _stamp(saturday + timedelta(days=2), zone)))
        elif phrase.endswith("주"):
            start = monday - timedelta(days=7 if last else 0)
            self.ranges.append((_stamp(start, zone), _stamp(start + timedelta(days=7), zone)))
        else:  # 지난달 / 저번달 / 이번달 / 요번달
            self.ranges.append(_months_range(today.year, today.month - (1 if last else 0), 1, zone))
        return True

    def add_relative_year_ko(self, which: str, season: str | None) -> bool:
        which = which.replace(" ", "")
        back = {"재작년": 2, "작년": 1, "지난해": 1, "올해": 0, "올": 0, "금년": 0}[which]
        year = self.today.year - back
        if season:
            self.ranges.append(_season_range(season, year, self.zone))
        else:
            self.ranges.append(_months_range(year, 1, 12, self.zone))
        return True


def question_dates(text: str, now: float, zone: tzinfo = UTC) -> DateQuery:
    """The times `text` names, resolved in `zone`; relative ones against `now` (UNIX seconds)."""
    if not _TRIGGER.search(text):
        return DateQuery()
    finder = _Finder(text, datetime.fromtimestamp(now, zone), zone)
    month = _MONTHS.__getitem__

    def month_of(name: str) -> int:
        return month(name.lower().rstrip("."))

    finder.scan(_EN_DAY_MONTH_YEAR, lambda m: finder.add_day(int(m.group(3)), month_of(m.group(2)), int(m.group(1))))
    finder.scan(_EN_MONTH_DAY_YEAR, lambda m: finder.add_day(int(m.group(3)), month_of(m.group(1)), int(m.group(2))))

    def month_year(m: re.Match[str]) -> bool:
        finder.ranges.append(_months_range(int(m.group(2)), month_of(m.group(1)), 1, zone))
        return True

    finder.scan(_EN_MONTH_YEAR, month_year)

    def season_year(m: re.Match[str]) -> bool:
        finder.ranges.append(_season_range(m.group(1).lower(), int(m.group(2)), zone))
        return True

    finder.scan(_EN_SEASON_YEAR, season_year)
    absolute = bool(finder.ranges)  # "last weekend before April 10, 2023": the date, not today, anchors it
    finder.scan(_EN_RELATIVE, lambda m: absolute or finder.add_relative_en(m.group(1)))

    def day_month(m: re.Match[str], day_group: int, month_group: int) -> bool:
        day, mon = int(m.group(day_group)), month_of(m.group(month_group))
        if _valid_day(2000, mon, day) is None:  # 2000 is a leap year: 29 February is valid
            return False
        finder.patterns.append(MonthDay(mon, day))
        return True

    finder.scan(_EN_DAY_MONTH, lambda m: day_month(m, 1, 2))
    finder.scan(_EN_MONTH_DAY, lambda m: day_month(m, 2, 1))

    def bare_month(m: re.Match[str]) -> bool:
        name = m.group(0).split()[-1]
        finder.patterns.append(MonthDay(month_of(name)))
        return True

    finder.scan(_EN_MONTH, bare_month)

    def year_only(m: re.Match[str]) -> bool:
        finder.ranges.append(_months_range(int(m.group(1)), 1, 12, zone))
        return True

    finder.scan(_EN_YEAR, year_only)

    def ko_full(m: re.Match[str]) -> bool:
        year, mon, day = m.group(1), int(m.group(2)), m.group(3)
        if not 1 <= mon <= 12:
            return False
        if year is None:
            if day is not None and _valid_day(2000, mon, int(day)) is None:
                return False
            finder.patterns.append(MonthDay(mon, int(day) if day else None))
            return True
        if day is not None:
            return finder.add_day(int(year), mon, int(day))
        finder.ranges.append(_months_range(int(year), mon, 1, zone))
        return True

    finder.scan(_KO_FULL, ko_full)
    finder.scan(_KO_YEAR, year_only)
    absolute = bool(finder.ranges)
    finder.scan(_KO_RELATIVE_YEAR, lambda m: absolute or finder.add_relative_year_ko(m.group(1), m.group(2)))
    finder.scan(_KO_RELATIVE, lambda m: absolute or finder.add_relative_ko(m.group(1)))
    return DateQuery(tuple(finder.ranges), tuple(finder.patterns))


# Index tokens (gieok's tokenizer: Snowball stems, kiwi lemmas) that say when something happens.
_TIME_TOKENS = frozenset({
    "yesterday", "today", "tomorrow", "tonight", "morn", "morning", "afternoon", "even", "evening", "night",
    "week", "weekend", "month", "year", "ago", "last", "next", "earlier", "later", "soon", "date", "day",
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "januari", "februari",
    "march", "april", "may", "june", "juli", "august", "septemb", "octob", "novemb", "decemb",
    "spring", "summer", "autumn", "fall", "winter", "birthday", "anniversari",
    "어제", "그제", "그저께", "오늘", "내일", "모레", "주말", "평일", "작년", "올해", "내년", "지난주", "다음주",
    "이번주", "지난달", "다음달", "저녁", "아침", "점심", "새벽", "밤", "오전", "오후", "월요일", "화요일", "수요일",
    "목요일", "금요일", "토요일", "일요일", "봄", "여름", "가을", "겨울", "생일", "날짜", "요일", "달", "주",
})
_ASKS_WHEN = re.compile(r"\bwhen\b|\bwhat (?:date|day|time|month|year)\b|\bhow long\b|\bwhich (?:day|month|year)\b|"
                        r"언제|며칠|몇\s*(?:월|일|시|년|주|개월|시간|분)|날짜|무슨\s*요일", re.I)


def asks_when(text: str) -> bool:
    """Whether a question asks for a time ("When is Jihoon going to Busan?", "생일이 언제야?")."""
    return bool(_ASKS_WHEN.search(text))


def mentions_time(tokens: list[str]) -> bool:
    """Whether a text's index tokens name a time: a number ("6월 20일" → 6, 20) or a time word."""
    return any(t.isdigit() or t in _TIME_TOKENS for t in tokens)


# Relative dates in messages. A Korean phrase starts a word (엊그제, "a few days ago", is not 그제);
# words that merely begin like one are excluded: 오늘날 (nowadays), 그제야 (only then), 이번 주문 (this order),
# 다음 달러, 6일 전쟁, 이틀 전부 (all two days), 하루 전날 (the eve of something else).
_KO_WORD = r"(?<![가-힣])"
_MSG_KO_DAY = re.compile(_KO_WORD + r"(그저께|그제(?!야|서)|어저께|어젯밤|어제(?!오늘)|오늘(?!날(?!씨)|내일)|"
                         r"내일(?!모레)|모레|글피)")
_MSG_KO_WEEKDAY = re.compile(_KO_WORD + r"(지난|저번|이번|요번|다음)\s*(주\s*)?([월화수목금토일])요일")
_MSG_KO_PERIOD = re.compile(_KO_WORD + r"(지난|저번|이번|요번|다음)\s*"
                            r"(주말|주(?!제|문|소|인|식|차|스|사|유|택|목|연|장|요|민|변|력|자)|달(?!러|력|리|래|콤|걀|빛))")
_MSG_KO_YEAR = re.compile(_KO_WORD + r"(재작년|작년|지난해|올해|금년|내후년|내년)")
_MSG_KO_COUNT = re.compile(r"(?<![\d.,가-힣])(?<!월\s)"  # "5월 3일 전에" is before the 3rd of May
                           r"(?:(\d{1,3})\s*(일|주일?|달|개월|년)|([한일두세석네넉])\s*(주일?|달|개월|년|해)|"
                           r"(하루|이틀|사흘|나흘|닷새|엿새|이레|열흘|보름))\s*"
                           r"(전(?!쟁|세|국|략|통|화|체|문|혀|날|부(?!터))|후(?!보|회|배|반|원|식|기)|뒤(?!집|쪽|편|풀))")
_EN_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_EN_COUNT = r"\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|(?:a\s+)?couple(?:\s+of)?|(?:a\s+)?few"
# English phrases end at a Latin letter, not at \b: Korean particles attach to them ("next Friday에"),
# and Hangul counts as a word character. "the next week", "the last night of the trip" follow the
# story, not the day it was told.
_EN_START, _EN_END = r"(?<![a-z\d])(?<!the\s)", r"(?![a-z\d])"
_MSG_EN_DAY = re.compile(rf"{_EN_START}(the\s+day\s+(?:before\s+yesterday|after\s+tomorrow)|yesterday|today|tonight|"
                         rf"tomorrow|last\s+night|this\s+(?:morning|afternoon|evening)){_EN_END}", re.I)
_MSG_EN_PERIOD = re.compile(rf"{_EN_START}(last|this|next)\s+(weekend|week|month|year|{'|'.join(_EN_WEEKDAYS)})"
                            rf"{_EN_END}", re.I)
_MSG_EN_COUNT = re.compile(rf"{_EN_START}(?:in\s+({_EN_COUNT})\s+(day|week|month|year)s?|"
                           rf"({_EN_COUNT})\s+(day|week|month|year)s?\s+(ago|from\s+now)){_EN_END}", re.I)
# Anything a message date needs; the lookahead (each alternative's first letter) lets most positions
# of a message without one fail at a glance.
_MESSAGE_TRIGGER = re.compile(r"(?=[어그오내모글지저이요다작올금일주달월년해루틀흘새레름ytlnafi])(?:"
                              r"어제|어저께|어젯|그제|그저께|오늘|내일|모레|글피|"
                              r"지난|저번|이번|요번|다음|작년|올해|금년|내년|내후년|"
                              r"[일주달월년해루틀흘새레름]\s*[전후뒤]|yesterday|today|tonight|tomorrow|"
                              r"(?:last|this|next)\s+(?:week|month|year|night|morning|afternoon|evening|"
                              r"mon|tue|wed|thu|fri|sat|sun)|ago|from\s+now|"
                              r"in\s+(?:\d|an?\s|one|two|three|four|five|six|seven|eight|nine|ten|a\s+couple|"
                              r"a\s+few|couple|few))", re.I)
_HANGUL = re.compile(r"[가-힣]")
# "yesterday's (2026-11-14) game", not "yesterday (2026-11-14)'s game"
_POSSESSIVE = re.compile(r"['’]s(?![a-z])", re.I)

_KO_DAYS = {"오늘": 0, "어제": -1, "어저께": -1, "어젯밤": -1, "그제": -2, "그저께": -2,
            "내일": 1, "모레": 2, "글피": 3}
_EN_DAYS = {"the day before yesterday": -2, "yesterday": -1, "last night": -1, "today": 0, "tonight": 0,
            "this morning": 0, "this afternoon": 0, "this evening": 0, "tomorrow": 1, "the day after tomorrow": 2}
_KO_WHICH = {"지난": -1, "저번": -1, "이번": 0, "요번": 0, "다음": 1}
_EN_WHICH = {"last": -1, "this": 0, "next": 1}
_KO_YEARS = {"재작년": -2, "작년": -1, "지난해": -1, "올해": 0, "금년": 0, "내년": 1, "내후년": 2}
_COUNTS = {"하루": 1, "이틀": 2, "사흘": 3, "나흘": 4, "닷새": 5, "엿새": 6, "이레": 7, "열흘": 10, "보름": 15,
           "한": 1, "일": 1, "두": 2, "세": 3, "석": 3, "네": 4, "넉": 4,
           "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "couple": 2, "few": 3}
# A counted unit as (the unit of the span it names, days per count): weeks back or ahead name one day.
_COUNT_UNITS = {"일": ("day", 1), "주": ("day", 7), "주일": ("day", 7), "달": ("month", 1), "개월": ("month", 1),
                "년": ("year", 1), "해": ("year", 1),
                "day": ("day", 1), "week": ("day", 7), "month": ("month", 1), "year": ("year", 1)}

_Span = tuple[date, date]


@dataclass(frozen=True, slots=True)
class ResolvedDate:
    """A relative date phrase at text[start:end], naming the days first..last (inclusive) in the
    message's zone; `label` is how it is written beside the phrase: a day "2026-11-14", a span of
    days "2026-11-09~2026-11-15", a calendar month "2026-10", a calendar year "2025"."""

    start: int
    end: int
    phrase: str
    first: date
    last: date
    label: str


def _span(day: date, offset: int, unit: str) -> _Span:
    """The day, week (Monday–Sunday), weekend, month or year `offset` of them from the one holding `day`."""
    if unit == "day":
        return day + timedelta(days=offset), day + timedelta(days=offset)
    if unit in ("week", "weekend"):
        first = day - timedelta(days=day.weekday()) + timedelta(weeks=offset)
        if unit == "weekend":
            return first + timedelta(days=5), first + timedelta(days=6)
        return first, first + timedelta(days=6)
    if unit == "month":
        return (_month_start(day.year, day.month + offset),
                _month_start(day.year, day.month + offset + 1) - timedelta(days=1))
    return date(day.year + offset, 1, 1), date(day.year + offset, 12, 31)


def _weekday(day: date, offset: int, weekday: int, in_week: bool) -> _Span:
    """A weekday (0 = Monday) in the week `offset` weeks from `day`'s ("이번 주 금요일", "next Friday"), or,
    not `in_week`, the nearest one strictly before (offset < 0: "last Friday") or after `day` ("다음 금요일")."""
    if in_week:
        found = day - timedelta(days=day.weekday()) + timedelta(weeks=offset, days=weekday)
    elif offset < 0:
        found = day - timedelta(days=(day.weekday() - weekday - 1) % 7 + 1)
    else:
        found = day + timedelta(days=(weekday - day.weekday() - 1) % 7 + 1)
    return found, found


def _counted(count: int, unit: str, later: bool, day: date) -> _Span:
    kind, days = _COUNT_UNITS[unit]
    return _span(day, count * days * (1 if later else -1), kind)


def _ko_weekday(m: re.Match[str], day: date) -> _Span:
    which = _KO_WHICH[m.group(1)]
    # 지난/다음 금요일 alone: the nearest Friday before or after; with 주, or 이번: that week's Friday
    return _weekday(day, which, "월화수목금토일".index(m.group(3)), bool(m.group(2)) or which == 0)


def _en_period(m: re.Match[str], day: date) -> _Span:
    which, unit = _EN_WHICH[m.group(1).lower()], m.group(2).lower()
    if unit in _EN_WEEKDAYS:  # last Friday: the nearest before; this/next Friday: this/next week's
        return _weekday(day, which, _EN_WEEKDAYS.index(unit), which >= 0)
    return _span(day, which, unit)


def _ko_count(m: re.Match[str], day: date) -> _Span:
    count = int(m.group(1)) if m.group(1) else _COUNTS[m.group(3) or m.group(5)]
    return _counted(count, m.group(2) or m.group(4) or "일", m.group(6) != "전", day)


def _en_count(m: re.Match[str], day: date) -> _Span:
    words = (m.group(1) or m.group(3)).lower().split()
    count = int(words[0]) if words[0].isdigit() else next(_COUNTS[w] for w in reversed(words) if w in _COUNTS)
    return _counted(count, (m.group(2) or m.group(4)).lower(), (m.group(5) or "").lower() != "ago", day)


_MESSAGE_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], date], _Span]], ...] = (
    (_MSG_KO_DAY, lambda m, day: _span(day, _KO_DAYS[m.group(1)], "day")),
    (_MSG_KO_WEEKDAY, _ko_weekday),
    (_MSG_KO_PERIOD, lambda m, day: _span(day, _KO_WHICH[m.group(1)],
                                          {"주말": "weekend", "주": "week", "달": "month"}[m.group(2)])),
    (_MSG_KO_YEAR, lambda m, day: _span(day, _KO_YEARS[m.group(1)], "year")),
    (_MSG_KO_COUNT, _ko_count),
    (_MSG_EN_DAY, lambda m, day: _span(day, _EN_DAYS[" ".join(m.group(1).lower().split())], "day")),
    (_MSG_EN_PERIOD, _en_period),
    (_MSG_EN_COUNT, _en_count),
)


def _date_label(first: date, last: date) -> str:
    if first == last:
        return first.isoformat()
    if first.day == 1 and (last + timedelta(days=1)).day == 1:
        if first.year == last.year and (first.month, last.month) == (1, 12):
            return f"{first.year:04d}"
        if (first.year, first.month) == (last.year, last.month):
            return first.isoformat()[:7]
    return f"{first.isoformat()}~{last.isoformat()}"


def message_dates(text: str, said_at: float, zone: tzinfo = UTC) -> list[ResolvedDate]:
    """Relative date phrases in `text`, resolved against the moment it was said (UNIX seconds) in
    `zone`, in order of position; [] when none. Where phrases overlap the longer one wins
    ("the day before yesterday", not "yesterday"; "지난주 금요일", not "지난주")."""
    if not _MESSAGE_TRIGGER.search(text):
        return []
    moment = calendar_time(said_at, zone)
    if moment is None:
        return []
    day = moment.date()
    found = sorted(((m.start(), m.end(), resolve(m, day)) for pattern, resolve in _MESSAGE_PATTERNS
                    for m in pattern.finditer(text)), key=lambda f: (f[0], -f[1]))
    dates: list[ResolvedDate] = []
    for start, end, (first, last) in found:
        if not dates or start >= dates[-1].end:
            dates.append(ResolvedDate(start, end, text[start:end], first, last, _date_label(first, last)))
    return dates


def annotate_dates(text: str, said_at: float, zone: tzinfo = UTC) -> str:
    """`text` with each relative date followed by its resolution: "어제(2026-11-14) 부산으로 이사했어",
    "I moved to Busan yesterday (2026-11-14)". A phrase already followed by its resolution is left as
    is, so annotating twice changes nothing; text without a relative date comes back as it was."""
    parts: list[str] = []
    done = 0
    for found in message_dates(text, said_at, zone):
        at = found.end
        if _HANGUL.search(found.phrase):
            note = f"({found.label})"
        else:
            note = f" ({found.label})"
            possessive = _POSSESSIVE.match(text, at)
            at = possessive.end() if possessive else at
        if text.startswith(note, at) or text.startswith(f" ({found.label})", at):
            continue
        parts += [text[done:at], note]
        done = at
    return "".join(parts) + text[done:] if parts else text

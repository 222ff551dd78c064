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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["DateQuery", "MonthDay", "asks_when", "mentions_time", "question_dates", "resolve_zone"]

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

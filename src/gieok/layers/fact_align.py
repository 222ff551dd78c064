"""The offline fact judge's reading of a pair: token-level alignment of what changed.

Two facts about one subject are read as (subject, attribute, value) without a parser: both
are tokenized by gieok's tokenizer (Korean lemmas, English Snowball stems), user references
are set aside as the subject, numbers are read with their unit ("24살" is an age, "5시" a
time), and a small lexicon folds the words facts are usually written with onto concepts
("산다", "거주지", "lives", "based in" → residence). The two concept sequences are aligned
(difflib), and a token found anywhere on the other side counts as moved, not changed, since
Korean word order is free. What is left is the *changed span* on each side:

- nothing changed, and numbers, negation and change words ("이제", "quit") agree → duplicate;
- the same attribute with another value (one short slot replaced where the attribute holds
  one value at a time — a name, a home, a job, an age — or a number of the same unit, or the
  same statement negated, or turned into its opposite) → conflict: the new fact supersedes;
- anything else — another attribute, more than one slot, a value of a many-valued attribute
  ("also speaks Chinese") → distinct: both are kept.

A paraphrase whose changed span the lexicon does not cover stays "distinct" (stored twice):
that costs a line of prompt, while a false duplicate would lose a fact and a false conflict
would retire one. The lexicon lists words, not pairs: it was written from what facts are
about (home, work, likes, family …), and checked on the dev half of the labeled pairs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from ..text.tokenize import get_tokenizer

__all__ = ["FactShape", "Alignment", "shape_of", "align", "judge_shapes"]

_HANGUL = re.compile(r"[\uac00-\ud7a3]")
USER_REF = re.compile(r"<user:(\d+)>")
_LEADING_REF = re.compile(r"^\s*<user:(\d+)>")

# concept -> words facts are written with, as they appear in a sentence; each is read through
# the tokenizer once (Korean lemmas, English stems), and words that give more than one token
# are left out. General vocabulary for what facts are about, not a list of pairs.
_CONCEPTS: dict[str, tuple[str, ...]] = {
    "@reside": ("산다", "거주한다", "거주지", "지낸다", "사는곳", "lives", "resides", "based", "stays"),
    "@job": ("일한다", "근무한다", "재직", "직업", "직장", "다닌다", "종사한다", "works", "job", "employed",
             "occupation",
             "profession", "career"),
    "@like": ("좋아한다", "좋다", "선호한다", "즐긴다", "애정한다", "사랑한다", "최애", "취미", "팬", "likes", "loves",
              "enjoys", "prefers", "fan", "fond", "favorite", "favourite", "hobby", "keen"),
    "@dislike": ("싫어한다", "싫다", "질색한다", "꺼린다", "혐오한다", "hates", "dislikes", "detests", "loathes",
                 "despises"),
    "@own": ("가지다", "보유한다", "소유한다", "owns", "possesses"),
    "@born": ("태어났다", "출생", "고향", "출신", "태생", "born", "hometown"),
    "@learn": ("배운다", "공부한다", "익힌다", "학습한다", "learns", "studies", "studying"),
    "@allergy": ("알레르기", "allergic", "allergy"),
    "@older": ("older", "big", "elder"),
    "@younger": ("younger", "little"),
    "@raise": ("키운다", "기른다", "raises"),
    "@film": ("영화", "movie", "film"),
    "@post": ("올린다", "게시한다", "posts"),
    "@speak": ("구사한다", "speaks"),
    "@score": ("점수", "score"),
    "@age": ("나이", "age"),
    "@married": ("결혼", "기혼", "married", "wed"),
    "@divorced": ("이혼", "divorced"),
    "@play": ("플레이한다", "plays"),
    "@daily": ("매일", "daily", "everyday"),
    "@gym": ("헬스", "체육관", "gym", "workout"),
    "@phone": ("폰", "핸드폰", "휴대폰", "스마트폰", "phone", "smartphone", "cellphone"),
    "@dog": ("강아지", "반려견", "dog", "puppy"),
    "@cat": ("고양이", "냥이", "cat", "kitty"),
    "@father": ("아빠", "아버지", "dad", "father"),
    "@mother": ("엄마", "어머니", "mom", "mother"),
    "@girlfriend": ("여친", "여자친구", "girlfriend"),
    "@boyfriend": ("남친", "남자친구", "boyfriend"),
    "@discord": ("디코", "디스코드", "discord"),
    "@lol": ("롤", "lol"),
    "@minecraft": ("마크", "마인크래프트", "minecraft"),
    "@overwatch": ("옵치", "오버워치", "overwatch"),
    "@pubg": ("배그", "배틀그라운드", "pubg"),
    "@university": ("대학", "university", "college"),
    "@vegetarian": ("채식주의자", "vegetarian", "veggie"),
}
# Words that add nothing to what a fact states about its attribute (how often, how strongly,
# "its name is"): left out when deciding whether anything changed.
_LIGHT = frozenset({
    "주로", "보통", "평소", "현재", "전혀", "아예", "항상", "늘", "원래", "이름", "매주", "열리다", "음식", "받다",
    "usual", "typic", "current", "name", "call", "also", "alway", "languag", "main", "most", "hold", "realli",
    "year", "old", "@own",
})
# Attributes holding one value at a time: a new value replaces the old one.
# Words, not concepts: "works" shares a concept with "job" but a person works on many things.
_SINGLE = frozenset({"살다", "거주", "거주지", "live", "resid", "base", "직업", "직장", "다니다", "job", "태어나다",
                     "고향", "출신", "born", "hometown", "점수", "score", "이름", "name", "생일", "birthday", "나이",
                     "age", "mbti", "main", "포지션", "position", "장", "owner", "주소", "address", "전공", "major"})
# Units that name an attribute by themselves.
_UNIT_CONCEPTS = {"age": "@age", "score": "@score", "grade": "학년"}
# A change of state: one side has it, the other does not.
_MARKERS = frozenset({
    "이제", "다시", "요즘", "지금", "끊다", "그만두다", "그만", "접다", "옮기다", "이사", "바꾸다",
    "now", "again", "quit", "stop", "gave", "sold", "switch", "move", "turn", "anymor", "longer", "former",
    "transfer",
})
# Concepts that say how a subject relates to a value, not what the value is.
_PREDICATES = frozenset({"@reside", "@job", "@like", "@dislike", "@own", "@born", "@learn", "@raise", "@post",
                         "@speak", "@play", "@married", "@divorced", "@daily"})
# Pairs of concepts that say opposite things about one attribute.
_OPPOSITE = frozenset({frozenset({"@like", "@dislike"}), frozenset({"@married", "@divorced"})})
_WEEKDAYS = frozenset({"월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일", "monday", "tuesday",
                       "wednesday", "thursday", "friday", "saturday", "sunday"})

_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "once": 1, "twice": 2, "하나": 1, "둘": 2, "셋": 3, "넷": 4, "한": 1, "두": 2, "세": 3,
    "네": 4, "다섯": 5, "여섯": 6, "일곱": 7, "여덟": 8, "아홉": 9, "열": 10, "열한": 11, "열두": 12, "스무": 20,
}
_KO_NATIVE = "열한|열두|하나|다섯|여섯|일곱|여덟|아홉|스무|둘|셋|넷|한|두|세|네|열"
_KO_UNITS = ("년생", "주년", "학년", "시간", "살", "세", "시", "분", "점", "명", "마리", "개", "번", "회", "년", "월",
             "일", "층", "교대", "kg", "cm")
_UNIT_CANON = {"살": "age", "세": "age", "시": "time", "a.m.": "time", "p.m.": "time", "am": "time", "pm": "time",
               "o'clock": "time", "점": "score", "point": "score", "points": "score", "학년": "grade",
               "grade": "grade", "년생": "year", "년": "year", "times": "times", "time": "times", "번": "times",
               "회": "times"}
_NUMBER = re.compile(
    rf"(?<![\w.])(?P<n>\d+(?:[.,]\d+)?|{'|'.join(w for w in _NUMBER_WORDS if w.isascii())}"
    rf"|(?:{_KO_NATIVE})(?=\s*(?:{'|'.join(_KO_UNITS)}))|하나(?=\s|$|[.,!?]))"
    rf"\s*(?P<unit>{'|'.join(_KO_UNITS)}|(?:[A-Za-z][A-Za-z.']*)(?:\s+old)?)?",
    re.IGNORECASE)
_USED_TO = re.compile(r"\bused to\b", re.IGNORECASE)
_NEGATION = re.compile(
    r"(?:\bnot\b|n't\b|\bnever\b|\bno\b|않|(?:^|\s)안\s|(?:^|\s)못|아니|없)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class FactShape:
    """What the judge reads from one fact."""

    subject: str | None  # the user a fact is about (the reference it starts with), or None
    concepts: tuple[str, ...]  # content tokens folded onto concepts, in order; numbers left out
    single: frozenset[str]  # concepts this side names with a single-valued attribute word
    numbers: frozenset[tuple[float, str]]  # (value, unit); unit "" when none was read
    negated: bool
    markers: frozenset[str]  # change-of-state words

    def content(self) -> tuple[str, ...]:
        """The concepts that must agree for a duplicate (light words and change words left out)."""
        return tuple(c for c in self.concepts if c not in _LIGHT and c not in _MARKERS)


@dataclass(frozen=True, slots=True)
class Alignment:
    shared: tuple[str, ...]
    old_spans: tuple[tuple[str, ...], ...]  # changed spans of the older fact
    new_spans: tuple[tuple[str, ...], ...]

    @property
    def old_changed(self) -> tuple[str, ...]:
        return tuple(t for span in self.old_spans for t in span)

    @property
    def new_changed(self) -> tuple[str, ...]:
        return tuple(t for span in self.new_spans for t in span)


@cache
def _concept_of() -> dict[str, str]:
    tokenizer = get_tokenizer()
    folded: dict[str, str] = {}
    for concept, words in _CONCEPTS.items():
        for word in words:
            tokens = tokenizer.tokens(word)
            if len(tokens) == 1:
                folded.setdefault(tokens[0], concept)
    return folded


def _is_number_token(token: str) -> bool:
    return token.replace(".", "").replace(",", "").isdigit() or token in _NUMBER_WORDS


def _unit(raw: str | None, value: str) -> str:
    if not raw:
        return "year" if len(value) == 4 and value.isdigit() else ""
    unit = raw.lower()
    if unit.endswith(" old") or unit.startswith("year-old"):
        return "age"
    if len(value) == 4 and value.isdigit() and unit not in _KO_UNITS:
        return "year"
    unit = _UNIT_CANON.get(unit, unit)
    return unit[:-1] if unit.endswith("s") and len(unit) > 3 else unit


def _numbers(text: str) -> frozenset[tuple[float, str]]:
    found = set()
    for match in _NUMBER.finditer(text):
        raw = match.group("n").lower()
        value = float(_NUMBER_WORDS[raw]) if raw in _NUMBER_WORDS else float(raw.replace(",", ""))
        found.add((value, _unit(match.group("unit"), raw)))
    return frozenset(found)


def shape_of(text: str, tokens: Sequence[str]) -> FactShape:
    """Read a fact: `tokens` are the tokenizer's tokens of `text`. The user reference a fact
    starts with is its subject; any other reference is a value ("the owner is <user:2>")."""
    leading = _LEADING_REF.match(text)
    subject = leading.group(1) if leading else None
    values = set(USER_REF.findall(text)) - {subject}
    plain = USER_REF.sub(" ", text)
    concept_of = _concept_of()
    concepts: list[str] = []
    single: set[str] = set()
    for token in tokens:
        if token == "user" or token == subject or (_is_number_token(token) and token not in values):
            continue
        concept = f"<user:{token}>" if token in values else concept_of.get(token, token)
        concepts.append(concept)
        if token in _SINGLE:
            single.add(concept)
    numbers = _numbers(plain)
    for unit in sorted({u for _, u in numbers} & set(_UNIT_CONCEPTS)):
        concepts.append(_UNIT_CONCEPTS[unit])  # "24살" says "age" as much as "나이" does
    if "년생" in plain:
        concepts.append("@born")
    negated = bool(_NEGATION.search(plain))
    if negated and "@like" in concepts:  # "doesn't like", "isn't a fan of" → dislikes
        concepts = ["@dislike" if c == "@like" else c for c in concepts]
        negated = False
    markers = frozenset({c for c in concepts if c in _MARKERS} | ({"used to"} if _USED_TO.search(plain) else set()))
    return FactShape(subject, tuple(concepts), frozenset(single), numbers, negated, markers)


def align(old: Sequence[str], new: Sequence[str]) -> Alignment:
    """Changed spans of two token sequences: difflib's opcodes, less tokens that only moved."""
    old_set, new_set = set(old), set(new)
    shared: list[str] = []
    old_spans: list[tuple[str, ...]] = []
    new_spans: list[tuple[str, ...]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            shared.extend(old[i1:i2])
            continue
        shared.extend(t for t in old[i1:i2] if t in new_set)
        gone = tuple(t for t in old[i1:i2] if t not in new_set)
        came = tuple(t for t in new[j1:j2] if t not in old_set)
        if gone:
            old_spans.append(gone)
        if came:
            new_spans.append(came)
    return Alignment(tuple(shared), tuple(old_spans), tuple(new_spans))


def _values(numbers: frozenset[tuple[float, str]]) -> frozenset[float]:
    return frozenset(v for v, _ in numbers)


def _number_changed(old: FactShape, new: FactShape) -> bool:
    """A unit both sides give a value in, with different values (24살 → 25살, 6 a.m. → 9 a.m.)."""
    units = {u for _, u in old.numbers} & {u for _, u in new.numbers}
    return any({v for v, u in old.numbers if u == unit} != {v for v, u in new.numbers if u == unit}
               for unit in units)


def _same_kind_of_value(old: tuple[str, ...], new: tuple[str, ...]) -> bool:
    pair = frozenset(old + new)
    return pair in _OPPOSITE or (len(pair) == 2 and pair <= _WEEKDAYS)


def _translated(alignment: Alignment) -> bool:
    """A changed span in Hangul on one side and in Latin letters on the other is most likely
    the same value translated ("인천" / "Incheon"), not a new one."""
    def script(tokens: tuple[str, ...]) -> set[bool]:
        return {bool(_HANGUL.search(t)) for t in tokens if not t.startswith(("@", "<"))}
    old, new = script(alignment.old_changed), script(alignment.new_changed)
    return bool(old) and bool(new) and old != new


def _shared_single(old: FactShape, new: FactShape) -> bool:
    """Does the part both facts share name an attribute that holds one value at a time? Judged
    on the words each side used ("직업", "lives", "이름"), not on the folded concept ("works"
    is folded with "job" for duplicates, but a person works on many things)."""
    return bool(old.single & new.single & set(old.concepts) & set(new.concepts))


def judge_shapes(old: FactShape, new: FactShape) -> tuple[str, str]:
    """(duplicate | conflict | distinct, the reason in a few words)."""
    if old.subject != new.subject:
        return "distinct", "about someone else"
    content = align(old.content(), new.content())
    values_equal = _values(old.numbers) == _values(new.numbers)
    unchanged = not content.old_changed and not content.new_changed
    if unchanged and values_equal and old.negated == new.negated and old.markers == new.markers:
        return "duplicate", "nothing changed"
    if unchanged:
        if _number_changed(old, new):
            return "conflict", "a number of the same unit changed"
        if values_equal and old.negated != new.negated:
            return "conflict", "negated"
        if values_equal and old.markers != new.markers:
            return "conflict", "a change of state"
    slot = (len(content.old_spans) == 1 and len(content.new_spans) == 1
            and len(content.old_changed) == len(content.new_changed) <= 2)
    if slot and values_equal and old.negated == new.negated and not _translated(content):
        if _same_kind_of_value(content.old_changed, content.new_changed):
            return "conflict", "the opposite value"
        if _shared_single(old, new):
            return "conflict", "a single-valued attribute got another value"
    anchored = any(c not in _LIGHT and c not in _PREDICATES for c in content.shared)
    if new.markers - old.markers and anchored and len(content.old_changed) <= 2 and not old.negated:
        return "conflict", "a change of state"
    return "distinct", "another attribute, or more than one slot changed"

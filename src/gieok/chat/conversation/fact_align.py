"""The offline fact judge's reading of a pair: token-level alignment of what changed.

Two facts about one subject are read as (subject, attribute, value) without a parser: both
are tokenized by gieok's tokenizer (Korean lemmas, English Snowball stems; a Korean fact with its
subject read as a pronoun, so that kiwi reads "개발자예요" as "개발자다"), user references
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

Before a changed span counts as a change, what the words *are* is looked at, not which words
they are, so that wording the lexicon never saw still lines up:

- an adverb on one side only (kiwi's MAG, an English "-ly" word, "every"/"매주") says how
  often or how much, not what — it is set aside; two different adverbs still differ;
- numbers are read with Korean counters ("세 잔" = "3잔" = 3) and units of measure ("180cm" =
  "180센티"), and the counter or unit is set aside;
- the grammar of ability is read as such, not as words: "할 줄 안다" = "할 수 있다" = "can" =
  "is able to" = "knows how to", "탈 줄 모른다" = "못 탄다" = "can't"; an ability and a habit
  ("can drive" / "drives to work") are not one fact;
- "works as" / "일한다" on one side only says what "is a" says ("works as a nurse" / "is a nurse
  at a hospital"), unless the other side has a predicate of its own ("lives" / "works");
- tokens are paired off across the sides by their form: a Hangul word and its romanisation
  ("나비" / "Nabi", "부산" / "Busan"), an English word and its derivation ("bass" / "bassist",
  "fluent" / "fluently"), a Korean abbreviation made of its word's syllables in order
  ("배그" / "배틀그라운드"), words split or joined by spacing ("컴퓨터공학" / "컴퓨터 공학"), an acronym
  of three or more capitals and the words its capitals begin ("NYC" / "New York City");
- a new fact that says *less* than the old one (its every content word is in the old one) adds
  nothing: a duplicate, unless what it leaves out names another person ("X's wife drives a
  Civic" → "X drives a Civic") or the two differ in a number, negation, change word or
  modality ("wants to", "싶다", "예정");
- a new fact that adds one common word to the old one ("a nurse" → "a nurse at a hospital")
  is a duplicate when that word is not a name, a number, another person, a verb or a change word,
  and is not about someone or something else: not when the new fact's subject is a possessive
  head the old fact only mentions ("X는 여동생이 있다" → "X의 여동생은 고등학생이다", "X has a car"
  → "X's car is red"), not when the old fact is about another person ("X has a brother" → "X has
  a brother in the army"), not when the word is a Korean fact's predicate (Korean is head-final:
  "영어를 잘한다" → "영어 선생님이다"); the word may be a possessive head that names a single-valued
  attribute ("X는 INFP다" → "X의 MBTI는 INFP이다");
- last, the one or two words left changed on each side (`changed_spans`) may be handed to a
  `Paraphrase` test — the packaged embedder's cosine of those words alone, against a high bar
  (conversation/facts.py `PairJudge.span_test`): "kids" / "children" mean the same, "married" /
  "engaged" do not.

A paraphrase none of this covers stays "distinct" (stored twice): that costs a line of prompt,
while a false duplicate would lose a fact and a false conflict would retire one. The lexicon
lists words, not pairs: it was written from what facts are about (home, work, likes, family …),
and checked on the dev half of the labeled pairs; the rules above are about the form of words
(part of speech, script, spelling), not about any word list, except two closed classes: words
for another person (family, partners, friends) and for wanting or planning.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from ...callbacks import cleared_on_erasure
from ...text.tokenize import get_tokenizer

__all__ = ["FactShape", "Alignment", "Paraphrase", "shape_of", "align", "judge_shapes", "romanize", "changed_spans"]

# Do two short spans of words mean the same? (the packaged embedder's cosine against a threshold:
# conversation/facts.py `PairJudge`). Asked only about what is left of the changed spans after the rules.
Paraphrase = Callable[[str, str], bool]

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
    "@play": ("플레이한다", "친다", "plays"),
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
    # Round two: general vocabulary of what people state about themselves (family, body, routine,
    # school and work, food and drink, languages), Korean and English, written from the topics
    # rather than from pairs; a word with two common senses is left out ("차" car / tea, "run").
    "@child": ("자녀", "아이가", "애", "kid", "kids", "child", "children"),
    "@sibling": ("형제", "남매", "sibling", "siblings"),
    "@parent": ("부모", "부모님", "parent", "parents"),
    "@wife": ("아내", "와이프", "부인", "wife"),
    "@husband": ("남편", "husband"),
    "@car": ("자동차", "차량", "car", "vehicle"),
    "@bike": ("자전거", "bike", "bicycle"),
    "@birthday": ("생일", "birthday"),
    "@height": ("키", "신장", "height", "tall"),
    "@weight": ("몸무게", "체중", "weight", "weighs"),
    "@sleep": ("잔다", "잠든다", "취침", "sleeps", "asleep"),
    "@wake": ("일어난다", "기상", "wakes"),
    "@alcohol": ("술", "음주", "alcohol", "booze"),
    "@smoke": ("담배", "흡연", "피운다", "smokes", "smoking", "cigarettes"),
    "@exercise": ("운동", "exercise", "exercises"),
    "@jog": ("조깅", "달리기", "러닝", "jogging", "jogs"),
    "@book": ("책", "도서", "book", "books"),
    "@travel": ("여행", "travel", "trip"),
    "@company": ("회사", "company", "firm"),
    "@commute": ("출근", "통근", "commute", "commutes"),
    "@hospital": ("병원", "hospital"),
    "@teacher": ("선생님", "교사", "teacher"),
    "@doctor": ("의사", "doctor", "physician"),
    "@developer": ("개발자", "프로그래머", "developer", "programmer"),
    "@morning": ("아침", "오전", "morning"),
    "@evening": ("저녁", "evening"),
    "@weekend": ("주말", "weekend", "weekends"),
    "@week": ("일주일", "week"),
    "@pet": ("반려동물", "애완동물", "pet", "pets"),
    "@apartment": ("아파트", "apartment"),
    "@graduate": ("졸업", "graduated", "graduate", "alumnus"),
    "@major": ("전공", "major", "majored"),
    "@student": ("학생", "student"),
    "@school": ("학교", "school"),
    "@meat": ("고기", "육류", "meat"),
    "@music": ("음악", "music"),
    "@song": ("노래", "song", "songs"),
    "@game": ("게임", "game", "games", "gaming"),
    "@midnight": ("자정", "midnight"),
    "@drink": ("마신다", "drinks"),
    "@eat": ("먹는다", "eats"),
    "@alone": ("혼자", "alone"),
    "@guitar": ("기타", "guitar"),
    "@coffee": ("커피", "coffee"),
    "@beer": ("맥주", "beer"),
    "@english": ("영어", "english"),
    "@japanese": ("일본어", "japanese"),
    "@chinese": ("중국어", "chinese"),
    "@korean": ("한국어", "korean"),
}
# Words that add nothing to what a fact states about its attribute (how often, how strongly,
# "its name is"): left out when deciding whether anything changed.
_LIGHT = frozenset({
    "주로", "보통", "평소", "현재", "전혀", "아예", "항상", "늘", "원래", "이름", "매주", "열리다", "음식", "받다",
    "usual", "typic", "current", "name", "call", "also", "alway", "languag", "main", "most", "hold", "realli",
    "year", "old", "@own", "시간", "time", "날짜", "date",
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

# Words naming another person: a fact that adds or drops one is about that person, not its subject.
# A closed class (family, partners, friends, colleagues), read through the tokenizer like the concepts.
_RELATION_WORDS = (
    "아내", "남편", "와이프", "여친", "남친", "여자친구", "남자친구", "애인", "엄마", "아빠", "어머니", "아버지",
    "부모", "형", "누나", "오빠", "언니", "동생", "남동생", "여동생", "아들", "딸", "자녀", "친구", "룸메이트",
    "동료", "상사", "사촌", "할머니", "할아버지", "삼촌", "이모", "고모",
    "wife", "husband", "partner", "girlfriend", "boyfriend", "mother", "father", "mom", "dad", "parent", "parents",
    "sister", "brother", "sibling", "son", "daughter", "child", "children", "kid", "kids", "friend", "roommate",
    "coworker", "colleague", "boss", "cousin", "uncle", "aunt", "grandmother", "grandfather", "grandma", "grandpa",
    "fiance", "fiancee",
)
# Wanting, planning, trying: "wants to buy a boat" is not "bought a boat".
# Hardly, rarely: near-negations, kept apart from "never" / "안" so that they stop a duplicate
# without making a conflict by themselves.
_MODAL = re.compile(r"(?:싶|예정|계획|려고|고자|언젠가|거의|\bwants?\b|\bwanted\b|\bwish|\bhope|\bplan(?:s|ning|ned)?\b"
                    r"|\bdream|\bgoing to\b|\bthinking of\b|\bconsider|\bwould like\b|\bwill\b|\bsomeday\b"
                    r"|\btr(?:y|ies|ying|ied)\b|\bhardly\b|\brarely\b|\bseldom\b|\bbarely\b)", re.IGNORECASE)
# Saying one thing against another ("tea instead of coffee", "커피보다 차"): the words of such a fact
# are not all asserted, so a shorter fact made of some of them is not its repetition.
_CONTRAST = re.compile(r"(?:대신|보다|말고|지만|제외|\binstead\b|\brather\b|\bthan\b|\bbut\b|\bexcept\b"
                       r"|\bunlike\b|\bover\b|\bprefer\w*\b[^.]*\bto\b)", re.IGNORECASE)
# How often: set aside like an adverb when one side only has it ("매일 아침" / "아침마다").
_FREQUENCY = frozenset({"every", "everi", "each", "매일", "매주", "매달", "매년", "매번", "daily", "weekly", "monthly",
                        "@daily"})
# Endings that make another word of the same stem (bass → bassist, fluent → fluently, left → lefty).
_DERIVATIONS = ("i", "y", "li", "ly", "ist", "er", "ed", "ing", "s", "es", "e")
_NOT_ADVERBS = frozenset({"family", "italy", "july", "reply", "supply", "jelly", "belly", "bully", "holy", "ugly",
                          "lonely", "friendly", "lovely", "elderly", "assembly", "butterfly"})
_IRREGULAR_PAST = frozenset({"lost", "broke", "left", "sold", "got", "became", "went", "began", "fell", "gave", "took",
                              "won", "met", "bought", "found", "made", "ran", "quit"})
_LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z'’]*")

_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "once": 1, "twice": 2, "하나": 1, "둘": 2, "셋": 3, "넷": 4, "한": 1, "두": 2, "세": 3,
    "네": 4, "다섯": 5, "여섯": 6, "일곱": 7, "여덟": 8, "아홉": 9, "열": 10, "열한": 11, "열두": 12, "스무": 20,
}
_KO_NATIVE = "열한|열두|하나|다섯|여섯|일곱|여덟|아홉|스무|둘|셋|넷|한|두|세|네|열"
_KO_UNITS = ("년생", "주년", "학년", "시간", "살", "세", "시", "분", "점", "명", "마리", "개", "번", "회", "년", "월",
             "일", "층", "교대", "센티", "센치", "킬로", "kg", "cm",
             "잔", "권", "대", "장", "켤레", "그릇", "곡", "벌", "채", "가지", "군데")
_UNIT_CANON = {"살": "age", "세": "age", "시": "time", "a.m.": "time", "p.m.": "time", "am": "time", "pm": "time",
               "o'clock": "time", "점": "score", "point": "score", "points": "score", "학년": "grade",
               "grade": "grade", "년생": "year", "년": "year", "times": "times", "time": "times", "번": "times",
               "회": "times", "센티": "cm", "센치": "cm", "centimeter": "cm", "centimeters": "cm", "킬로": "kg",
               "kilo": "kg", "kilos": "kg", "kilogram": "kg", "kilograms": "kg"}
# Units of measure written in Latin letters: set aside like Korean counters once read with their number.
_MEASURES = frozenset({"cm", "kg", "km", "mm", "ml", "lb", "lbs", "ft", "centimet", "kilogram", "kilo"})
_NUMBER = re.compile(
    rf"(?<![\w.])(?P<n>\d+(?:[.,]\d+)?|{'|'.join(w for w in _NUMBER_WORDS if w.isascii())}"
    rf"|(?:{_KO_NATIVE})(?=\s*(?:{'|'.join(_KO_UNITS)}))|(?:하나|둘|셋|넷)(?=\s|$|[.,!?]))"
    rf"\s*(?P<unit>{'|'.join(_KO_UNITS)}|(?:[A-Za-z][A-Za-z.']*)(?:\s+old)?)?",
    re.IGNORECASE)
_USED_TO = re.compile(r"\bused to\b", re.IGNORECASE)
_NEGATION = re.compile(
    r"(?:\bnot\b|n't\b|\bnever\b|\bno\b|\bunable\b|않|(?:^|\s)안\s|(?:^|\s)못|아니|없|줄\s*(?:모르|모른|몰))",
    re.IGNORECASE)
# Can / cannot: the grammar of ability, not a word of the fact ("할 줄 안다" = "할 수 있다" = "can",
# "탈 줄 모른다" = "못 탄다" = "can't"). The verbs it is built with ("알다" / "모르다", "know how
# to", "able") are set aside, and a fact that states an ability is not repeated by one that states
# a habit ("can drive" / "drives to work").
_ABLE = re.compile(r"(?:줄\s*(?:알|안|아|모르|모른|몰)|(?:^|\s)수\s*(?:있|없)|(?:^|\s)못\s|\bcan\b|\bcannot\b"
                   r"|\bcan't\b|\bcould\b|\b(?:un)?able to\b|\bknows? how to\b)", re.IGNORECASE)
_ABLE_WORDS = re.compile(r"줄\s*(?:알|안|아|모르|모른|몰)|\bknows? how\b|\b(?:un)?able\b", re.IGNORECASE)
# "X의 여동생은", "X's dog": the new fact's subject is what follows the possessive, not X.
_POSSESSED = re.compile(r"^\s*<user:\d+>\s*(?:의|'s|’s)\s*([^\s.,!?]+)")


@dataclass(frozen=True, slots=True)
class FactShape:
    """What the judge reads from one fact."""

    subject: str | None  # the user a fact is about (the reference it starts with), or None
    concepts: tuple[str, ...]  # content tokens folded onto concepts, in order; numbers left out
    single: frozenset[str]  # concepts this side names with a single-valued attribute word
    numbers: frozenset[tuple[float, str]]  # (value, unit); unit "" when none was read
    negated: bool
    markers: frozenset[str]  # change-of-state words
    adverbs: frozenset[str] = frozenset()  # concepts read as adverbs or "how often" words
    relations: frozenset[str] = frozenset()  # concepts naming another person (wife, 형, friend)
    names: frozenset[str] = frozenset()  # concepts written as names (capitalised mid-sentence, NNP, SH)
    verbs: frozenset[str] = frozenset()  # concepts read as verbs: kiwi's VV / VA, an English past tense
    modal: bool = False  # wants / plans / tries / 싶다 / 예정 / rarely: not (yet, or hardly) so
    contrast: bool = False  # "instead of", "rather than", "보다", "대신": not every word is asserted
    able: bool = False  # states an ability: "can", "할 줄 안다", "할 수 있다", "못 한다"
    possessed: str | None = None  # the concept after the subject's possessive ("X의 여동생은", "X's dog")
    head: str | None = None  # a Korean fact's last content concept: its predicate ("선생님이다", "키운다")
    surface: tuple[tuple[str, str], ...] = ()  # (concept, the word it was read from) for Latin words
    acronyms: tuple[tuple[str, str], ...] = ()  # (concept, its capitals): "NYC" → "nyc"
    tail: tuple[str, ...] = ()  # an English fact's last two words, lower-cased ("chess news"): `_new_head`

    def content(self) -> tuple[str, ...]:
        """The concepts that must agree for a duplicate (light words and change words left out)."""
        return tuple(c for c in self.concepts if c not in _LIGHT and c not in _MARKERS)

    def word(self, concept: str) -> str:
        """The word a concept was read from (its stem when none was recorded)."""
        return dict(self.surface).get(concept, concept)


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


@cache
def _relation_tokens() -> frozenset[str]:
    """The relation words as concepts ("girlfriend" is folded with "여친" onto "@girlfriend")."""
    tokenizer, concept_of = get_tokenizer(), _concept_of()
    found = set()
    for word in _RELATION_WORDS:
        tokens = tokenizer.tokens(word)
        if len(tokens) == 1:
            found.add(concept_of.get(tokens[0], tokens[0]))
    return frozenset(found)


@cache
def _ability_tokens() -> frozenset[str]:
    """The tokens the grammar of ability is written with ("알다", "모르다", "know", "able")."""
    tokenizer = get_tokenizer()
    return frozenset(t for word in ("알다", "모르다", "안다", "know", "knows", "able", "unable")
                     for t in tokenizer.tokens(word))


def _is_number_token(token: str) -> bool:
    return token.replace(".", "").replace(",", "").isdigit() or token in _NUMBER_WORDS


def _unit(raw: str | None, value: str) -> str:
    if not raw:
        return "year" if len(value) == 4 and value.isdigit() else ""
    unit = raw.lower()
    if unit.endswith(".") and unit not in _UNIT_CANON:  # "180 centimeters." — the sentence's full stop
        unit = unit.rstrip(".")
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
    if leading and _HANGUL.search(text):
        # kiwi reads "<user:1>는 개발자예요" as "개발" but "그는 개발자예요" as "개발자", and a bare "는"
        # as the verb "늘다": the subject is read as a pronoun, which gives no token of its own.
        tokens = _tokens_with_pronoun(text)
        plain = "그" + plain.lstrip()
    concept_of = _concept_of()
    numbers = _numbers(plain)
    counters = {m.group("unit") for m in _NUMBER.finditer(plain) if m.group("unit") and _HANGUL.search(m.group("unit"))}
    counters |= {t for t in tokens if t in _MEASURES} if any(u in _MEASURES
                                                               for _, u in numbers) else set()
    able = bool(_ABLE.search(plain))
    ability_words = _ability_tokens() if _ABLE_WORDS.search(plain) else frozenset()
    concepts: list[str] = []
    single: set[str] = set()
    for token in tokens:
        if (token == "user" or token == subject or (_is_number_token(token) and token not in values)
                or token in counters or token in ability_words):
            continue
        concept = f"<user:{token}>" if token in values else concept_of.get(token, token)
        concepts.append(concept)
        if token in _SINGLE:
            single.add(concept)
    for unit in sorted({u for _, u in numbers} & set(_UNIT_CONCEPTS)):
        concepts.append(_UNIT_CONCEPTS[unit])  # "24살" says "age" as much as "나이" does
    if "년생" in plain:
        concepts.append("@born")
    negated = bool(_NEGATION.search(plain))
    if negated and "@like" in concepts:  # "doesn't like", "isn't a fan of" → dislikes
        concepts = ["@dislike" if c == "@like" else c for c in concepts]
        negated = False
    markers = frozenset({c for c in concepts if c in _MARKERS} | ({"used to"} if _USED_TO.search(plain) else set()))
    adverbs, names, verbs, latin = _word_roles(plain)
    surface = dict(latin)
    for token in tokens:  # a concept's own word, for embedding a changed span ("@like" was "좋아하다")
        if concept_of.get(token, token) != token:
            surface.setdefault(concept_of[token], token)
    relations = frozenset(c for c in concepts if c in _relation_tokens())
    possessed = _POSSESSED.match(text)
    possessed_tokens = get_tokenizer().tokens(possessed.group(1)) if possessed else []
    return FactShape(subject, tuple(concepts), frozenset(single), numbers, negated, markers,
                     adverbs=frozenset(adverbs - _MARKERS), relations=relations, names=frozenset(names),
                     verbs=frozenset(verbs), modal=bool(_MODAL.search(plain)), contrast=bool(_CONTRAST.search(plain)),
                     surface=tuple(surface.items()), able=able, acronyms=_acronyms(plain),
                     possessed=concept_of.get(possessed_tokens[0], possessed_tokens[0]) if possessed_tokens else None,
                     head=concepts[-1] if concepts and _HANGUL.search(plain) else None,
                     tail=() if _HANGUL.search(plain) else tuple(w.lower() for w in _LATIN_WORD.findall(plain)[-2:]))


@cleared_on_erasure
@lru_cache(maxsize=4096)
def _tokens_with_pronoun(text: str) -> tuple[str, ...]:
    """The tokens of a Korean fact with its subject read as "그" (cached like `_word_roles`)."""
    return tuple(get_tokenizer().tokens(_LEADING_REF.sub("그", text, count=1)))


@cleared_on_erasure
@lru_cache(maxsize=4096)
def _word_roles(plain: str) -> tuple[frozenset[str], frozenset[str], frozenset[str], tuple[tuple[str, str], ...]]:
    """(adverbs, names, verbs, Latin surface words) of a fact, by concept. Adverbs: kiwi's MAG,
    an English word ending in "-ly", a "how often" word. Names: kiwi's NNP / SH, a capitalised
    Latin word. Verbs: kiwi's VV / VA, an English past tense ("-ed", a few irregular ones).
    Surface: the word a Latin stem was read from ("bassist" for "bassist"). Cached: a subject's
    current facts are read again on every new fact about it."""
    tokenizer, concept_of = get_tokenizer(), _concept_of()
    adverbs: set[str] = set()
    names: set[str] = set()
    verbs: set[str] = set()
    for token, tag in tokenizer.tagged(plain):
        concept = concept_of.get(token, token)
        if tag == "MAG" or concept in _FREQUENCY:
            adverbs.add(concept)
        elif tag in ("NNP", "SH"):
            names.add(concept)
        elif tag.startswith(("VV", "VA")):
            verbs.add(concept)
    surface: dict[str, str] = {}
    for match in _LATIN_WORD.finditer(plain):
        word = match.group(0)
        stems = tokenizer.tokens(word)
        if len(stems) != 1:
            continue
        concept = concept_of.get(stems[0], stems[0])
        surface.setdefault(concept, word.lower())
        if word[0].isupper():
            names.add(concept)
        elif len(word) >= 5 and word.lower().endswith("ly") and word.lower() not in _NOT_ADVERBS:
            adverbs.add(concept)
        if word.lower().endswith("ed") or word.lower() in _IRREGULAR_PAST:
            verbs.add(concept)
    return frozenset(adverbs), frozenset(names), frozenset(verbs), tuple(surface.items())


@cleared_on_erasure
@lru_cache(maxsize=4096)
def _acronyms(plain: str) -> tuple[tuple[str, str], ...]:
    """Latin words written with three to six capitals ("NYC", "GTA", "MIT"), by concept, with their
    capitals: an acronym stands for the words its capitals begin ("New York City", "Massachusetts
    Institute of Technology" — small words like "of" have no capital). Two capitals are too often
    ambiguous to read alone ("CS": computer science or cognitive science)."""
    tokenizer, concept_of = get_tokenizer(), _concept_of()
    found = []
    for match in _LATIN_WORD.finditer(plain):
        word = match.group(0)
        capitals = "".join(ch for ch in word if ch.isupper()).lower()
        stems = tokenizer.tokens(word)
        if 3 <= len(capitals) <= 6 and len(word) <= 6 and len(stems) == 1:
            found.append((concept_of.get(stems[0], stems[0]), capitals))
    return tuple(found)


def _spelled_out(short: FactShape, short_rest: list[str], long: FactShape, long_rest: list[str]) -> bool:
    """Pair off an acronym on one side with the run of words on the other that its capitals begin,
    in order ("NYC" / "New York City", "GTA" / "Grand Theft Auto"); both are removed from the rests."""
    for concept, capitals in short.acronyms:
        if concept not in short_rest:
            continue
        width = len(capitals)
        for start in range(len(long_rest) - width + 1):
            run = long_rest[start:start + width]
            if all(not t.startswith("<") for t in run) and "".join(long.word(t).lstrip("@")[:1] for t in run) \
                    == capitals:
                short_rest.remove(concept)
                del long_rest[start:start + width]
                return True
    return False


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


def romanize(hangul: str) -> str:
    """Revised Romanization of a Hangul word, syllable by syllable ("부산" → "busan", "나비" →
    "nabi"): enough to see that a name was written in the other script, not a full transcriber."""
    out = []
    for ch in hangul:
        code = ord(ch) - 0xAC00
        if not 0 <= code < 11172:
            out.append(ch.lower())
            continue
        out.append(_CHO[code // 588] + _JUNG[(code % 588) // 28] + _JONG[code % 28])
    return "".join(out)


_CHO = ("g", "kk", "n", "d", "tt", "r", "m", "b", "pp", "s", "ss", "", "j", "jj", "ch", "k", "t", "p", "h")
_JUNG = ("a", "ae", "ya", "yae", "eo", "e", "yeo", "ye", "o", "wa", "wae", "oe", "yo", "u", "wo", "we", "wi", "yu",
         "eu", "ui", "i")
_JONG = ("", "k", "k", "k", "n", "n", "n", "t", "l", "k", "m", "p", "l", "l", "p", "l", "m", "p", "p", "t", "t", "ng",
         "t", "t", "k", "t", "p", "t")
# Spellings of one sound in romanised names (Busan / Pusan, Chicago / 시카고 → "sikago").
_SOUNDS = (("eo", "o"), ("eu", "u"), ("oo", "u"), ("ee", "i"), ("ae", "e"), ("ch", "j"), ("sh", "s"), ("ph", "p"),
           ("g", "k"), ("c", "k"), ("q", "k"), ("b", "p"), ("d", "t"), ("r", "l"), ("v", "p"), ("f", "p"), ("z", "j"))


def _sound(word: str) -> str:
    word = re.sub(r"[^a-z]", "", word.lower())
    for spelling, sound in _SOUNDS:
        word = word.replace(spelling, sound)
    return re.sub(r"(.)\1+", r"\1", word)


def _edits_at_most_one(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _romanised(hangul: str, latin: str) -> bool:
    """Is `latin` the Hangul word written in Latin letters ("나비" / "Nabi", "시카고" / "Chicago")?"""
    a, b = _sound(romanize(hangul)), _sound(latin)
    return len(a) >= 3 and len(b) >= 3 and (a == b or (min(len(a), len(b)) >= 5 and _edits_at_most_one(a, b)))


def _derived(a: str, b: str) -> bool:
    """One English word made from the other by an ending ("bass" / "bassist", "fluent" / "fluently")."""
    short, long = sorted((a, b), key=len)
    return len(short) >= 4 and long.startswith(short) and long[len(short):] in _DERIVATIONS


def _abbreviated(a: str, b: str) -> bool:
    """A Korean abbreviation made of its word's syllables in order, skipping some ("배그" /
    "배틀그라운드", "마크" / "마인크래프트"); a plain prefix ("서울" / "서울대") is another word."""
    short, long = sorted((a, b), key=len)
    if not (2 <= len(short) <= 3 and len(long) >= len(short) + 2 and short[0] == long[0]
            and all(_HANGUL.match(ch) for ch in short + long)) or long.startswith(short):
        return False
    position = 0
    for ch in short[1:]:
        position = long.find(ch, position + 1)
        if position < 0:
            return False
    return True


def _same_word(old: FactShape, a: str, new: FactShape, b: str) -> str | None:
    """Why token `a` of the older fact and `b` of the newer are one word in another form, or None."""
    if a.startswith(("@", "<")) or b.startswith(("@", "<")):
        return None
    wa, wb = old.word(a), new.word(b)
    korean_a, korean_b = bool(_HANGUL.search(a)), bool(_HANGUL.search(b))
    if korean_a != korean_b:
        return "romanised" if _romanised(a if korean_a else b, wb if korean_a else wa) else None
    if korean_a:
        return "abbreviated" if _abbreviated(a, b) else None
    return "derived" if _derived(a, b) or _derived(wa, wb) else None


_WHY = {"romanised": "a romanised name", "derived": "a derived word", "abbreviated": "an abbreviation"}


def _residue(old: FactShape, new: FactShape, content: Alignment) -> tuple[list[str], list[str], list[str]]:
    """The changed spans less what is not a change: adverbs one side only has, tokens paired
    off as one word in another form, words split or joined by spacing. (old rest, new rest,
    why each part was set aside)."""
    old_rest, new_rest = list(content.old_changed), list(content.new_changed)
    why: list[str] = []
    for a in list(old_rest):
        for b in new_rest:
            reason = _same_word(old, a, new, b)
            if reason:
                old_rest.remove(a)
                new_rest.remove(b)
                why.append(_WHY[reason])
                break
    if _spelled_out(old, old_rest, new, new_rest) or _spelled_out(new, new_rest, old, old_rest):
        why.append("an acronym")
    old_adverbs = [t for t in old_rest if t in old.adverbs]
    new_adverbs = [t for t in new_rest if t in new.adverbs]
    if old_adverbs and not new_adverbs:
        old_rest = [t for t in old_rest if t not in old.adverbs]
        why.append("an adverb")
    elif new_adverbs and not old_adverbs:
        new_rest = [t for t in new_rest if t not in new.adverbs]
        why.append("an adverb")
    for one, other in ((old_rest, new_rest), (new_rest, old_rest)):
        for width in (2, 3):
            for i in range(len(one) - width + 1):
                joined = "".join(one[i:i + width])
                if joined in other and all(not t.startswith(("@", "<")) for t in one[i:i + width]):
                    del one[i:i + width]
                    other.remove(joined)
                    why.append("spacing")
                    break
    return old_rest, new_rest, why


# Relations an added word may state without making a new fact ("a nurse" → "works as a nurse",
# "has a dog named Bori" → "강아지 보리를 키운다").
_ADDABLE_PREDICATES = frozenset({"@job", "@reside", "@play", "@speak", "@daily", "@raise"})


def _plain_word(shape: FactShape, token: str) -> bool:
    """A common word: not a name, a user, another person, a verb or change word ("헤어졌다",
    "lost"), or a relation that states something new ("likes", "owns", "learns"); "works"
    and "lives" only say what the other words already did ("a nurse" → "works as a nurse")."""
    if token in _ADDABLE_PREDICATES:
        return True
    return not (token in shape.names or token in shape.relations or token.startswith("<") or token in shape.verbs
                or token in _PREDICATES or token in _MARKERS)


def _without_stated_predicate(old_rest: list[str], new_rest: list[str]) -> tuple[list[str], list[str]]:
    """"works as a nurse" says what "is a nurse" says: "works" / "일한다" on one side only is set
    aside, unless the other side has a predicate of its own ("lives in Seoul" / "works in Seoul"
    differ). Only this one: "plays" or "speaks" say more ("has a guitar" / "plays guitar")."""
    if any(t in _PREDICATES for t in old_rest) and any(t in _PREDICATES for t in new_rest):
        return old_rest, new_rest
    return [t for t in old_rest if t != "@job"], [t for t in new_rest if t != "@job"]


def _names_the_attribute(new: FactShape, added: str) -> bool:
    """"X is INFP" → "X's MBTI is INFP", "X는 부산에 산다" → "X의 거주지는 부산이다": the one word
    added is the possessive head, and it names a single-valued attribute (`_SINGLE`: 이름, 나이,
    직업, MBTI …), not a new subject ("X's team", "X의 여동생")."""
    return added == new.possessed and added in new.single and added not in new.relations


def _about_another(old: FactShape, new: FactShape, content: Alignment, added: str) -> bool:
    """Is a word the new fact adds about someone or something the old fact only mentions? "X는
    여동생이 있다" → "X의 여동생은 고등학생이다", "X has a car" → "X's car is red": the new fact's
    subject is what follows the possessive; a Korean fact whose predicate is the added word
    ("영어를 잘한다" → "영어 선생님이다": "잘하다" is not a token) says something else of it;
    and a word added to a fact about another person
    ("X has a brother" → "X has a brother in the army") most likely describes that person."""
    if new.possessed is not None and new.possessed != old.possessed and new.possessed in old.concepts:
        return True  # the possessed, which the old fact only mentioned, is the new fact's subject
    if old.head is not None and new.head == added and added not in _ADDABLE_PREDICATES:
        return True  # Korean is head-final: a word added as the predicate says what the subject is or does
    return any(t in old.relations for t in content.shared)


_NEGATING_PREFIXES = ("un", "non", "dis", "in", "im", "ir", "il", "비", "불", "무", "미")


def _new_head(old: FactShape, new: FactShape, added: str) -> bool:
    """An English fact that ends one word later, in a noun after the older fact's last word: "X
    streams chess" → "X streams chess news", "owns a house" → "owns a house boat". In English the
    last noun of a compound is what it is (news about chess, a kind of boat), so the word added
    names another thing, not more of the same one. A word after a preposition ("a nurse" → "a nurse
    at a hospital") or before the old word ("dogs" → "hot dogs") is not this."""
    return (len(old.tail) >= 1 and len(new.tail) == 2 and new.tail[0] == old.tail[-1]
            and new.tail[1] == new.word(added) and added not in new.adverbs)


def _contrasting(a: str, b: str) -> bool:
    """Two words of one form that usually say opposite or sibling things: one is the other with
    a negating prefix ("smoker" / "nonsmoker", "공개" / "비공개"), or they differ in one letter
    or syllable only ("내향적" / "외향적", "남동생" / "여동생", "3월" / "4월")."""
    short, long = sorted((a, b), key=len)
    if any(long == prefix + short for prefix in _NEGATING_PREFIXES):
        return True
    return len(a) == len(b) and len(a) >= 2 and sum(x != y for x, y in zip(a, b)) == 1


def changed_spans(old: FactShape, new: FactShape) -> tuple[str, str] | None:
    """The words left changed on each side once the rules have set aside what is no change, as
    short texts for the embedder ("kids" / "children"), or None when what is left is not a
    pair of short spans that could mean the same: an empty side, more than two words a side,
    a name, a user, another person on one side only, or two words of one form that contrast."""
    if old.subject != new.subject:
        return None
    content = align(old.content(), new.content())
    old_rest, new_rest, _ = _residue(old, new, content)
    if not (1 <= len(old_rest) <= 2 and 1 <= len(new_rest) <= 2):
        return None
    for shape, rest in ((old, old_rest), (new, new_rest)):
        if any(t.startswith("<") or t in shape.names for t in rest):
            return None
    if any(t in old.relations for t in old_rest) != any(t in new.relations for t in new_rest):
        return None  # a person on one side only: a fact about them ("kids" / "children" is one)
    words_old = [old.word(t).lstrip("@") for t in old_rest]
    words_new = [new.word(t).lstrip("@") for t in new_rest]
    if any(_contrasting(a, b) for a in words_old for b in words_new):
        return None
    return " ".join(words_old), " ".join(words_new)


def judge_shapes(old: FactShape, new: FactShape, paraphrase: Paraphrase | None = None) -> tuple[str, str]:
    """(duplicate | conflict | distinct, the reason in a few words). `paraphrase`, when given,
    is asked whether the words left changed mean the same (`changed_spans`); it is asked only
    once numbers, negation, change words and modality agree and no rule has decided."""
    if old.subject != new.subject:
        return "distinct", "about someone else"
    content = align(old.content(), new.content())
    values_equal = _values(old.numbers) == _values(new.numbers)
    same_terms = values_equal and old.negated == new.negated and old.markers == new.markers and old.modal == new.modal
    unchanged = not content.old_changed and not content.new_changed
    if unchanged and same_terms:
        return "duplicate", "nothing changed"
    if unchanged:
        if _number_changed(old, new):
            return "conflict", "a number of the same unit changed"
        if values_equal and old.negated != new.negated:
            return "conflict", "negated"
        if values_equal and old.markers != new.markers:
            return "conflict", "a change of state"
    old_rest, new_rest, why = _residue(old, new, content)
    if same_terms and not old_rest and not new_rest:
        return "duplicate", f"the same once {', '.join(why)} is set aside"
    slot = (len(content.old_spans) == 1 and len(content.new_spans) == 1
            and len(content.old_changed) == len(content.new_changed) <= 2)
    slot_conflict = slot and values_equal and old.negated == new.negated and not _translated(content)
    if slot_conflict and _same_kind_of_value(content.old_changed, content.new_changed):
        return "conflict", "the opposite value"
    anchored = any(c not in _LIGHT and c not in _PREDICATES and c not in old.adverbs for c in content.shared)
    if same_terms and (anchored or old.numbers) and paraphrase is not None:  # "three kids" / "3 children"
        spans = changed_spans(old, new)
        if spans is not None and paraphrase(*spans):
            return "duplicate", f"the changed words mean the same ({spans[0]} / {spans[1]})"
    if slot_conflict and _shared_single(old, new):
        return "conflict", "a single-valued attribute got another value"
    if new.markers - old.markers and anchored and len(content.old_changed) <= 2 and not old.negated:
        return "conflict", "a change of state"
    loose = same_terms and old.able == new.able and not old.contrast and not new.contrast
    if loose and (anchored or any(w != "an adverb" for w in why)):
        old_rest, new_rest = _without_stated_predicate(old_rest, new_rest)
        if not new_rest and not any(t in old.relations for t in old_rest):
            return "duplicate", "the new fact says less than the old one"
        if not old_rest and len(new_rest) == 1 and _names_the_attribute(new, new_rest[0]):
            return "duplicate", f"the attribute named ({new.word(new_rest[0])})"
        if (not old_rest and len(new_rest) == 1 and _plain_word(new, new_rest[0])
                and not _about_another(old, new, content, new_rest[0]) and not _new_head(old, new, new_rest[0])):
            return "duplicate", f"one common word added ({new.word(new_rest[0])})"
    return "distinct", "another attribute, or more than one slot changed"

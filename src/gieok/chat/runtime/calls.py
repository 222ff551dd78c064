"""Explicit-call detection: did this message call the bot?

A message calls the bot when it mentions the bot's user id, replies to one of the bot's
messages, or uses one of the configured call names the way people address or talk about
someone. A plain substring test would wake the bot for "세상을 누리다", "누리꾼" and "nurish".
Korean has no space between a noun and its particle, so "whole word" means different things per
script:

- A name ending in a Hangul syllable counts with a particle or ending after it (누리야, 누리가,
  누리는, 누리한테, 누리도요 …, chosen by whether the name ends in a 받침: 하늘아, 하늘이,
  하늘은, 하늘이가), or bare where people put a vocative: at the start ("누리 이거 해줘"), after
  "@", before , ! ? ~ …, at the end ("고마워 누리"), after a greeting ("안녕 누리"). Anything
  else glued to it makes another word (누리다, 누리꾼, 누리집, 누리고) and does not count.
- Any other name (Latin "Nuri") counts as a whole word anywhere ("Nuri,", "hey nuri",
  "is nuri online?"), or with a Korean particle glued on ("Nuri야"); "nurish", "Nurie" do not.

Talking about the bot in the third person ("누리는 어떻게 생각해?", "does Nuri know?") is a
call: people expect an answer when they bring the bot up in front of it. Text the
speaker did not say as their own is not: quotations ("'누리'는 무슨 뜻이야?"), block quotes,
code and URLs, emoji names and channel names are ignored. "누리는" is also the adnominal of the
verb 누리다 ("자유를 누리는 삶"); it does not count after an object (을/를) or before a bound noun
(것, 중, 사람 …).

Matching runs on NFKC-normalised, case-folded text with format characters (zero-width spaces,
joiners, bidi controls) removed, so "ｎｕｒｉ", "NURI" and "누\u200b리야" are found; the reported
span is in the original text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ...errors import InvalidInputError, InvalidTypeError

__all__ = ["CallDetector", "CallMatch", "CallHow", "has_batchim", "fold_for_matching", "particle_variant"]

CallHow = Literal["mention", "reply", "name"]

_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
# A "word" character for boundaries: letters and digits of any script, except lone Hangul jamo,
# which people type as laughter or emotion (ㅋㅋ, ㅎㅎ, ㅠㅠ) right after a name. NFKC turns those
# compatibility jamo into conjoining jamo, so both blocks are excluded.
_WORD = r"[^\W\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"
_NOT_BEFORE = rf"(?<!{_WORD})(?<![#])"  # "#누리" is a channel or tag name, not a call
_NOT_AFTER = rf"(?!{_WORD})"
_USER_MENTION = re.compile(r"<@!?(\d{1,25})>")


def has_batchim(word: str) -> bool | None:
    """Whether `word` ends in a Hangul syllable with a final consonant (받침).

    Korean particles come in pairs chosen by that: 이/가, 은/는, 을/를, 아/야, 과/와. None when
    the word does not end in a Hangul syllable ("Nuri", "R2"): both variants are then possible."""
    if not word:
        return None
    code = ord(word[-1])
    if not _HANGUL_FIRST <= code <= _HANGUL_LAST:
        return None
    return (code - _HANGUL_FIRST) % 28 != 0


def _ends_in_rieul(word: str) -> bool:
    """으로/로 treats a final ㄹ like a vowel (하늘로, not 하늘으로)."""
    code = ord(word[-1]) if word else 0
    return _HANGUL_FIRST <= code <= _HANGUL_LAST and (code - _HANGUL_FIRST) % 28 == 8


_PAIRED = {  # particle after a final consonant -> after a vowel
    "이": "가", "은": "는", "을": "를", "아": "야", "과": "와", "이랑": "랑", "이나": "나", "이여": "여",
    "으로": "로", "으로서": "로서", "으로써": "로써", "이라고": "라고", "이라는": "라는", "이라서": "라서",
    "이라면": "라면", "이란": "란", "이에요": "예요", "이야": "야", "이다": "다", "이지만": "지만",
}
_PAIRED_BACK = {v: k for k, v in _PAIRED.items()}


def particle_variant(particle: str, word: str) -> str:
    """The form of a paired particle that fits after `word` (이/가, 은/는 …; 으로 after ㄹ is 로).

    Unpaired particles (도, 한테, 에게 …) and words not ending in Hangul come back unchanged."""
    batchim = has_batchim(word)
    if batchim is None:
        return particle
    consonant_form = particle if particle in _PAIRED else _PAIRED_BACK.get(particle)
    if consonant_form is None:
        return particle
    if consonant_form.startswith("으로") and _ends_in_rieul(word):
        return _PAIRED[consonant_form]
    return consonant_form if batchim else _PAIRED[consonant_form]


# -- normalisation with a map back to the original text ----------------------------------------------

def _joins_previous(ch: str) -> bool:
    """Characters that belong to the character before them: combining marks, Hangul medial and
    final jamo (so ᄂ+ᅮ composes under NFKC), and format characters we strip."""
    code = ord(ch)
    return (unicodedata.combining(ch) != 0 or 0x1160 <= code <= 0x11FF or 0xD7B0 <= code <= 0xD7FF
            or unicodedata.category(ch) == "Cf" or 0xFE00 <= code <= 0xFE0F)


def _fold(piece: str) -> str:
    folded = unicodedata.normalize("NFKC", piece).casefold()
    folded = "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", folded)


def fold_for_matching(text: str) -> str:
    """NFKC, case folding and no format characters: the form names are compared in."""
    return _fold(text)


def _fold_with_map(text: str) -> tuple[str, list[int], list[int]]:
    """Fold cluster by cluster, remembering for each folded character the original cluster,
    so a match in the folded text can be reported as a span of the original."""
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and _joins_previous(text[j]):
            j += 1
        folded = _fold(text[i:j])
        out.append(folded)
        starts.extend([i] * len(folded))
        ends.extend([j] * len(folded))
        i = j
    return "".join(out), starts, ends


# Text the speaker is not saying as their own words, or that is not prose: masked (replaced by
# spaces of the same length) before names are looked for.
_MASKS = [re.compile(p, f) for p, f in (
    (r"```.*?(?:```|\Z)", re.S),                    # code blocks
    (r"`[^`\n]+`", 0),                              # inline code
    (r"<?https?://[^\s>]+>?", 0),                   # links
    (r"\bwww\.[^\s>]+", 0),
    (r"<(?:@[!&]?|#|a?:[\w~]+:|t:)[^>\s]*>", 0),    # Discord mentions, channels, emoji, timestamps
    (r":[\w+~-]+:", 0),                             # emoji short codes (:nuri_happy:)
    (r"(?m)^>>> .*", re.S),                         # block quote to the end of the message
    (r"(?m)^> .*$", 0),                             # quoted line
    (r'"[^"\n]*"', 0), (r"“[^”\n]*”", 0), (r"‘[^’\n]*’", 0), (r"«[^»\n]*»", 0),
    (r"「[^」\n]*」", 0), (r"『[^』\n]*』", 0),
    (r"(?<!\w)'[^'\n]{1,80}'(?![a-z0-9])", 0),      # 'quoted', but not don't / Nuri's
)]


def _mask(folded: str) -> str:
    chars = list(folded)
    for pattern in _MASKS:
        for m in pattern.finditer(folded):
            chars[m.start():m.end()] = " " * (m.end() - m.start())
    return "".join(chars)


# -- name patterns ----------------------------------------------------------------------------------

_ANY_PARTICLES = ("도", "만", "의", "한테", "한테서", "에게", "에게서", "께", "께서", "하고", "보고", "더러",
                  "처럼", "까지", "부터", "밖에", "조차", "마저", "이랑", "이나", "으로", "로")
_CONSONANT_PARTICLES = ("이", "은", "을", "과", "이랑", "이나", "으로")
_VOWEL_PARTICLES = ("가", "는", "를", "와", "랑", "나", "로")
_HONORIFICS = ("님", "씨", "쨩", "짱")  # 누리님아, 누리씨는 …
_GREETINGS = ("안녕", "안녕하세요", "야", "어이", "저기", "저기요", "헤이", "하이", "굿모닝", "잘자", "고마워",
              "hey", "hi", "hello", "yo", "oi", "dear", "thanks", "thank you", "thx", "ok", "okay", "morning")
_BOUND_NOUNS = ("것", "거", "걸", "건", "게", "중", "법", "듯", "듯이", "척", "데", "만큼", "대로", "동안", "사람",
                "사람들", "삶", "자", "방법", "일", "기쁨", "행복", "권리", "혜택", "자유")


def _alternation(options: Sequence[str]) -> str:
    return "|".join(re.escape(o) for o in sorted(set(options), key=len, reverse=True))


def _particles_after(core: str) -> tuple[str, str]:
    """(vocative forms, other particles) that may follow `core`, by its final consonant."""
    batchim = has_batchim(core)
    vocative = {True: ["아"], False: ["야"], None: ["아", "야"]}[batchim]
    other = list(_ANY_PARTICLES)
    if batchim in (True, None):
        other += _CONSONANT_PARTICLES
    if batchim in (False, None):
        other += _VOWEL_PARTICLES
    if batchim is False:
        other = [p for p in other if p not in ("이랑", "이나", "으로")]  # 누리랑, not 누리이랑
    elif batchim is True and _ends_in_rieul(core):
        other = [p for p in other if p != "으로"]  # 하늘로
    elif batchim is True:
        other = [p for p in other if p != "로"]
    return _alternation(vocative), _alternation(other)


def _cores(name: str) -> list[str]:
    """The name and its friendly forms: 하늘 -> 하늘이 (하늘이가, 하늘이는), 누리 -> 누리님, 누리씨."""
    cores = [name]
    if has_batchim(name):
        cores.append(name + "이")
    cores += [name + h for h in _HONORIFICS]
    return cores


def _with_particle(core: str) -> str:
    vocative, other = _particles_after(core)
    # A vocative may be drawn out (누리야아아); other particles may take a polite 요 (누리는요?).
    return rf"(?:{vocative})[아야]*|(?:{other})요?"


@dataclass(frozen=True)
class _NamePattern:
    name: str  # as configured
    hangul: bool
    with_particle: re.Pattern[str]
    bare: re.Pattern[str]


def _compile_name(name: str, folded: str) -> _NamePattern:
    body = r"\s+".join(re.escape(part) for part in folded.split())
    hangul = has_batchim(folded) is not None
    alternatives: list[str] = []
    for core in _cores(folded):
        core_body = body + re.escape(core[len(folded):])
        alternatives.append(rf"{core_body}(?P<p{len(alternatives)}>{_with_particle(core)})")
    with_particle = re.compile(rf"{_NOT_BEFORE}(?:{'|'.join(alternatives)}){_NOT_AFTER}")
    if hangul:
        friendly = _alternation([core[len(folded):] for core in _cores(folded)[1:]])
        bare = re.compile(rf"{_NOT_BEFORE}{body}(?:{friendly})?{_NOT_AFTER}")
    else:  # a whole word anywhere, but not a domain or file name (nuri.kr, nuri.png)
        bare = re.compile(rf"{_NOT_BEFORE}{body}{_NOT_AFTER}(?!\.[a-z0-9])")
    return _NamePattern(name, hangul, with_particle, bare)


_GREETING_BEFORE = re.compile(rf"(?:^|[^\w])(?:{_alternation(_GREETINGS)})[\s,!~.]*@?$")
_BOUND_NOUN_AFTER = re.compile(
    rf"\s+(?:{_alternation(_BOUND_NOUNS)})(?:[이을은도만의가는를]|이다|이야|이지|이에요|예요|야|지|다)?{_NOT_AFTER}")
_OBJECT_BEFORE = re.compile(r"[을를]\s+$")


def _bare_is_vocative(masked: str, start: int, end: int) -> bool:
    """A bare Korean name without a particle counts only where people put a vocative."""
    before, after = masked[:start], masked[end:]
    if not re.search(_WORD, before):  # at the start of the message (ㅋㅋ, @, emoji before are fine)
        return True
    if before.endswith("@") or _GREETING_BEFORE.search(before):
        return True
    if re.match(r"\s*(?:[,!?~…:;]|\.\.)", after):
        return True
    return not re.search(_WORD, after)  # at the end: "고마워 누리 ㅎㅎ"


def _is_verb_form(masked: str, start: int, end: int, particle: str) -> bool:
    """"누리는" after an object or before a bound noun is the verb 누리다 ("자유를 누리는 삶")."""
    if particle != "는":
        return False
    return bool(_OBJECT_BEFORE.search(masked[:start]) or _BOUND_NOUN_AFTER.match(masked[end:]))


@dataclass(frozen=True)
class CallMatch:
    """How a message called the bot. `span` is in the original text (None for a reply, or a
    mention known only from the transport's mention list); `text` is the matched surface."""

    how: CallHow
    name: str
    span: tuple[int, int] | None = None
    text: str = ""


class CallDetector:
    """Decides whether a message is an explicit call. Precedence: a mention of the bot, then a
    reply to the bot, then a call name — the structural signals are certain, names are read."""

    def __init__(self, names: Sequence[str], bot_user_id: str | int | None = None) -> None:
        if isinstance(names, str):
            raise InvalidTypeError("names must be a sequence of names, not one string")
        patterns: list[_NamePattern] = []
        seen: set[str] = set()
        for name in names:
            if not isinstance(name, str):
                raise InvalidTypeError(f"call names must be strings, not {type(name).__name__}")
            folded = " ".join(fold_for_matching(name).split())
            if folded and folded not in seen:
                seen.add(folded)
                patterns.append(_compile_name(name.strip(), folded))
        # Longer names first, so "누리레인아" is the name 누리레인, not a failed 누리.
        self._names = sorted(patterns, key=lambda p: -len(p.name))
        if bot_user_id is not None:
            bot_user_id = str(bot_user_id)
            if not bot_user_id.isdigit():
                raise InvalidInputError(f"bot_user_id must be digits, got {bot_user_id[:40]!r}")
        self.bot_user_id: str | None = bot_user_id

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._names)

    def detect(self, text: str, *, mentions: Sequence[str] = (), reply_to_bot: bool = False) -> CallMatch | None:
        if not isinstance(text, str):
            raise InvalidTypeError(f"message text must be a string, not {type(text).__name__}")
        if self.bot_user_id is not None:
            for m in _USER_MENTION.finditer(text):
                if m.group(1) == self.bot_user_id:
                    return CallMatch("mention", self.bot_user_id, m.span(), m.group(0))
            if self.bot_user_id in {str(m) for m in mentions}:
                return CallMatch("mention", self.bot_user_id)
        if reply_to_bot:
            return CallMatch("reply", "")
        return self.find_name(text)

    def find_name(self, text: str) -> CallMatch | None:
        """The earliest call name in `text` that is used as a call, or None."""
        folded, starts, ends = _fold_with_map(text)
        masked = _mask(folded)
        best: tuple[int, int, str] | None = None
        for pattern in self._names:
            found = _first_call(pattern, masked)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], found[1], pattern.name)
        if best is None:
            return None
        start, end = starts[best[0]], ends[best[1] - 1]
        return CallMatch("name", best[2], (start, end), text[start:end])


def _first_call(pattern: _NamePattern, masked: str) -> tuple[int, int] | None:
    candidates: list[tuple[int, int]] = []
    for m in pattern.with_particle.finditer(masked):
        particle = next((v for k, v in m.groupdict().items() if v is not None), "")
        if not _is_verb_form(masked, m.start(), m.end(), particle):
            candidates.append(m.span())
            break
    for m in pattern.bare.finditer(masked):
        if not pattern.hangul or _bare_is_vocative(masked, m.start(), m.end()):
            candidates.append(m.span())
            break
    return min(candidates) if candidates else None

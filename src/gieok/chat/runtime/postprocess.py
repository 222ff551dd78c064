"""Turning the model's text into chat messages: mentions, self-reference, chunks, streaming.

Transport-agnostic, but shaped by Discord's rules: a message holds at most 2,000 characters,
`<@ID>` pings a user, a ``` code block renders only when it is closed in the same message, and
a message edited more than about once a second is rate limited.
"""

from __future__ import annotations

import bisect
import re
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ...errors import InvalidInputError, InvalidTypeError
from .calls import has_batchim, particle_variant

__all__ = [
    "render_mentions", "SelfCorrector", "correct_self_reference", "chunk_message", "MIN_CHUNK_LIMIT",
    "EditThrottle", "StreamView", "MessageOp", "stream_view",
]

MIN_CHUNK_LIMIT = 10  # room for a reopened fence, its closing and some text
_USER_TOKEN = re.compile(r"<user:\s*(\d{1,25})\s*>")
# Things a chunk boundary must not cut through, and a self-reference correction must not touch.
_ATOM = re.compile(r"<(?:@[!&]?\d+|#\d+|a?:[\w~]+:\d+|t:-?\d+(?::[A-Za-z])?|user:\s*\d+\s*)>"
                   r"|<https?://[^\s>]+>|https?://\S+")
_FENCE_RUN = re.compile(r"`{3,}")
_FENCE_TAG = re.compile(r"[A-Za-z0-9_+#.-]{1,32}(?=[ \t]*\n)")


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise InvalidTypeError(f"text must be a string, not {type(text).__name__}")
    return text


# -- mentions -----------------------------------------------------------------------------------------

def render_mentions(text: str, known_user_ids: set[str] | None = None, *, unknown: str = "someone") -> str:
    """`<user:ID>` (how prompts and facts name people) becomes the Discord mention `<@ID>`.

    Only numeric ids are rendered (`<user: 42>` is tolerated, `<user:abc>` is left alone: it is
    not an id we wrote). With `known_user_ids`, an id outside the set becomes `unknown` rather
    than a ping: the model may have invented or misremembered it, and pinging a stranger is
    worse than an impersonal word; leaving the raw token would show users internal markup."""
    _check_text(text)
    known = None if known_user_ids is None else {str(i) for i in known_user_ids}

    def render(m: re.Match[str]) -> str:
        user_id = m.group(1)
        return f"<@{user_id}>" if known is None or user_id in known else unknown

    return _USER_TOKEN.sub(render, text)


# -- self-reference -------------------------------------------------------------------------------------

_WORD = r"[^\W\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"  # as in calls.py
_LATIN_WORD = r"[^\W\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"
_UNPAIRED = ("도", "만", "의", "에게", "한테", "께", "께서", "에서", "에", "보다", "처럼", "까지", "부터", "하고",
             "입니다", "입니까", "이었", "였")
_PAIRS = (("이", "가"), ("은", "는"), ("을", "를"), ("과", "와"), ("이랑", "랑"), ("이나", "나"), ("으로", "로"),
          ("으로서", "로서"), ("으로써", "로써"), ("이라고", "라고"), ("이라는", "라는"), ("이라서", "라서"),
          ("이라면", "라면"), ("이란", "란"), ("이에요", "예요"), ("이야", "야"), ("이다", "다"), ("이지만", "지만"))
_CORRECTION_PARTICLES = "|".join(sorted({p for pair in _PAIRS for p in pair} | set(_UNPAIRED), key=len, reverse=True))
_PROTECTED = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`|" + _ATOM.pattern, re.S)


def _term_pattern(index: int, term: str) -> str:
    body = r"\s+".join(re.escape(part) for part in term.split())
    particle = rf"(?P<k{index}>{_CORRECTION_PARTICLES})(?!{_WORD})"
    if has_batchim(term) is None:  # Latin etc.: any Hangul after it is a suffix ("AI들", "Nuri는")
        end = rf"(?!{_LATIN_WORD})(?:{particle})?"
    else:  # Hangul: only a known particle or a word boundary may follow ("누리다" is another word)
        end = rf"(?:{particle}|(?!{_WORD}))"
    return rf"(?<!{_WORD})(?P<t{index}>{body}){end}"


class SelfCorrector:
    """Replaces the ways the model wrongly refers to itself ("저는 AI 어시스턴트", "Nuri는" in a
    Korean persona) with the configured ones, in one pass: a replacement is never corrected again.
    The pattern is compiled once (the runtime corrects every streamed edit).

    Terms match case-insensitively, as whole words (spaces in a term match any whitespace). A
    term ending in Hangul must be followed by a particle or a word boundary; a Latin one by
    anything but a Latin letter. A paired particle right after it is re-chosen for the
    replacement ("인공지능으로" → "누리로", "Nuri가" → "하늘이"). Code, links and mentions are
    left alone. Longer terms win over shorter ones."""

    def __init__(self, replacements: Mapping[str, str]) -> None:
        terms: list[tuple[str, str]] = []
        for wrong, right in replacements.items():
            if not isinstance(wrong, str) or not isinstance(right, str):
                raise InvalidTypeError("self-reference replacements map strings to strings")
            if wrong.strip():
                terms.append((" ".join(wrong.split()), right))
        terms.sort(key=lambda t: -len(t[0]))
        self._terms = terms
        self._pattern = (re.compile("|".join(_term_pattern(i, wrong) for i, (wrong, _) in enumerate(terms)),
                                    re.IGNORECASE) if terms else None)

    def correct(self, text: str) -> str:
        _check_text(text)
        if self._pattern is None or not text:
            return text
        protected = [m.span() for m in _PROTECTED.finditer(text)]
        terms = self._terms

        def replace(m: re.Match[str]) -> str:
            if any(a < m.end() and m.start() < b for a, b in protected):
                return m.group(0)
            index = next(i for i in range(len(terms)) if m.group(f"t{i}") is not None)
            right = terms[index][1]
            particle = m.group(f"k{index}") or ""
            return right + (particle_variant(particle, right) if particle else "")

        return self._pattern.sub(replace, text)


def correct_self_reference(text: str, replacements: Mapping[str, str]) -> str:
    """`SelfCorrector(replacements).correct(text)`, for one text."""
    return SelfCorrector(replacements).correct(text)


# -- chunking ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Fence:
    open_start: int
    content_start: int  # after the ``` and its language tag
    close_start: int  # len(text) when never closed
    close_end: int
    tag: str


def _find_fences(text: str) -> list[_Fence]:
    """Every run of three or more backticks opens or closes a block, as Discord reads them."""
    fences: list[_Fence] = []
    runs = list(_FENCE_RUN.finditer(text))
    for i in range(0, len(runs), 2):
        opening = runs[i]
        tag = _FENCE_TAG.match(text, opening.end())
        content_start = tag.end() if tag else opening.end()
        if i + 1 < len(runs):
            close_start, close_end = runs[i + 1].span()
        else:
            close_start = close_end = len(text)
        fences.append(_Fence(opening.start(), content_start, close_start, close_end, tag.group(0) if tag else ""))
    return fences


_SENTENCE_END = re.compile(
    r"(?:[.!?…。！？]+|(?<=[\uac00-\ud7a3])(?:니다|[었았였했됐겠는한된]다|이다|[요죠까])|[ㅋㅎㅠㅜ]{2,})"
    r"[\"'”’)\]]*(?=\s)")


def _splits_cluster(text: str, c: int) -> bool:
    """A hard cut must not separate a base character from its combining marks, an emoji ZWJ
    sequence, a variation selector or CR LF."""
    if c <= 0 or c >= len(text):
        return False
    after, before = text[c], text[c - 1]
    return (unicodedata.combining(after) != 0 or after in "\u200d\ufe0f\ufe0e" or before == "\u200d"
            or 0x1160 <= ord(after) <= 0x11FF or (before == "\r" and after == "\n"))


class _Chunker:
    """Greedy: each chunk ends at the best allowed cut that keeps it within the limit."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit
        n = len(text)
        self.fences = _find_fences(text)
        self._fence_starts = [f.content_start for f in self.fences]
        self.inside_atom = bytearray(n + 1)  # 1 where a cut would split an atom
        self.inside_marker = bytearray(n + 1)  # 1 inside a ``` run or its language tag
        for m in _ATOM.finditer(text):
            self.inside_atom[m.start() + 1:m.end()] = b"\x01" * (m.end() - m.start() - 1)
        for f in self.fences:
            for a, b in ((f.open_start, f.content_start), (f.close_start, f.close_end)):
                if b - a > 1:
                    self.inside_marker[a + 1:b] = b"\x01" * (b - a - 1)
                    self.inside_atom[a + 1:b] = b"\x01" * (b - a - 1)
        # next_text[i]: first non-space index >= i; text_end[i]: one past the last non-space before i.
        self.next_text = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            self.next_text[i] = i if not text[i].isspace() else self.next_text[i + 1]
        self.text_end = [0] * (n + 1)
        for i in range(1, n + 1):
            self.text_end[i] = i if not text[i - 1].isspace() else self.text_end[i - 1]
        self.levels = [
            [m.start() for m in re.finditer(r"\n[ \t\r]*\n", text)],  # paragraphs
            [m.start() for m in re.finditer(r"\n", text)],  # lines
            [m.end() for m in _SENTENCE_END.finditer(text)],  # sentences
            [m.start() for m in re.finditer(r"\s+", text)],  # words
        ]

    def fence_at(self, c: int) -> _Fence | None:
        i = bisect.bisect_right(self._fence_starts, c) - 1
        if i >= 0 and self.fences[i].content_start <= c <= self.fences[i].close_start:
            return self.fences[i]
        return None

    def reopen(self, fence: _Fence) -> str:
        tag = fence.tag if len(fence.tag) + 8 <= self.limit // 2 else ""
        return f"```{tag}\n"

    def has_text(self, start: int, end: int) -> bool:
        return self.next_text[start] < end

    def prefix(self, start: int) -> str:
        opened = self.fence_at(start)
        return self.reopen(opened) if opened is not None else ""

    def suffix(self, cut: int) -> str:
        return "\n```" if self.fence_at(cut) is not None else ""

    def build(self, start: int, cut: int) -> str:
        """The text between the cuts, trailing space dropped, its code block reopened / closed."""
        return self.prefix(start) + self.text[start:self.text_end[cut]] + self.suffix(cut)

    def fits(self, start: int, cut: int) -> bool:
        end = self.text_end[cut]
        if end <= start:
            return False
        return len(self.prefix(start)) + end - start + len(self.suffix(cut)) <= self.limit

    def allowed(self, start: int, cut: int) -> bool:
        if cut <= start or self.inside_atom[cut]:
            return False
        fence = self.fence_at(cut)
        # no empty code block on either side of the cut
        if fence is not None and not (self.has_text(max(start, fence.content_start), cut)
                                      and self.has_text(cut, fence.close_start)):
            return False
        return self.fits(start, cut)

    def next_cut(self, start: int) -> int:
        room = self.limit - len(self.prefix(start))
        highest = min(len(self.text), start + room)
        # 1. the highest-level boundary that fills at least half the chunk; 2. any boundary,
        # higher levels first; 3. a hard cut outside atoms; 4. any cut that fits.
        for minimum in (start + room // 2, start + 1):
            for level in self.levels:
                lo = bisect.bisect_left(level, minimum)
                hi = bisect.bisect_right(level, highest)
                for cut in reversed(level[lo:hi]):
                    if self.allowed(start, cut):
                        return cut
        for cut in range(highest, start, -1):
            if not _splits_cluster(self.text, cut) and self.allowed(start, cut):
                return cut
        for cut in range(highest, start, -1):
            if not self.inside_marker[cut] and self.fits(start, cut):
                return cut
        for cut in range(highest, start, -1):
            if self.fits(start, cut):
                return cut
        return start + 1

    def skip_whitespace(self, cut: int) -> int:
        """Whitespace at a cut is dropped, but not the indentation of the next line."""
        run = self.text[cut:self.next_text[cut]]
        newline = run.rfind("\n")
        return cut + (newline + 1 if newline >= 0 else len(run))

    def chunks(self) -> list[str]:
        out: list[str] = []
        n = len(self.text)
        start = self.skip_whitespace(0)
        while self.has_text(start, n):
            if self.fits(start, n):
                out.append(self.build(start, n))
                break
            cut = self.next_cut(start)
            if self.has_text(start, cut):
                out.append(self.build(start, cut))
            start = self.skip_whitespace(cut)
        return out


def chunk_message(text: str, limit: int = 2000) -> list[str]:
    """Split a reply into messages of at most `limit` characters.

    Cuts prefer, in order, paragraph breaks, line breaks, sentence ends (. ! ? … and Korean
    endings such as 다. 요. 죠., also 니다/요 before a space, and ㅋㅋ/ㅎㅎ runs), spaces, and only
    then a hard cut; a boundary of a higher kind wins when it fills at least half the chunk.
    A cut never falls inside a mention (`<@1>`, `<user:1>`, `<#1>`, custom emoji), a link or a
    ``` marker — unless the thing alone is longer than a chunk. A cut inside a code block closes
    the block at the end of the chunk and reopens it, with its language tag, at the start of the
    next; a block left open at the end is closed. Whitespace at the cuts is dropped (the next
    line's indentation is kept); nothing else is lost, and no chunk is empty: blank text gives []."""
    _check_text(text)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidTypeError(f"limit must be an integer, not {type(limit).__name__}")
    if limit < MIN_CHUNK_LIMIT:
        raise InvalidInputError(f"limit must be at least {MIN_CHUNK_LIMIT}, got {limit}")
    if not text.strip():
        return []
    return _Chunker(text, limit).chunks()


# -- streaming ----------------------------------------------------------------------------------------------

class EditThrottle:
    """At most one edit of a streaming message per `min_interval` seconds (Discord rate-limits
    faster edits). `should_edit()` asks, `mark()` records an edit that was made; pass `now` or
    a fake `clock` in tests."""

    def __init__(self, min_interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if min_interval < 0:
            raise InvalidInputError(f"min_interval must not be negative, got {min_interval}")
        self.min_interval = min_interval
        self.clock = clock
        self.last: float | None = None

    def should_edit(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return self.last is None or now - self.last >= self.min_interval

    def mark(self, now: float | None = None) -> None:
        self.last = self.clock() if now is None else now


@dataclass(frozen=True)
class MessageOp:
    """One thing the adapter must do to make the channel show a `StreamView`."""

    kind: Literal["send", "edit", "delete"]
    index: int  # position among the reply's messages
    text: str = ""


@dataclass(frozen=True)
class StreamView:
    """The messages a (streaming) reply occupies: all but the last are complete; while
    streaming, the last carries the marker."""

    messages: tuple[str, ...]
    done: bool

    @property
    def current(self) -> str:
        return self.messages[-1] if self.messages else ""

    def operations(self, shown: Sequence[str]) -> list[MessageOp]:
        """What turns the `shown` messages into these: edit the ones that differ, send the new
        ones (a new message starts when the text crossed the limit), delete any left over."""
        ops = [MessageOp("edit", i, text) for i, text in enumerate(self.messages[:len(shown)]) if shown[i] != text]
        ops += [MessageOp("send", i, self.messages[i]) for i in range(len(shown), len(self.messages))]
        ops += [MessageOp("delete", i) for i in range(len(self.messages), len(shown))]
        return ops


def stream_view(text: str, *, limit: int = 2000, done: bool = False, marker: str = " …") -> StreamView:
    """What to show for the text streamed so far.

    The text is chunked with `limit - len(marker)` both while streaming and when done, so the
    final messages are the streamed ones without the marker (no late re-layout). Use with
    `EditThrottle` for the edits in between; always apply the final view."""
    _check_text(text)
    if not isinstance(marker, str):
        raise InvalidTypeError("marker must be a string")
    chunk_limit = limit - len(marker)
    if chunk_limit < MIN_CHUNK_LIMIT:
        raise InvalidInputError(f"limit {limit} leaves no room for the marker {marker!r}")
    chunks = chunk_message(text, chunk_limit)
    if chunks and not done:
        chunks[-1] += marker
    return StreamView(tuple(chunks), done)

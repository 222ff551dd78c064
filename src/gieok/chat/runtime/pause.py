"""How long to wait for someone to finish: the debounce, adapted to what the last message reads like.

A fixed pause makes every reply wait as long as the most hesitant typist needs. But a message
that ends a thought ("누리야 오늘 뭐 해?", "that was great!", "진짜 웃기다 ㅋㅋ", "맛있었어요") is
rarely followed by another part, while one that trails off ("그리고…", "근데", "so,") almost
always is. `reads_finished` tells them apart from the text alone (no model: it runs on every
message); `BotCore` waits `debounce_finished_seconds` after a finished-looking message and
`debounce_seconds` after any other. A wrong guess costs little: a message that arrives after
the reply was planned is answered in the next turn (or merged, while the plan is still being made).
"""

from __future__ import annotations

import re

__all__ = ["reads_finished"]

# Ends a thought: terminal punctuation (one or repeated, full-width too), laughter or crying in
# jamo (ㅋㅋ, ㅎㅎ, ㅠㅠ), an emoji or emoticon-like symbol.
_FINISHED_MARK = re.compile(r"(?:[?!.？！。~]+|[ㅋㅎㅠㅜ]{2,}|[\U0001F300-\U0001FAFF\u2600-\u27BF])\s*$")
# Trails off: an ellipsis or a separator left hanging.
_TRAILING = re.compile(r"(?:\.\.+|…|[,，、:;：；\-–—/(])\s*$")
# Korean sentence-final endings (polite and plain, statements and questions) as the last syllable.
_KOREAN_FINAL = re.compile(r"[가-힣](?:요|죠|까|니|냐|다|네|지|래|자|군|걸|대)\s*$")
# A last word that joins to what comes next: the thought goes on.
_CONNECTIVES = frozenset({
    "그리고", "근데", "그런데", "그래서", "그러니까", "그니까", "그럼",
    "아니면", "또", "및", "혹은", "하지만", "그러면",
    "and", "but", "so", "or", "because", "cuz", "like", "then", "also", "plus", "anyway",
})


def reads_finished(text: str) -> bool:
    """Whether `text` reads like the end of what its author meant to say."""
    text = text.strip()  # not NFKC: it would turn ㅋㅋ into conjoining jamo
    if not text:
        return False
    if _TRAILING.search(text):
        return False
    last_word = text.split()[-1].casefold().strip("\"'`*_")
    if last_word in _CONNECTIVES:
        return False
    return bool(_FINISHED_MARK.search(text) or _KOREAN_FINAL.search(text))

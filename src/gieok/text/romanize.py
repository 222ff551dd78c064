"""Names across scripts: "민지" ↔ "Minji", "지훈" ↔ "Jihoon", "다니엘" ↔ "Daniel", "케빈" ↔ "Kevin".

Bilingual chats name the same person in both scripts ("What is Minji's favourite food?" about
turns spoken by 민지; "다니엘 요즘 어디 살아?" about Daniel's). `romanize` writes Hangul with the
Revised Romanization's letters, and `name_key` folds both sides to one spelling, so the common
variants meet: oo/u, ee/i, eo/u, hyphens and spaces for romanised Korean names; ph/p, f/p, v/b,
x/ks, ie/i, y/i, doubled letters for English names written in Hangul (소피 ↔ Sophie, 에밀리 ↔
Emily). A Hangul word in a question may carry a particle (다니엘은, 소피가): `hangul_name_keys`
gives its keys, and a Latin name matches one that starts with its own key.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..callbacks import cleared_on_erasure

__all__ = ["hangul_name_keys", "latin_name_keys", "name_key", "romanize"]

_INITIALS = ("g", "kk", "n", "d", "tt", "r", "m", "b", "pp", "s", "ss", "", "j", "jj", "ch", "k", "t", "p", "h")
_VOWELS = ("a", "ae", "ya", "yae", "eo", "e", "yeo", "ye", "o", "wa", "wae", "oe", "yo", "u", "wo", "we", "wi", "yu",
           "eu", "ui", "i")
_FINALS = ("", "k", "k", "k", "n", "n", "n", "t", "l", "k", "m", "l", "l", "l", "p", "l", "m", "p", "p", "t", "t",
           "ng", "t", "t", "k", "t", "p", "t")
_FOLDS = (("-", ""), (" ", ""), ("'", ""), ("oo", "u"), ("ee", "i"), ("eo", "u"), ("ou", "u"), ("ph", "p"),
          ("f", "p"), ("v", "b"), ("x", "ks"), ("ie", "i"), ("y", "i"), ("lr", "l"))
_DOUBLED = re.compile(r"([a-z])\1")
_LATIN_WORD = re.compile(r"[a-z][a-z\-]+[a-z]")
_HANGUL_WORD = re.compile(r"[\uac00-\ud7a3]{2,}")


def romanize(text: str) -> str:
    """Hangul syllables in Revised Romanization letters (without its sound-change rules);
    everything else unchanged."""
    out = []
    for ch in text:
        code = ord(ch) - 0xAC00
        if 0 <= code < 11172:
            out.append(_INITIALS[code // 588] + _VOWELS[(code % 588) // 28] + _FINALS[code % 28])
        else:
            out.append(ch)
    return "".join(out)


@cleared_on_erasure
@lru_cache(maxsize=4096)
def name_key(name: str) -> str:
    """One spelling for a name in either script: romanised, lowercased, variants folded."""
    key = romanize(name.strip()).lower()
    for a, b in _FOLDS:
        key = key.replace(a, b)
    return _DOUBLED.sub(r"\1", key)


def latin_name_keys(text: str) -> set[str]:
    """`name_key` of every Latin word of three letters or more in `text` ("Minji's" → "minji")."""
    words = _LATIN_WORD.findall(text.casefold().replace("'s", " ").replace("’s", " "))
    return {name_key(w) for w in words}


def hangul_name_keys(text: str) -> set[str]:
    """`name_key` of every Hangul word of two syllables or more in `text` (particles included:
    "다니엘은" → "danieleun", which a Latin name's key "daniel" starts)."""
    return {name_key(w) for w in _HANGUL_WORD.findall(text)}

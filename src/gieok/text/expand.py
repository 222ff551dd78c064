"""Korean query expansion through a hand-written synonym table.

A Korean question often names a thing with other words than the turn that answers it
("반려견을 데려온 게 언제야?" for "강아지 입양했어"), and BM25 then finds nothing. The table
(`gieok/data/ko_synonyms.txt`, everyday chat words, written by hand) lists words that name the
same thing; a query token in a group brings the group's other tokens into the BM25 query. Only
Hangul tokens are looked up, so an English query is never changed. The stored tokens are not
touched: expansion is on the query side only, and the table can change without re-indexing.
"""

from __future__ import annotations

import re
import threading
from importlib import resources

from .tokenize import Tokenizer

__all__ = ["QueryExpander", "query_expander"]

_HANGUL = re.compile(r"[\uac00-\ud7a3]")


def _table_lines() -> list[list[str]]:
    text = resources.files("gieok.data").joinpath("ko_synonyms.txt").read_text(encoding="utf-8")
    groups = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            groups.append([word.strip() for word in line.split(",") if word.strip()])
    return groups


class QueryExpander:
    """Adds the synonyms of a query's Korean tokens. The table's words go through `tokenizer`
    once, so a group holds the tokens that tokenizer makes (lemmas for kiwi, bigrams otherwise)."""

    def __init__(self, tokenizer: Tokenizer, groups: list[list[str]] | None = None) -> None:
        self._synonyms: dict[str, tuple[str, ...]] = {}
        for group in _table_lines() if groups is None else groups:
            tokens_of = [tokenizer.tokens(word) for word in group]
            for word_tokens in tokens_of:
                if len(word_tokens) != 1 or not _HANGUL.search(word_tokens[0]):
                    continue  # only a word that is one Korean token is looked up
                key = word_tokens[0]
                # a word of several tokens brings its longer ones: "멍멍이" → 멍멍 (이 is in every other text)
                others = [t for other in tokens_of if other != word_tokens for t in other
                          if t != key and (len(other) == 1 or len(t) > 1)]
                merged = dict.fromkeys((*self._synonyms.get(key, ()), *others))
                self._synonyms[key] = tuple(merged)

    def synonyms(self, token: str) -> tuple[str, ...]:
        return self._synonyms.get(token, ())

    def expand(self, tokens: list[str]) -> list[str]:
        """`tokens`, then each synonym of them not already there (in the table's order)."""
        seen = set(tokens)
        out = list(tokens)
        for token in tokens:
            for synonym in self._synonyms.get(token, ()):
                if synonym not in seen:
                    seen.add(synonym)
                    out.append(synonym)
        return out


_expanders: dict[int, QueryExpander] = {}
_lock = threading.Lock()


def query_expander(tokenizer: Tokenizer) -> QueryExpander:
    """One expander per tokenizer (the table is tokenized once per process)."""
    with _lock:
        expander = _expanders.get(id(tokenizer))
        if expander is None:
            expander = _expanders[id(tokenizer)] = QueryExpander(tokenizer)
        return expander

"""Stored BM25 tokens made the way queries are. A query tokenized otherwise than the stored blocks
misses them in BM25 without any error, so a memory records the `Tokenizer.version` that made its
tokens (the store's meta `tokenizer`), and one whose tokens another version made — written before
the version was recorded (kiwi with its multi-word dictionary), or with other tokenizer options —
has its live blocks re-tokenized when it opens: once, in one transaction, rewriting only the
blocks whose tokens change (4 of 3,107 Korean texts for the multi-word dictionary)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ..store.base import TOKENIZER_KEY, Store
from ..text.tokenize import Tokenizer
from ..types import Block

__all__ = ["refresh_tokens"]

log = logging.getLogger("gieok.memory")

_CHUNK = 512  # texts per batch: kiwi analyses a batch on every core


def _chunks(blocks: Iterator[Block], live: set[int]) -> Iterator[list[Block]]:
    chunk: list[Block] = []
    for block in blocks:
        if block.block_index in live:
            chunk.append(block)
            if len(chunk) == _CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def refresh_tokens(store: Store, tokenizer: Tokenizer) -> int:
    """Re-tokenize `store`'s live blocks unless their tokens are `tokenizer.version`'s; how many
    blocks' tokens changed (0 when nothing had to be done, or another process did it first)."""
    version = tokenizer.version
    recorded = store.get_meta(TOKENIZER_KEY)
    if recorded == version:
        return 0
    stored = dict(store.load_tokens(0))
    started = time.perf_counter()
    if stored:
        log.info("re-tokenizing the BM25 tokens of %d blocks: they were made by %s, queries by %s (once)",
                 len(stored), recorded or "an earlier gieok", version)
    changed: dict[int, list[str]] = {}
    for chunk in _chunks(store.iter_blocks(), set(stored)):
        for block, analysis in zip(chunk, tokenizer.analyze_many([b.text for b in chunk])):
            if " ".join(analysis.tokens) != stored[block.block_index]:
                changed[block.block_index] = analysis.tokens
    if not store.replace_tokens(changed, version):
        return 0
    if stored:
        log.info("re-tokenized: %d of %d blocks changed, %.1f s", len(changed), len(stored),
                 time.perf_counter() - started)
    return len(changed)

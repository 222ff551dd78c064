"""New blocks, checked and prepared before anything is written: every field validated (the first
bad item of a batch names its position), the text analysed once for its tokens and keywords.
What a passage embeds — a turn with the turns just before it — is `retrieval/passages.py`'s."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..config import Settings
from ..errors import BlockNotFoundError, InvalidInputError, InvalidTypeError
from ..retrieval.passages import PassageSource, speaker_name_of
from ..store.base import NewBlock
from ..text.tokenize import Analysis, Tokenizer
from ..types import Block, Scope
from ..validate import (
    check_importance,
    check_kind,
    check_metadata,
    check_speaker,
    check_time,
    check_words,
    clean_text,
)

__all__ = ["ADD_FIELDS", "prepare", "prepare_many", "checked_fields", "passage_source", "new_passage_source",
           "source_of_fields", "passage_sources", "block_index", "block_indices", "MAX_BLOCK_INDEX"]

ADD_FIELDS = frozenset({"text", "kind", "scope", "speaker", "event_time", "importance", "keywords", "tags",
                        "metadata"})


def prepare(settings: Settings, tokenizer: Tokenizer, text: Any, *, kind: Any = "turn", scope: Any = None,
            speaker: Any = None, event_time: Any = None, importance: Any = 0.5, keywords: Any = None,
            tags: Any = None, metadata: Any = None, analysis: Analysis | None = None) -> NewBlock:
    """One block ready to append (keywords from the text when not given)."""
    text = clean_text(text, max_chars=settings.max_text_chars, setting="max_text_chars")
    kind = check_kind(kind)
    scope = Scope.of(scope)
    speaker = check_speaker(speaker)
    when = check_time(event_time, "event_time")
    importance = check_importance(importance)
    keyword_list = check_words(keywords, "keywords")
    tag_list = check_words(tags, "tags") or []
    meta = check_metadata(metadata, settings.max_text_chars)
    if analysis is None:
        analysis = tokenizer.analyze(text, keyword_limit=settings.max_keywords)
    return NewBlock(
        kind=kind, text=text, scope=scope, speaker=speaker,
        event_time=when if when is not None else time.time(), importance=importance,
        keywords=keyword_list if keyword_list is not None else analysis.keywords, tags=tag_list,
        metadata=meta, tokens=analysis.tokens,
    )


def checked_fields(items: Iterable[str | Mapping[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """Each item as a dict of known fields with its text cleaned (the first bad one raises)."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        # a text is not a list of one-character texts, nor a mapping a list of its keys
        raise InvalidTypeError(f"items must be a list of texts or mappings, not {type(items).__name__}")
    fields_list: list[dict[str, Any]] = []
    for position, item in enumerate(items):
        try:
            if isinstance(item, str):
                fields = {"text": item}
            elif isinstance(item, Mapping):
                unknown = set(item) - ADD_FIELDS
                if unknown:
                    raise InvalidInputError(f"unknown field(s) {sorted(unknown)}")
                if "text" not in item:
                    raise InvalidInputError("missing field 'text'")
                fields = dict(item)
            else:
                raise InvalidTypeError(f"items must be strings or mappings, not {type(item).__name__}")
            fields["text"] = clean_text(fields["text"], max_chars=max_chars, setting="max_text_chars")
            fields_list.append(fields)
        except (InvalidInputError, InvalidTypeError) as exc:
            raise type(exc)(f"item {position}: {exc}") from None
    return fields_list


def prepare_many(settings: Settings, tokenizer: Tokenizer, items: Iterable[str | Mapping[str, Any]]) -> list[NewBlock]:
    """Validate every item (raising for the first bad one, naming its position), then tokenize
    all texts in one batch."""
    fields_list = checked_fields(items, settings.max_text_chars)
    analyses = tokenizer.analyze_many([f["text"] for f in fields_list], keyword_limit=settings.max_keywords)
    prepared = []
    for position, (fields, analysis) in enumerate(zip(fields_list, analyses)):
        try:
            prepared.append(prepare(settings, tokenizer, fields.pop("text"), analysis=analysis, **fields))
        except (InvalidInputError, InvalidTypeError) as exc:
            raise type(exc)(f"item {position}: {exc}") from None
    return prepared


def source_of_fields(fields: Mapping[str, Any]) -> PassageSource:
    """What a passage of an item not yet prepared is made of (`Memory.passage_texts`)."""
    when = check_time(fields.get("event_time"), "event_time")
    return PassageSource(fields["text"], check_kind(fields.get("kind", "turn")), Scope.of(fields.get("scope")).channel,
                         when if when is not None else time.time(), speaker_name_of(fields.get("metadata")),
                         _speaker(fields.get("speaker")))


def _speaker(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def passage_sources(items: Iterable[str | Mapping[str, Any]], max_chars: int) -> list[PassageSource]:
    """What the passages of items not yet added are made of, each checked (the first bad one names its position)."""
    sources = []
    for position, fields in enumerate(checked_fields(items, max_chars)):
        try:
            sources.append(source_of_fields(fields))
        except (InvalidInputError, InvalidTypeError) as exc:
            raise type(exc)(f"item {position}: {exc}") from None
    return sources


MAX_BLOCK_INDEX = 2**63 - 1  # a database integer: a larger index names no block, and fails the query


def block_index(value: Any) -> int:
    """A block index: an integer (a bool is not one); one no store can hold — negative, or past a
    database integer, which failed the store's query — names no block."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"block index must be an integer, not {type(value).__name__}")
    if not 0 <= value <= MAX_BLOCK_INDEX:
        raise BlockNotFoundError(f"no block with index {value}")
    return value


def block_indices(value: int | Iterable[int]) -> list[int]:
    """One block index or several (`block_index` each)."""
    if isinstance(value, bool):
        raise InvalidTypeError("block index must be an integer")
    return [block_index(i) for i in ([value] if isinstance(value, int) else list(value))]


def new_passage_source(block: NewBlock) -> PassageSource:
    return PassageSource(block.text, block.kind, block.scope.channel, block.event_time,
                         speaker_name_of(block.metadata), block.speaker)


def passage_source(block: Block) -> PassageSource:
    """A stored block as the turn before another one (a forgotten one with no text)."""
    return PassageSource("" if block.forgotten else block.text, block.kind, block.scope.channel, block.event_time,
                         None if block.forgotten else speaker_name_of(block.metadata),
                         None if block.forgotten else block.speaker)

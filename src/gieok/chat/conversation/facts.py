"""L3: facts — blocks of kind `fact` about a user, a guild, or the bot's world (lore).

A fact is written as a block (so it is searchable, hash-chained and erasable like any
other) plus a row in the `facts` table that holds what may change later: `valid_to` and
`superseded_by`. A newer fact that contradicts an older one about the same subject
supersedes it; the old one is kept for history and never silently deleted.

Time is the conversation's, not the extraction's. Each statement of a fact — a message that said
it, and when it was said — is kept (`fact_sources`); the versions of one attribute of a subject
("lives in 부산", then "서울", then "부산" again) form a chain ordered by when they were said, each
valid from its earliest statement until the next version's. A message that arrives late (a
backfill, a shuffled import) takes its place in that order: an older statement of another value
becomes history closed by the newer fact, never the current one; an older statement of the same
value moves the version's start back; one that falls inside a version that was stated again later
splits it (A, then B, then A again). So the same statements give the same chain in any arrival
order. Removing a statement (its message edited or deleted) re-forms the chain the same way.
Beside the conversation's clock, `recorded_at` / `expired_at` keep when gieok learned a version
and learned it was over: what was true on day D, and what gieok knew on day D.

Isolation is a rule, not a convention: `visible()` decides whether a fact may reach a
prompt in (guild, user), and every recall passes through it, on top of the scoped searches.
- lore: everywhere;
- guild facts: only in their guild;
- user facts: in the guild where they were stated, and in DMs with that user; in other
  guilds only when `global_user_facts` is configured.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ...errors import InvalidInputError, InvalidTypeError, NotFoundError
from ...store.conversation import ConversationStore, FactChanges, FactRow, FactsMovedError, FactSourceRow, FactSubject
from ...types import Block, Scope
from ...validate import clean_text
from .fact_align import Paraphrase, judge_shapes, shape_of

if TYPE_CHECKING:
    from ...memory import Memory

__all__ = ["FactType", "Fact", "FactOutcome", "FactStore", "ModelVerdict", "PairJudge", "Statement", "visible",
           "LORE_GUILD", "FACT_STREAM_NAMES"]

log = logging.getLogger(__name__)

LORE_GUILD = "gieok:lore"  # lore blocks' scope; guild ids from a transport may not start with "gieok:"
MAX_FACT_CHARS = 1000
# How the live event stream names what became of a fact (`FactOutcome.action`), extracted or stated by hand
FACT_STREAM_NAMES = {"stored": "fact.added", "superseded": "fact.superseded", "duplicate": "fact.duplicate"}
# Tries of a write that meets another process's write about the same subject (each reads afresh)
FACT_WRITE_TRIES = 8
T = TypeVar("T")
MAX_TOPIC_CHARS = 80
_SUBJECT_REF = re.compile(r"<user:[^<>\s]{1,100}>")  # how a fact names a user


class FactType(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() of the members
    USER = "user_fact"
    GUILD = "guild_fact"
    LORE = "lore"


@dataclass(frozen=True, slots=True)
class Fact:
    block_index: int
    text: str
    fact_type: str
    topic: str
    keywords: tuple[str, ...]
    guild: str | None
    user_id: str | None
    source_message: str | None
    valid_from: float
    valid_to: float | None
    superseded_by: int | None
    recorded_at: float | None = None  # when gieok learned it
    expired_at: float | None = None  # when gieok learned it was over

    @property
    def current(self) -> bool:
        return self.valid_to is None

    @property
    def never_held(self) -> bool:
        """Superseded when it began: a correction's wrong version (`FactStore.correct`), never true."""
        return self.valid_to is not None and self.valid_to <= self.valid_from

    def as_dict(self) -> dict[str, Any]:
        fields = {name: (list(v) if isinstance(v, tuple) else v)
                  for name, v in ((n, getattr(self, n)) for n in self.__slots__)}
        return {**fields, "current": self.current}


@dataclass(frozen=True, slots=True)
class Statement:
    """A message that states a fact: when it was said (the conversation's clock), which L1 message,
    in which conversation, the sender's id for it, and who said it."""

    said_at: float
    message_id: int | None = None
    scope_key: str | None = None
    external_id: str | None = None
    user_id: str | None = None
    author: str | None = None  # stated through the API by this key (an operator or an agent), not a message

    @property
    def name(self) -> str | None:
        return self.external_id or (str(self.message_id) if self.message_id is not None else None)


@dataclass(frozen=True, slots=True)
class FactOutcome:
    action: str  # stored | duplicate | superseded (stored, and replaced an older fact) | history (stored, not current)
    fact: Fact | None  # the stored fact, or the existing one it duplicates
    replaced: Fact | None = None
    similarity: float = 0.0
    judged_by: str = "offline"  # model | offline
    note: str | None = None  # why a model's verdict was not used


@dataclass(frozen=True, slots=True)
class ModelVerdict:
    """What the extraction model said about a new fact, by block index: `add` (nothing it was
    shown repeats or changes it), `duplicate` of `target`, or `replaces` `target`. `shown`: the
    subject's facts the model saw; an `add` is still checked by the offline judge against the
    subject's facts it did not see."""

    action: str
    target: int | None = None
    shown: frozenset[int] = frozenset()


def visible(row: FactRow, *, guild: str | None, user_id: str | None, global_user_facts: bool = False,
            history: bool = False) -> bool:
    """May this fact reach a prompt in `guild` (None = a DM) for `user_id`? A superseded one only
    when the prompt asks for `history`."""
    if row.valid_to is not None and not history:
        return False
    if row.fact_type == FactType.LORE:
        return True
    if row.fact_type == FactType.GUILD:
        return guild is not None and row.guild == guild
    if row.fact_type == FactType.USER:
        if guild is None:
            return user_id is not None and row.user_id == user_id
        if row.guild == guild:
            return True
        return global_user_facts and user_id is not None and row.user_id == user_id
    return False


@dataclass(frozen=True)
class PairJudge:
    """Is a new fact a duplicate of an older one about the same subject, a conflicting
    update of it, or something distinct?

    Embedding similarity only says "about the same thing": with e5 the cosine of "the cat
    is called 나비" and "the cat is called 초코" (0.97) is as high as that of two paraphrases.
    So the decision is made on the tokens (conversation/fact_align.py): the two facts are aligned and
    only the changed span is judged — nothing changed (after folding synonyms, numbers and
    negation agreeing) is a duplicate; another value of the same attribute is a conflict (the
    newer supersedes); another attribute is distinct, even when a number changed ("24살"
    never replaces "고양이 이름은 나비"). Words that changed only in form (an adverb, a romanised
    name, a derivation, spacing) are set aside, and what is left may be compared by the
    embedder on those words alone (`span_test`). The cosines stay as a floor under both: a pair less
    similar than `duplicate_threshold` / `conflict_threshold` is distinct. Thresholds chosen on
    the dev half of the bundled labeled pairs (docs/benchmarks.md, "Fact judge")."""

    duplicate_threshold: float = 0.85
    conflict_threshold: float = 0.85
    span_threshold: float = 0.96  # 1 turns the embedder's look at the changed words off

    def judge(self, similarity: float, new_tokens: Sequence[str], old_tokens: Sequence[str], new_text: str,
              old_text: str, same_topic: bool = False, paraphrase: Paraphrase | None = None) -> str:
        """The label alone; `same_topic` is accepted for older callers and no longer decides
        anything (the model's topic names differ for one attribute: "나이" / "출생연도")."""
        return self.explain(similarity, new_tokens, old_tokens, new_text, old_text, paraphrase)[0]

    def explain(self, similarity: float, new_tokens: Sequence[str], old_tokens: Sequence[str], new_text: str,
                old_text: str, paraphrase: Paraphrase | None = None) -> tuple[str, str]:
        """(duplicate | conflict | distinct, why). `paraphrase`: see `span_test`."""
        if _normal(new_text) == _normal(old_text):
            return "duplicate", "the same text"
        label, reason = judge_shapes(shape_of(old_text, old_tokens), shape_of(new_text, new_tokens), paraphrase)
        if label == "duplicate" and similarity < self.duplicate_threshold:
            return "distinct", f"{reason}, but cosine {similarity:.3f} < {self.duplicate_threshold}"
        if label == "conflict" and similarity < self.conflict_threshold:
            return "distinct", f"{reason}, but cosine {similarity:.3f} < {self.conflict_threshold}"
        return label, reason

    def span_test(self, embedder: Any) -> Paraphrase | None:
        """Do the words left changed mean the same ("kids" / "children", "afraid" / "fear")?
        The embedder's cosine of the two short spans, embedded as e5 queries (its mode for
        symmetric similarity), against `span_threshold`. Only the words left after the token
        rules are embedded, never the whole facts: whole facts about one subject are always
        close (0.97 for two cat names). Single words show why the bar is high: with the packaged
        e5, synonyms reach 0.95–0.98 (kids/children 0.984, movie/film 0.971) while siblings and
        opposites stay below (월요일/금요일 0.923, 의사/간호사 0.910, 내향적/외향적 0.959); the
        threshold was chosen on the dev half (docs/benchmarks.md, "Fact judge")."""
        if self.span_threshold >= 1:
            return None

        def same(old_span: str, new_span: str) -> bool:
            vectors = embedder.embed_queries([old_span, new_span])
            return float(np.dot(vectors[0], vectors[1])) >= self.span_threshold

        return same


def _normal(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.casefold())


@dataclass(frozen=True, slots=True)
class _NewVersion:
    """A version about to be written: its text and labels, the statement's name, and, for the
    resumed part of a split version, the version it resumes."""

    text: str
    topic: str
    keywords: tuple[str, ...]
    name: str | None
    lore_key: str | None
    resumes: FactRow | None = None
    resumes_at: float | None = None


@dataclass(frozen=True, slots=True)
class _Version:
    """A version of a chain while it is formed again: its row, and its start when that changes
    (`None`: as stored) with the name of its earliest statement."""

    row: FactRow
    start: float | None
    name: str | None = None

    @property
    def valid_from(self) -> float:
        return self.row.valid_from if self.start is None else self.start


def _in_time(version: _Version) -> tuple[float, float]:
    """Versions in the order they were said; of two said at once, the one written later last (a
    version about to be written — a placeholder index, below 0 — is the newest)."""
    index = version.row.block_index
    return version.valid_from, float(index) if index >= 0 else float("inf") - index


def _reform(versions: Sequence[_Version], recorded: float) -> list[tuple[int, dict[str, Any]]]:
    """The updates that make `versions` (one attribute's chain) a timeline: ordered by when each
    was first said, each valid until the next one's start and superseded by it, the last one
    current. `recorded`: now, on gieok's clock — when it learned of an end that changed."""
    ordered = sorted(versions, key=_in_time)
    updates: list[tuple[int, dict[str, Any]]] = []
    for position, version in enumerate(ordered):
        after = ordered[position + 1] if position + 1 < len(ordered) else None
        row = version.row
        wanted: dict[str, Any] = {"valid_from": version.valid_from,
                                  "valid_to": after.valid_from if after else None,
                                  "superseded_by": after.row.block_index if after else None}
        if version.start is not None and version.name is not None:
            wanted["source_message"] = version.name
        if wanted["valid_to"] != row.valid_to:
            wanted["expired_at"] = None if wanted["valid_to"] is None else recorded
        changed = {k: v for k, v in wanted.items() if getattr(row, k) != v}
        if changed or row.block_index < 0:
            updates.append((row.block_index, changed))
    return [(block, values) for block, values in updates if values]


def _merge_repeats(versions: Sequence[_Version], texts: dict[int, str]) -> list[tuple[int, int]]:
    """Neighbouring versions (in time order) with the same text, once a version between them is
    gone: (the earlier one, the later one that joins it)."""
    ordered = sorted(versions, key=_in_time)
    merged: list[tuple[int, int]] = []
    keep = ordered[0].row.block_index if ordered else None
    for before, after in itertools.pairwise(ordered):
        if keep is not None and _normal(texts.get(before.row.block_index, "")) == \
                _normal(texts.get(after.row.block_index, "")) and texts.get(after.row.block_index):
            merged.append((keep, after.row.block_index))
        else:
            keep = after.row.block_index
    return merged


def _source_row(block_index: int, statement: Statement, recorded: float) -> FactSourceRow:
    return FactSourceRow(block_index, statement.said_at, statement.message_id, statement.scope_key,
                         statement.external_id, statement.user_id, recorded, statement.author)


class FactStore:
    """L3: writes facts (judging duplicates and conflicts against the subject's current facts),
    seeds lore, repairs interrupted writes, lists and recalls facts under the isolation rule."""

    def __init__(self, memory: Memory, tables: ConversationStore, *, judge: PairJudge | None = None,
                 global_user_facts: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.memory = memory
        self.tables = tables
        self.judge = judge or PairJudge()
        self.global_user_facts = global_user_facts
        self.clock = clock
        # A write reads a subject's versions, decides, then writes: two extractions of one memory at
        # once (two conversations, or an edit's beside a batch's) take turns. Another process's write
        # cannot be made to wait here: the subjects a write read are noted first (`_expect`) and
        # checked in its transaction, and a write that meets another's is decided again (`_retried`).
        self._writing = threading.RLock()
        self._expecting: list[tuple[FactSubject, tuple[Any, ...]]] = []  # under `_writing`
        self.repair()

    # -- writing ------------------------------------------------------------------------------
    def add(self, text: str, *, fact_type: str | FactType, topic: str = "", keywords: Sequence[str] = (),
            guild: str | None = None, user_id: str | None = None, source_message: str | None = None,
            when: float | None = None, lore_key: str | None = None,
            verdict: ModelVerdict | None = None, statement: Statement | None = None) -> FactOutcome:
        """Store a fact about a subject unless it repeats a current one; a fact that changes a
        current one supersedes it. `verdict`: what the extraction model said about it, already
        checked against the facts it was shown (agent/fact_review.py); without one, or when it
        names a fact that is no longer current, the offline judge (`PairJudge`) decides.

        When it was true comes from `statement` (the message that said it, and when), else `when`,
        else now; a statement older than the current version takes its place in the fact's history
        (module docstring). `source_message` names the source when there is no statement."""
        return self._retried(lambda: self._add(
            text, fact_type=fact_type, topic=topic, keywords=keywords, guild=guild, user_id=user_id,
            source_message=source_message, when=when, lore_key=lore_key, verdict=verdict, statement=statement))

    def _retried(self, write: Callable[[], T]) -> T:
        """`write` under this process's lock, and again — reading the subject's facts afresh — while
        another process's write about the same subject lands between its read and its write (two
        workers of one database extracting one user's facts at once stored two current versions
        of one attribute)."""
        with self._writing:
            outer = self._expecting  # a write inside another's (none today) keeps the outer one's subjects
            for attempt in range(1, FACT_WRITE_TRIES + 1):
                self._expecting = []
                try:
                    return write()
                except FactsMovedError:
                    if attempt == FACT_WRITE_TRIES:
                        raise
                    log.info("facts: another process wrote the same subject meanwhile; deciding again")
                finally:
                    self._expecting = outer
            raise AssertionError("unreachable")

    def _expect(self, subject: tuple[FactType, str | None, str | None]) -> None:
        """Note a subject's facts as this write is about to read them: its write stores nothing if
        they changed meanwhile (`FactChanges.expect`)."""
        key: FactSubject = (subject[0].value, subject[1], subject[2])
        if all(known != key for known, _ in self._expecting):
            self._expecting.append((key, self.tables.fact_subject_state(key)))

    def _add(self, text: str, *, fact_type: str | FactType, topic: str, keywords: Sequence[str], guild: str | None,
             user_id: str | None, source_message: str | None, when: float | None, lore_key: str | None,
             verdict: ModelVerdict | None, statement: Statement | None) -> FactOutcome:
        fact_type = self._check_type(fact_type)
        text = clean_text(text, max_chars=MAX_FACT_CHARS, what="fact")
        if not isinstance(topic, str):
            raise InvalidTypeError("fact topic must be a string")
        topic = " ".join(topic.split())[:MAX_TOPIC_CHARS]
        if isinstance(keywords, str) or not all(isinstance(k, str) for k in keywords):
            raise InvalidTypeError("fact keywords must be a list of strings")
        keyword_list = [k.strip() for k in keywords if k.strip()][: self.memory.settings.max_keywords]
        if fact_type == FactType.USER and not user_id:
            raise InvalidInputError("a user fact needs the user id it is about")
        if fact_type == FactType.GUILD and not guild:
            raise InvalidInputError("a guild fact needs its guild id")
        if fact_type == FactType.LORE:
            guild, user_id = LORE_GUILD, None
        elif guild is not None and str(guild).startswith("gieok:"):
            raise InvalidInputError("guild ids starting with 'gieok:' are reserved")
        if fact_type == FactType.GUILD:
            user_id = None
        recorded = self.clock()
        said_at = statement.said_at if statement is not None else (recorded if when is None else when)
        name = statement.name if statement is not None else (str(source_message) if source_message else None)
        self._expect((fact_type, guild, user_id))
        candidates = list(self._subject_facts(fact_type, guild, user_id))
        verdict, note = self._check_verdict(verdict, candidates)
        anchor: FactRow | None = None
        relation = "distinct"
        similarity = 0.0
        judged_by = "offline" if verdict is None else "model"
        if verdict is not None and verdict.action in ("duplicate", "replaces"):
            anchor = next(c[0] for c in candidates if c[0].block_index == verdict.target)
            relation = "duplicate" if verdict.action == "duplicate" else "conflict"
        else:
            pool = candidates if verdict is None else [c for c in candidates if c[0].block_index not in verdict.shown]
            relation, anchor, _, similarity = self._judge_offline(text, pool,
                                                                  same_text=[c for c in candidates if c not in pool])
        new = _NewVersion(text, topic, tuple(keyword_list), name, lore_key)
        subject = (fact_type, guild, user_id)
        if anchor is None:
            return self._write(subject, [], None, new, said_at, recorded, statement, judged_by, note, similarity)
        chain = self._chain_of(subject, anchor.block_index)
        return self._place(subject, chain, anchor, relation, new, said_at, recorded, statement, judged_by, note,
                           similarity)

    def _place(self, subject: tuple[FactType, str | None, str | None], chain: list[FactRow], anchor: FactRow,
               relation: str, new: _NewVersion, said_at: float, recorded: float, statement: Statement | None,
               judged_by: str, note: str | None, similarity: float) -> FactOutcome:
        """A statement about the attribute whose versions are `chain` (oldest first; `anchor`, the
        current one, last): it repeats the version in force when it was said, moves a later one of
        the same value back, or is a new version there — splitting the version in force if that
        one was stated again after it."""
        at = max((i for i, row in enumerate(chain) if row.valid_from <= said_at), default=-1)
        texts = self._texts([row.block_index for row in chain])

        def same(row: FactRow) -> bool:
            if row.block_index == anchor.block_index:
                return relation == "duplicate"
            if _normal(texts.get(row.block_index, "")) == _normal(new.text):
                return True
            vectors = self.memory.vectors_of([row.block_index])
            block = self.memory.store.get_many([row.block_index]).get(row.block_index)
            if block is None:
                return False
            return self._judge_offline(new.text, [(row, block, vectors[0])])[0] == "duplicate"

        if at >= 0 and same(chain[at]):
            return self._write(subject, chain, chain[at], new, said_at, recorded, statement, judged_by, note,
                               similarity)
        if at >= 0:
            in_force = chain[at]
            stated_after = [src for src in self.tables.fact_sources_of([in_force.block_index]).get(
                in_force.block_index, []) if src.said_at > said_at]
            if stated_after:  # said again after this one: the version in force resumes after the new one
                block = self.memory.store.get_many([in_force.block_index])[in_force.block_index]
                split = _NewVersion(block.text, in_force.topic, tuple(block.keywords), stated_after[0].name, None,
                                    resumes=in_force, resumes_at=stated_after[0].said_at)
                return self._write(subject, chain, None, new, said_at, recorded, statement, judged_by, note,
                                   similarity, split=split, replaced=in_force)
        later = chain[at + 1] if at + 1 < len(chain) else None
        if later is not None and same(later):  # the same value, said earlier than known: it starts sooner
            return self._write(subject, chain, later, new, said_at, recorded, statement, judged_by, note, similarity)
        return self._write(subject, chain, None, new, said_at, recorded, statement, judged_by, note, similarity,
                           replaced=chain[at] if at >= 0 else None)

    def _write(self, subject: tuple[FactType, str | None, str | None], chain: list[FactRow], existing: FactRow | None,
               new: _NewVersion, said_at: float, recorded: float, statement: Statement | None, judged_by: str,
               note: str | None, similarity: float, *, split: _NewVersion | None = None,
               replaced: FactRow | None = None) -> FactOutcome:
        """Write a statement: onto `existing` (a duplicate), or as a new version (and the resumed
        copy of a split version); then the chain's intervals again (`_reform`), all in one
        transaction — inside the new blocks' own append when there are new blocks."""
        fact_type, guild, user_id = subject
        changes = FactChanges(expect=list(self._expecting))
        versions: list[_Version] = [_Version(row, None) for row in chain]
        source_of = statement if statement is not None and (statement.name or statement.author) else (
            Statement(said_at, external_id=new.name) if new.name else None)
        if existing is not None:
            target = existing.block_index
            index = next(i for i, v in enumerate(versions) if v.row.block_index == target)
            if source_of is not None:
                changes.sources.append(_source_row(target, source_of, recorded))
            if said_at < existing.valid_from:
                versions[index] = _Version(existing, said_at, new.name)
            changes.updates += _reform(versions, recorded)
            if changes:
                self.tables.facts_apply(changes)
            fresh = self.tables.facts_get([target])[target]
            block = self.memory.store.get_many([target])[target]
            return FactOutcome("duplicate", self._fact(fresh, block), similarity=similarity, judged_by=judged_by,
                               note=note)
        row = FactRow(-1, fact_type.value, new.topic, guild, user_id, new.name, said_at, None, None, new.lore_key,
                      recorded, None)
        changes.inserts.append(row)
        if source_of is not None:
            changes.sources.append(_source_row(-1, source_of, recorded))
        versions.append(_Version(row, None))
        items = [self._block_item(new, subject, said_at, replaced)]
        if split is not None and split.resumes is not None and split.resumes_at is not None:
            resumed = replace(split.resumes, block_index=-2, valid_from=split.resumes_at, valid_to=None,
                              superseded_by=None, source_message=split.name, recorded_at=recorded, expired_at=None,
                              lore_key=None)
            changes.inserts.append(resumed)
            changes.moves.append((split.resumes.block_index, -2, said_at))
            versions.append(_Version(resumed, None))
            items.append(self._block_item(split, subject, split.resumes_at, None))
        changes.updates += _reform(versions, recorded)
        hook = self.tables.facts_hook(changes)
        if len(items) == 1:
            item = items[0]
            written = [self.memory.add(item.pop("text"), **item, within=hook)]
        else:
            written = self.memory.add_many(items, within=hook)
        stored = self.tables.facts_get([b.block_index for b in written])
        fact = self._fact(stored[written[0].block_index], written[0])
        if not fact.current:
            return FactOutcome("history", fact, similarity=similarity, judged_by=judged_by, note=note)
        if replaced is None:
            return FactOutcome("stored", fact, judged_by=judged_by, note=note)
        old = self.tables.facts_get([replaced.block_index])[replaced.block_index]
        old_block = self.memory.store.get_many([old.block_index])[old.block_index]
        return FactOutcome("superseded", fact, replaced=self._fact(old, old_block), similarity=similarity,
                           judged_by=judged_by, note=note)

    def _block_item(self, version: _NewVersion, subject: tuple[FactType, str | None, str | None], said_at: float,
                    replaced: FactRow | None) -> dict[str, Any]:
        fact_type, guild, user_id = subject
        metadata: dict[str, Any] = {"fact_type": fact_type.value, "topic": version.topic, "valid_from": said_at}
        if version.name:
            metadata["source_message"] = version.name
        if replaced is not None:
            metadata["supersedes"] = replaced.block_index
        return {"text": version.text, "kind": "fact", "scope": Scope(guild, None, user_id),
                "event_time": said_at, "importance": 0.8,
                "keywords": list(version.keywords) or self._keywords(version.text), "metadata": metadata}

    def _keywords(self, text: str) -> list[str]:
        """A fact's keywords when none were given: of its words, not of the `<user:ID>` that names
        its subject (which gave every fact the keywords "user" and the id's parts)."""
        return self.memory.tokenizer.keywords(_SUBJECT_REF.sub(" ", text), limit=self.memory.settings.max_keywords)

    def _texts(self, indices: Sequence[int]) -> dict[int, str]:
        return {i: b.text for i, b in self.memory.store.get_many(list(indices)).items()}

    def _chain_of(self, subject: tuple[FactType, str | None, str | None], block_index: int) -> list[FactRow]:
        """The versions of one attribute of a subject, oldest first: the fact `block_index` and every
        fact linked to it by supersession, before and after."""
        rows = {row.block_index: row for row in self.tables.facts_of_subject(subject[0].value, subject[1], subject[2])}
        if block_index not in rows:
            return []
        before = {row.superseded_by: row for row in rows.values() if row.superseded_by is not None}
        chain = [rows[block_index]]
        seen = {block_index}
        while chain[0].block_index in before and before[chain[0].block_index].block_index not in seen:
            chain.insert(0, before[chain[0].block_index])
            seen.add(chain[0].block_index)
        while chain[-1].superseded_by in rows and chain[-1].superseded_by not in seen:
            chain.append(rows[chain[-1].superseded_by])
            seen.add(chain[-1].block_index)
        return chain

    # -- managed by hand (an operator's or agent's key) ----------------------------------------------
    def get(self, block_index: int) -> Fact:
        """One fact (any version) by its block index; NotFoundError when there is none."""
        row = self.tables.facts_get([block_index]).get(block_index)
        block = self.memory.store.get_many([block_index]).get(block_index) if row is not None else None
        if row is None or block is None or block.forgotten:
            raise NotFoundError(f"no fact {block_index}")
        return self._fact(row, block)

    def correct(self, block_index: int, text: str, *, author: str, valid_from: float | None = None) -> FactOutcome:
        """A correction of a fact that was wrong: a new version, valid from when the wrong one was
        (or `valid_from`), takes its place in its history; the wrong one stays there, superseded
        when it began (it was never true) — and who corrected it is the new version's source."""
        text = clean_text(text, max_chars=MAX_FACT_CHARS, what="fact")

        def write() -> FactOutcome:
            wrong = self.get(block_index)
            subject = (self._check_type(wrong.fact_type), wrong.guild, wrong.user_id)
            self._expect(subject)
            chain = self._chain_of(subject, block_index)
            when = wrong.valid_from if valid_from is None else valid_from
            # Its keywords are made from its own text: the wrong version's (its wrong words among
            # them) must not outlive that version's erasure in the right one.
            new = _NewVersion(text, wrong.topic, (), None, None)
            return self._write(subject, chain, None, new, when, self.clock(), Statement(when, author=author),
                               "operator", None, 0.0, replaced=self.tables.facts_get([block_index])[block_index])

        return self._retried(write)

    def remove(self, block_index: int) -> list[int]:
        """Erase one version of a fact (its block forgotten); its history forms again without it."""
        def write() -> list[int]:
            self.get(block_index)
            return self._withdraw((), [block_index])

        return self._retried(write)

    def history(self, block_index: int) -> list[tuple[Fact, list[FactSourceRow]]]:
        """Every version of the fact's attribute, oldest first, each with its statements."""
        fact = self.get(block_index)
        chain = self._chain_of((self._check_type(fact.fact_type), fact.guild, fact.user_id), block_index)
        blocks = self.memory.store.get_many([row.block_index for row in chain])
        sources = self.tables.fact_sources_of([row.block_index for row in chain])
        return [(self._fact(row, blocks[row.block_index]), sources.get(row.block_index, [])) for row in chain
                if row.block_index in blocks and not blocks[row.block_index].forgotten]

    def forget_statements(self, message_ids: Sequence[int]) -> list[int]:
        """What these L1 messages said is withdrawn (their sender edited or deleted them): their
        statements leave every fact; a version left with no statement is erased (its block
        forgotten), and each chain is formed again from what remains — a version between two of
        the same value is gone, and they join. Returns the fact blocks erased."""
        return self._retried(lambda: self._withdraw(message_ids))

    def _withdraw(self, message_ids: Sequence[int], versions: Sequence[int] = ()) -> list[int]:
        """Statements of `message_ids` withdrawn, and `versions` removed whole; each chain they
        were in formed again from what remains. Returns the fact blocks erased."""
        def read() -> tuple[list[FactSourceRow], list[int], dict[int, FactRow]]:
            dropped = self.tables.fact_sources_from(list(message_ids)) if message_ids else []
            affected = sorted({src.block_index for src in dropped} | set(versions))
            return dropped, affected, self.tables.facts_get(affected) if affected else {}

        dropped, affected, rows = read()
        if not affected:
            return []
        for found in rows.values():
            self._expect((FactType(found.fact_type), found.guild, found.user_id))
        dropped, affected, rows = read()  # again, now that their subjects are noted: a change since is caught
        removed = set(versions)
        recorded = self.clock()
        remaining = self.tables.fact_sources_of(affected)
        gone_ids = {src.message_id for src in dropped}
        erased: list[int] = []
        changes = FactChanges(dropped_sources=[(src.block_index, int(src.message_id)) for src in dropped
                                               if src.message_id is not None], expect=list(self._expecting))
        chains: dict[int, list[FactRow]] = {}
        for index in affected:
            row = rows.get(index)
            if row is None:
                continue
            left = [src for src in remaining.get(index, []) if src.message_id not in gone_ids]
            chain = next((c for c in chains.values() if any(r.block_index == index for r in c)), None)
            if chain is None:
                subject = (FactType(row.fact_type), row.guild, row.user_id)
                chain = self._chain_of(subject, index)
                chains[index] = chain
            if not left or index in removed:
                erased.append(index)
        touched = set(affected)
        for chain in {id(c): c for c in chains.values()}.values():
            kept: list[_Version] = []
            for row in chain:
                if row.block_index in erased:
                    continue
                if row.block_index not in touched:
                    kept.append(_Version(row, None))
                    continue
                left = [src for src in remaining.get(row.block_index, []) if src.message_id not in gone_ids]
                kept.append(_Version(row, left[0].said_at, left[0].name))
            texts = self._texts([v.row.block_index for v in kept])
            merged = _merge_repeats(kept, texts)
            for into, gone in merged:
                changes.moves.append((gone, into, float("-inf")))
                erased.append(gone)
            kept = [v for v in kept if v.row.block_index not in {g for _, g in merged}]
            changes.updates += _reform(kept, recorded)
        changes.deletes += erased
        self.tables.facts_apply(changes)
        if erased:
            self.memory.forget(sorted(set(erased)))
        return sorted(set(erased))

    @staticmethod
    def _check_verdict(verdict: ModelVerdict | None, candidates: list[tuple[FactRow, Block, Any]]
                       ) -> tuple[ModelVerdict | None, str | None]:
        """A model's verdict naming a fact that is not (or no longer) a current fact of this
        subject — superseded or forgotten since the model was shown it — is dropped: the
        offline judge decides instead."""
        if verdict is None or verdict.action == "add":
            return verdict, None
        if verdict.action not in ("duplicate", "replaces"):
            return None, f"unknown verdict {verdict.action!r}; judged offline"
        if verdict.target not in {row.block_index for row, _, _ in candidates}:
            return None, f"fact {verdict.target} is not a current fact of this subject; judged offline"
        return verdict, None

    def _judge_offline(self, text: str, pool: list[tuple[FactRow, Block, Any]],
                       same_text: Sequence[tuple[FactRow, Block, Any]] = ()
                       ) -> tuple[str, FactRow | None, Block | None, float]:
        """The offline judge against `pool`: (duplicate | conflict | distinct, the fact it
        concerns, its block, cosine). `same_text` facts are checked for the very same text only
        (the facts a model was shown and said this one does not repeat)."""
        for row, block, _ in same_text:
            if _normal(block.text) == _normal(text):
                return "duplicate", row, block, 1.0
        if not pool:
            return "distinct", None, None, 0.0
        vector = self.memory.embedder.embed_passages([text])[0]
        new_tokens = self.memory.tokenizer.analyze(text, want_keywords=False).tokens
        paraphrase = self.judge.span_test(self.memory.embedder)
        best: tuple[float, FactRow, Block] | None = None
        conflicts: list[tuple[float, FactRow, Block]] = []
        for row, block, old_vector in pool:
            similarity = float(np.dot(vector, old_vector)) if old_vector is not None else 0.0
            old_tokens = self.memory.tokenizer.analyze(block.text, want_keywords=False).tokens
            decision = self.judge.judge(similarity, new_tokens, old_tokens, text, block.text, paraphrase=paraphrase)
            if decision == "duplicate" and (best is None or similarity > best[0]):
                best = (similarity, row, block)
            elif decision == "conflict":
                conflicts.append((similarity, row, block))
        if best is not None:
            return "duplicate", best[1], best[2], best[0]
        if conflicts:
            similarity, row, block = max(conflicts, key=lambda c: c[0])
            return "conflict", row, block, similarity
        return "distinct", None, None, 0.0

    def seed_lore(self, path: str | Path) -> int:
        """Seed lore from a text file (one fact a line; `#` comments; `topic: fact` optional).
        Idempotent: a line already seeded (same text) is skipped. Returns how many were added."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise InvalidInputError(f"lore file not found: {path}") from None
        except UnicodeDecodeError:
            raise InvalidInputError(f"lore file {path} is not UTF-8 text") from None
        seeded = self.tables.lore_keys()
        added = 0
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            topic, _, body = line.partition(":") if re.match(r"^[^:]{1,40}:\s", line) else ("", "", line)
            body = body.strip()
            key = hashlib.sha256(body.encode("utf-8")).hexdigest()[:32]
            if key in seeded:
                continue
            self.add(body, fact_type=FactType.LORE, topic=topic.strip(), lore_key=key)
            seeded.add(key)
            added += 1
        return added

    def repair(self) -> int:
        """Give fact blocks written just before a crash their `facts` row (and apply the
        supersession they recorded). Metadata carries everything but later supersessions."""
        fixed = 0
        for index in self.memory.store.orphan_fact_blocks():
            block = self.memory.store.get_many([index])[index]
            meta = block.metadata
            try:
                fact_type = FactType(meta["fact_type"])
            except (KeyError, ValueError):
                continue
            row = FactRow(index, fact_type.value, str(meta.get("topic", "")), block.scope.guild, block.scope.user,
                          meta.get("source_message"), float(meta.get("valid_from", block.event_time)), None, None,
                          hashlib.sha256(block.text.encode("utf-8")).hexdigest()[:32] if fact_type == FactType.LORE
                          else None)
            self.tables.fact_insert(row, supersede=meta.get("supersedes"), when=row.valid_from)
            fixed += 1
        if fixed:
            log.warning("facts: repaired %d fact row(s) missing after an interrupted write", fixed)
        return fixed

    # -- reading ------------------------------------------------------------------------------
    def current_facts(self, fact_type: str | FactType, guild: str | None, user_id: str | None) -> list[Fact]:
        """The current facts about one subject (a user in a guild, a guild, or the lore), oldest first."""
        return [self._fact(row, block) for row, block, _ in self._subject_facts(self._check_type(fact_type), guild,
                                                                                  user_id)]

    def _subject_facts(self, fact_type: FactType, guild: str | None, user_id: str | None):
        rows = self.tables.facts_current(fact_type.value, guild, user_id)
        blocks = self.memory.store.get_many([r.block_index for r in rows])
        vectors = self.memory.vectors_of([r.block_index for r in rows])
        for row, vector in zip(rows, vectors):
            block = blocks.get(row.block_index)
            if block is not None and not block.forgotten:
                yield row, block, vector

    def _fact(self, row: FactRow, block: Block) -> Fact:
        return Fact(row.block_index, block.text, row.fact_type, row.topic, block.keywords, row.guild, row.user_id,
                    row.source_message, row.valid_from, row.valid_to, row.superseded_by, row.recorded_at,
                    row.expired_at)

    def facts(self, *, user_id: str | None = None, guild: str | None = None, include_history: bool = False,
              limit: int = 1000, as_of: float | None = None, known_at: float | None = None) -> list[Fact]:
        """Facts by user and guild: current ones, or every version (`include_history`); `as_of`
        those true then (the conversation's clock), `known_at` as gieok knew them then."""
        rows = self.tables.facts_where(user_id=user_id, guild=guild, include_history=include_history, limit=limit,
                                       as_of=as_of, known_at=known_at)
        blocks = self.memory.store.get_many([r.block_index for r in rows])
        return [self._fact(r, blocks[r.block_index]) for r in rows
                if r.block_index in blocks and not blocks[r.block_index].forgotten]

    def sources(self, block_indices: Sequence[int]) -> dict[int, list[FactSourceRow]]:
        """Each fact's statements (the messages that said it, and when), earliest first."""
        return self.tables.fact_sources_of(list(block_indices))

    def search_scopes(self, *, guild: str | None, user_id: str | None) -> list[Scope]:
        """The scoped searches that together cover every fact `visible()` allows."""
        scopes = []
        if self.tables.facts_exist(guild=LORE_GUILD):  # a search of an empty scope still costs a search
            scopes.append(Scope(guild=LORE_GUILD))
        if guild is not None and self.tables.facts_exist(guild=guild):
            scopes.append(Scope(guild=guild))
        if (user_id is not None and (guild is None or self.global_user_facts)
                and self.tables.facts_exist(user_id=user_id)):
            scopes.append(Scope(user=user_id))
        return scopes

    def recall(self, query: str, *, guild: str | None, user_id: str | None, k: int = 5,
               history: bool = False) -> list[tuple[Fact, float]]:
        """Facts for a prompt in (guild, user): scoped searches through the coordinator, then
        the isolation rule on every hit. Current facts only, unless `history`: then superseded
        ones that match come too (a question about the past). A superseded hit whose text a
        current fact of the same subject repeats (A, then B, then A again) stands for that current
        fact: the history never hides the present."""
        found: dict[int, tuple[Block, float]] = {}
        for scope in self.search_scopes(guild=guild, user_id=user_id):
            for hit in self.memory.search(query, k=k * 2, scope=scope, kinds="fact"):
                if hit.block.block_index not in found or found[hit.block.block_index][1] < hit.score:
                    found[hit.block.block_index] = (hit.block, hit.score)
        rows = self.tables.facts_get(list(found))
        best: dict[int, tuple[Fact, float]] = {}
        for index, (block, score) in found.items():
            row = rows.get(index)
            if row is None or block.forgotten:
                continue
            if row.valid_to is not None:
                current = self._current_twin(row, block)
                if current is not None:
                    row, block = current
                elif not history:
                    continue
            if visible(row, guild=guild, user_id=user_id, global_user_facts=self.global_user_facts,
                       history=history) and (row.block_index not in best or best[row.block_index][1] < score):
                best[row.block_index] = (self._fact(row, block), score)
        out = sorted(best.values(), key=lambda pair: -pair[1])
        return out[:k]

    def later_versions(self, message_ids: Sequence[int], *, guild: str | None,
                       user_id: str | None) -> dict[int, Fact]:
        """For messages that stated facts since superseded: message → the version that holds now
        (only where a prompt in (guild, user) may see it)."""
        out: dict[int, Fact] = {}
        sources = [src for src in self.tables.fact_sources_from(list(message_ids)) if src.message_id is not None]
        if not sources:
            return out
        rows = self.tables.facts_get(sorted({src.block_index for src in sources}))
        for src in sources:
            row = rows.get(src.block_index)
            if row is None or row.valid_to is None or src.message_id in out:
                continue
            chain = self._chain_of((FactType(row.fact_type), row.guild, row.user_id), row.block_index)
            now = chain[-1] if chain and chain[-1].valid_to is None else None
            if now is None or not visible(now, guild=guild, user_id=user_id, global_user_facts=self.global_user_facts):
                continue
            block = self.memory.store.get_many([now.block_index]).get(now.block_index)
            if block is not None and not block.forgotten and src.message_id is not None:
                out[src.message_id] = self._fact(now, block)
        return out

    def _current_twin(self, row: FactRow, block: Block) -> tuple[FactRow, Block] | None:
        """The current fact of the same chain with the same text as a superseded one, if any."""
        twin = next((r for r in self._chain_of((FactType(row.fact_type), row.guild, row.user_id), row.block_index)
                     if r.valid_to is None), None)
        if twin is None:
            return None
        twin_block = self.memory.store.get_many([twin.block_index]).get(twin.block_index)
        if twin_block is None or twin_block.forgotten or _normal(twin_block.text) != _normal(block.text):
            return None
        return twin, twin_block

    def forget_user(self, user_id: str) -> list[int]:
        """Erase every fact about a user (all guilds, history included)."""
        rows = self.tables.facts_where(user_id=user_id, include_history=True, limit=1_000_000)
        indices = [r.block_index for r in rows]
        if not indices:
            return []
        erased = self.memory.forget(indices)
        self.tables.facts_delete_blocks(indices)
        return erased

    @staticmethod
    def _check_type(value: str | FactType) -> FactType:
        try:
            return FactType(value)
        except ValueError:
            raise InvalidInputError(f"fact type must be user_fact, guild_fact or lore, got {value!r}") from None

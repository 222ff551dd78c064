"""L3: facts — blocks of kind `fact` about a user, a guild, or the bot's world (lore).

A fact is written as a block (so it is searchable, hash-chained and erasable like any
other) plus a row in the `facts` table that holds what may change later: `valid_to` and
`superseded_by`. A newer fact that contradicts an older one about the same subject
supersedes it; the old one is kept for history and never silently deleted.

Isolation is a rule, not a convention: `visible()` decides whether a fact may reach a
prompt in (guild, user), and every recall passes through it, on top of the scoped searches.
- lore: everywhere;
- guild facts: only in their guild;
- user facts: in the guild where they were stated, and in DMs with that user; in other
  guilds only when `global_user_facts` is configured.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidInputError, InvalidTypeError
from ...store.conversation import ConversationStore, FactRow
from ...types import Block, Scope
from ...validate import clean_text
from .fact_align import Paraphrase, judge_shapes, shape_of

if TYPE_CHECKING:
    from ...memory import Memory

__all__ = ["FactType", "Fact", "FactOutcome", "FactStore", "ModelVerdict", "PairJudge", "visible", "LORE_GUILD"]

log = logging.getLogger(__name__)

LORE_GUILD = "gieok:lore"  # lore blocks' scope; guild ids from a transport may not start with "gieok:"
MAX_FACT_CHARS = 1000
MAX_TOPIC_CHARS = 80


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

    @property
    def current(self) -> bool:
        return self.valid_to is None

    def as_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v)
                for name, v in ((n, getattr(self, n)) for n in self.__slots__)}


@dataclass(frozen=True, slots=True)
class FactOutcome:
    action: str  # stored | duplicate | superseded (stored, and replaced an older fact)
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


def visible(row: FactRow, *, guild: str | None, user_id: str | None, global_user_facts: bool = False) -> bool:
    """May this fact reach a prompt in `guild` (None = a DM) for `user_id`?"""
    if row.valid_to is not None:
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
    So the decision is made on the tokens (layers/fact_align.py): the two facts are aligned and
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
        self.repair()

    # -- writing ------------------------------------------------------------------------------
    def add(self, text: str, *, fact_type: str | FactType, topic: str = "", keywords: Sequence[str] = (),
            guild: str | None = None, user_id: str | None = None, source_message: str | None = None,
            when: float | None = None, lore_key: str | None = None,
            verdict: ModelVerdict | None = None) -> FactOutcome:
        """Store a fact about a subject unless it repeats a current one; a fact that changes a
        current one supersedes it. `verdict`: what the extraction model said about it, already
        checked against the facts it was shown (agent/fact_review.py); without one, or when it
        names a fact that is no longer current, the offline judge (`PairJudge`) decides."""
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
        now = self.clock() if when is None else when
        candidates = list(self._subject_facts(fact_type, guild, user_id))
        verdict, note = self._check_verdict(verdict, candidates)
        if verdict is not None and verdict.action == "duplicate":
            row, block, _ = next(c for c in candidates if c[0].block_index == verdict.target)
            return FactOutcome("duplicate", self._fact(row, block), judged_by="model")
        if verdict is not None and verdict.action == "replaces":
            replaced: FactRow | None = next(c[0] for c in candidates if c[0].block_index == verdict.target)
            similarity, judged_by = 0.0, "model"
        else:
            pool = candidates if verdict is None else [c for c in candidates if c[0].block_index not in verdict.shown]
            found = self._judge_offline(text, pool, same_text=[c for c in candidates if c not in pool])
            if found[0] == "duplicate" and found[1] is not None and found[2] is not None:
                return FactOutcome("duplicate", self._fact(found[1], found[2]), similarity=found[3], note=note)
            replaced, similarity = found[1], found[3]
            judged_by = "model" if verdict is not None else "offline"
        metadata: dict[str, Any] = {"fact_type": fact_type.value, "topic": topic, "valid_from": now}
        if source_message:
            metadata["source_message"] = str(source_message)
        if replaced is not None:
            metadata["supersedes"] = replaced.block_index
        block = self.memory.add(text, kind="fact", scope=Scope(guild, None, user_id), event_time=now, importance=0.8,
                                keywords=keyword_list or None, metadata=metadata)
        row = FactRow(block.block_index, fact_type.value, topic, guild, user_id,
                      str(source_message) if source_message else None, now, None, None, lore_key)
        self.tables.fact_insert(row, supersede=replaced.block_index if replaced else None, when=now)
        fact = self._fact(row, block)
        if replaced is None:
            return FactOutcome("stored", fact, judged_by=judged_by, note=note)
        old = self.tables.facts_get([replaced.block_index])[replaced.block_index]
        old_block = self.memory.store.get_many([old.block_index])[old.block_index]
        return FactOutcome("superseded", fact, replaced=self._fact(old, old_block), similarity=similarity,
                           judged_by=judged_by, note=note)

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
                    row.source_message, row.valid_from, row.valid_to, row.superseded_by)

    def facts(self, *, user_id: str | None = None, guild: str | None = None, include_history: bool = False,
              limit: int = 1000) -> list[Fact]:
        rows = self.tables.facts_where(user_id=user_id, guild=guild, include_history=include_history, limit=limit)
        blocks = self.memory.store.get_many([r.block_index for r in rows])
        return [self._fact(r, blocks[r.block_index]) for r in rows
                if r.block_index in blocks and not blocks[r.block_index].forgotten]

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

    def recall(self, query: str, *, guild: str | None, user_id: str | None, k: int = 5) -> list[tuple[Fact, float]]:
        """Facts for a prompt in (guild, user): scoped searches through the coordinator, then
        the isolation rule and validity on every hit."""
        found: dict[int, tuple[Block, float]] = {}
        for scope in self.search_scopes(guild=guild, user_id=user_id):
            for hit in self.memory.search(query, k=k * 2, scope=scope, kinds="fact"):
                if hit.block.block_index not in found or found[hit.block.block_index][1] < hit.score:
                    found[hit.block.block_index] = (hit.block, hit.score)
        rows = self.tables.facts_get(list(found))
        out = []
        for index, (block, score) in found.items():
            row = rows.get(index)
            if row is None or block.forgotten:
                continue
            if visible(row, guild=guild, user_id=user_id, global_user_facts=self.global_user_facts):
                out.append((self._fact(row, block), score))
        out.sort(key=lambda pair: -pair[1])
        return out[:k]

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

"""What a prompt holds, gathered in one place: the bot's reply (`ContextBuilder.build`) and an
agent's context (`agents.assemble_context`) render the same `Gathered`, so what goes into a
prompt — and how time, history and warnings are marked on it — is decided once.

- **facts**: the current facts the prompt may see (`FactStore.recall` under the isolation rule),
  best first; superseded versions too when the query asks about the past ("민지 부산에 살았어?",
  "where did Alex work before?") or names what only the old version names ("부산" when 민지 lives in
  서울 now), each with its period. A repeated text (A → B → A) always stands for its current
  version. Current facts come first, so a renderer that fills a budget in order keeps them.
- **recalled turns**: older turns of the conversation found by hybrid search, each with its
  speaker, its time, whether the guard flagged it, and — when a fact it stated has been
  superseded since — the fact that holds now, so a recalled "나 부산으로 이사 가" is read as older
  than "민지는 서울에 산다". When the query asks about time ("언제", "when", "지난달"), their relative
  dates are to be shown resolved (`about_time`): on LoCoMo, resolving every recalled turn's dates
  cost recall at a fixed budget (their tokens pushed evidence out), and a question that is not about
  time gains nothing from them.
- **summary** (L2), **recent messages** (L1, with their flags) and, for the bot, **working memory**
  (with each slot's speaker and flag).

Nothing here builds a classifier or a guard: an agent's context request reads, it never judges.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from ...errors import GieokError
from ...retrieval.passages import speaker_name_of
from ...store.conversation import L1Row
from ...text.dates import asks_when, question_dates
from ...types import Scope, scope_key
from ...validate import check_speaker_names
from ..conversation.facts import Fact
from ..conversation.memory import ConversationMemory
from .context import RecentLine

__all__ = ["KnownFact", "RecalledTurn", "LaterFact", "WorkingLine", "Gathered", "ContextGatherer",
           "asks_about_past", "speaker_names", "display_name"]

# A question about the past: a past tense, or words that point back ("before", "예전에").
_PAST_EN = re.compile(r"\b(?:used to|before|previous(?:ly)?|former(?:ly)?|earlier|originally|back then|in the past|"
                      r"no longer|any ?more|did|was|were|had|ago|last (?:year|month|week|time))\b", re.I)
_PAST_KO = re.compile(r"전에|예전|옛날|원래|과거|이전|그때|그 때|지난|살았|했었|였었|었었|았었|였던|었던|았던|"
                      r"(?:[았었였했])(?:어|니|나|냐|지|는지|을까|던가|더라|습니까|어요|나요|다)")


def asks_about_past(query: str) -> bool:
    """Whether a question reads as being about the past (a past tense, "before", "예전에" …): then
    superseded facts may answer it."""
    return bool(_PAST_EN.search(query) or _PAST_KO.search(query))


@dataclass(frozen=True)
class KnownFact:
    text: str
    fact_type: str
    user: str | None
    guild: str | None
    valid_from: float
    valid_to: float | None
    score: float
    block_index: int

    @property
    def current(self) -> bool:
        return self.valid_to is None


@dataclass(frozen=True)
class LaterFact:
    """The fact that holds now, where a recalled turn stated one that has been superseded."""

    text: str
    since: float


@dataclass(frozen=True)
class RecalledTurn:
    text: str
    speaker: str | None
    name: str | None
    time: float
    score: float
    block_index: int
    kind: str
    role: str
    flagged: bool = False  # the guard flagged it when it was said
    later: LaterFact | None = None  # a fact it stated was superseded by this one


@dataclass(frozen=True)
class WorkingLine:
    """A working-memory slot as a prompt shows it: its text, who said it, and its flag."""

    content: str
    speaker: str | None
    name: str | None
    flagged: bool = False
    role: str = "user"


@dataclass
class Gathered:
    conversation: Scope
    exists: bool  # the conversation has messages, a summary or a schedule here
    query: str
    facts: list[KnownFact] = field(default_factory=list)
    recalled: list[RecalledTurn] = field(default_factory=list)
    summary_parts: dict[str, list[str]] | None = None
    recent: list[RecentLine] = field(default_factory=list)
    working: list[WorkingLine] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # user id → display name, from L1
    # the query asks when, or names a time: recalled turns' relative dates are worth their tokens, resolved
    about_time: bool = False
    warnings: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


class ContextGatherer:
    """Gathers a prompt's parts from one conversation memory (module docstring)."""

    def __init__(self, conversation: ConversationMemory) -> None:
        self.conversation = conversation
        self.memory = conversation.memory
        self.settings = conversation.settings
        self.facts = conversation.facts
        self.tables = conversation.tables
        self.zone = ZoneInfo(self.settings.timezone)

    def recent_rows(self, conversation: Scope, limit: int | None = None) -> list[L1Row]:
        return self.conversation.l1.recent(conversation, limit)

    def gather(self, conversation: Scope, *, query: str, user: str | None, guild: str | None,
               parts: Collection[str] = ("facts", "summary", "recalled", "recent"), facts_k: int = 5,
               turns_k: int = 5, rows: Sequence[L1Row] | None = None, names: Mapping[str, str] | None = None,
               shown_blocks: Collection[int] = (), working: bool = False) -> Gathered:
        """The parts asked for. `rows`: the recent messages (default: L1's newest `l1_size`);
        `names`: user id → display name for the search (default: from `rows`); `shown_blocks`:
        turn blocks the prompt shows already (not recalled again); `working`: the working-memory
        slots too (the bot's prompt)."""
        timings: dict[str, float] = {}
        t = time.perf_counter()
        if rows is None:
            rows = self.recent_rows(conversation)
        names = dict(names) if names is not None else speaker_names(rows)
        out = Gathered(conversation, bool(rows) or self._known(conversation), query, names=names)
        out.recent = [RecentLine(r.role, r.content, r.user_id, r.display_name, r.created_at, r.block_index, r.flagged)
                      for r in rows]
        timings["l1_ms"] = (time.perf_counter() - t) * 1000
        if "facts" in parts and query:
            t = time.perf_counter()
            out.facts = self._facts(query, guild=guild, user=user, k=facts_k)
            timings["facts_ms"] = (time.perf_counter() - t) * 1000
        if "recalled" in parts and query:
            t = time.perf_counter()
            out.about_time = asks_when(query) or bool(question_dates(query, time.time(), self.zone))
            out.recalled = self._turns(conversation, query, guild=guild, user=user, k=turns_k, names=names,
                                       shown=set(shown_blocks))
            timings["search_ms"] = (time.perf_counter() - t) * 1000
        if "summary" in parts:
            t = time.perf_counter()
            summaries = self.conversation.summaries
            out.summary_parts = summaries.get(conversation).context_lines(summaries.global_core)
            timings["summary_ms"] = (time.perf_counter() - t) * 1000
        if working:
            out.working = [WorkingLine(slot.content, _str(slot.metadata.get("speaker")),
                                       names.get(_str(slot.metadata.get("speaker")) or ""),
                                       bool(slot.metadata.get("flagged")), str(slot.metadata.get("role") or "user"))
                           for slot in self.memory.working.slots(conversation)]
        out.timings_ms = timings
        return out

    def _known(self, conversation: Scope) -> bool:
        key = scope_key(conversation)
        return self.tables.channel_state(key) is not None or self.tables.summary_load(key) is not None

    def elsewhere(self, conversation: Scope) -> list[Scope]:
        """Other conversations with the same channel id (another guild, or none): where a request
        that named the wrong guild meant to look."""
        return [scope for scope in self.tables.conversations_of_channel(str(conversation.channel))
                if scope != conversation]

    # -- facts -------------------------------------------------------------------------------
    def _facts(self, query: str, *, guild: str | None, user: str | None, k: int) -> list[KnownFact]:
        found = self.facts.recall(query, guild=guild, user_id=user, k=k * 2, history=True)
        current = [(f, s) for f, s in found if f.current][:k]
        old = [(f, s) for f, s in found if not f.current and not f.never_held]  # a corrected one was never so
        if old and not asks_about_past(query):
            old = [(f, s) for f, s in old if self._names_what_only_it_names(query, f)]
        return [KnownFact(f.text, f.fact_type, f.user_id, f.guild, f.valid_from, f.valid_to, score, f.block_index)
                for f, score in [*current, *old[:k]]]

    def _names_what_only_it_names(self, query: str, fact: Fact) -> bool:
        """Does the query name something this superseded fact says and the version after it does
        not ("부산" of "민지는 부산에 산다" when she lives in 서울 now)?"""
        later = ""
        if fact.superseded_by is not None:
            block = self.memory.store.get_many([fact.superseded_by]).get(fact.superseded_by)
            later = block.text if block is not None else ""
        tokenizer = self.memory.tokenizer
        own = set(tokenizer.analyze(fact.text, want_keywords=False).tokens)
        newer = set(tokenizer.analyze(later, want_keywords=False).tokens) if later else set()
        asked = set(tokenizer.analyze(query, want_keywords=False).tokens)
        return bool((own - newer) & asked)

    # -- recalled turns ------------------------------------------------------------------------
    def _turns(self, conversation: Scope, query: str, *, guild: str | None, user: str | None, k: int,
               names: Mapping[str, str], shown: set[int]) -> list[RecalledTurn]:
        hits = self.memory.search(query, k=k, scope=conversation, kinds=("turn", "note"), speaker_names=names)
        # A scope's unset guild matches any guild in a search: a direct conversation named like a
        # guild's channel ("cafe") must not recall that channel's turns.
        kept = [hit for hit in hits if hit.block.block_index != 0 and hit.block.block_index not in shown
                and hit.block.scope.guild == conversation.guild]
        messages = {hit.block.block_index: int(m) for hit in kept
                    if isinstance(m := hit.block.metadata.get("l1_message"), int) and not isinstance(m, bool)}
        later = self.facts.later_versions(list(messages.values()), guild=guild, user_id=user) if messages else {}
        turns = []
        for hit in kept:
            block = hit.block
            role = str(block.metadata.get("role", "user"))
            speaker = block.speaker or _str(block.metadata.get("speaker"))
            now_true = later.get(messages.get(block.block_index, -1))
            turns.append(RecalledTurn(block.text, speaker if role == "user" else None,
                                      names.get(speaker or "") or speaker_name_of(block.metadata), block.event_time,
                                      hit.score, block.block_index, block.kind, role,
                                      bool(block.metadata.get("flagged")),
                                      LaterFact(now_true.text, now_true.valid_from) if now_true else None))
        return turns


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def speaker_names(rows: Sequence[L1Row]) -> dict[str, str]:
    """User id → display name from L1 rows, the newest accepted name winning (each distinct name
    checked once: 50 rows usually hold two or three speakers)."""
    checked: dict[tuple[str, str], str | None] = {}
    names: dict[str, str] = {}
    for row in rows:
        if row.user_id and row.display_name:
            pair = (row.user_id, row.display_name)
            if pair not in checked:
                checked[pair] = display_name(*pair)
            if (name := checked[pair]) is not None:
                names[row.user_id] = name
    return names


def display_name(user_id: str, name: str) -> str | None:
    """The display name as a search accepts it; one it would refuse (blank, control characters)
    is left out rather than failing the reply."""
    try:
        return check_speaker_names({user_id: name})[user_id]
    except GieokError:
        return None

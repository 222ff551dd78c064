"""The conversation memory for any agent: the two calls an agent on any framework makes.

- `add_messages`: an agent's conversation, a batch of messages at a time, each named by the
  sender's id, stored as the bot stores its own (L1, turn blocks with speaker and position,
  working memory) through the same pipeline — a message id seen before is not stored again;
  flagged messages are stored, marked, and kept out of fact extraction; L2 summaries and L3 facts
  are updated in the background when a model is configured.
- `context`: what to put in the next prompt — the user's facts (and the guild's and lore) with
  their validity, the L2 summary, recalled older turns, the recent messages — within a token
  budget, as structured parts and as one ready-to-use text block in the conversation's language.

The message and context shapes (`MessageIn`, `AgentContext`) are what the REST routes and the MCP
tools carry; the pipeline methods behind them are `ConversationPipeline.add_messages` / `context`.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from ...errors import InvalidInputError, InvalidTypeError
from ...types import Scope
from ...validate import check_message_time, clean_text
from ..conversation.memory import DOT_SEGMENTS, check_id
from ..conversation.recent import conversation_of
from .context import (
    MARKS,
    Section,
    TokenTally,
    day_of,
    estimate_tokens,
    fact_period,
    items_section,
    local_time,
    marked_text,
    recent_section,
    summary_section,
)
from .gather import ContextGatherer, Gathered, KnownFact, RecalledTurn

__all__ = ["MessageIn", "StoredMessage", "Ingested", "AgentContext", "PARTS", "MAX_MESSAGES", "INDEX_MODES",
           "check_messages",
           "assemble_context", "agent_context", "language_of", "MIN_BUDGET", "MAX_BUDGET", "KnownFact", "RecalledTurn"]

MAX_MESSAGES = 256  # one request's batch; checked whole before anything is written
MAX_MESSAGE_ID = 200
MAX_NAME = 100
PARTS = ("facts", "summary", "recalled", "recent")
# add_messages: the turn blocks written before the answer ("now") or in the background ("behind")
INDEX_MODES = ("now", "behind")
MIN_BUDGET, MAX_BUDGET = 100, 32_000
# How a budget is shared when every part has something to say: the summary, the facts and the
# recent messages up to these shares, in that order; recalled turns take what is left, and
# whatever a part does not use goes on to the next.
SHARES = {"summary": 0.15, "facts": 0.2, "recent": 0.25}
HEADERS = {
    "ko": {"facts": "알고 있는 사실", "summary": "대화 요약", "recalled": "관련된 예전 대화", "recent": "최근 대화",
           "core": "바뀌지 않는 사실", "you": "나", "speakers": "말한 사람", **MARKS["ko"]},
    "en": {"facts": "Known facts", "summary": "Conversation summary", "recalled": "Related earlier messages",
           "recent": "Recent messages", "core": "Facts that never change", "you": "you", "speakers": "Speakers",
           **MARKS["en"]},
}
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_LATIN = re.compile(r"[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LETTERS = re.compile(r"[A-Za-z\uac00-\ud7a3]")


@dataclass(frozen=True)
class MessageIn:
    """One message of an agent's conversation. `id` is the sender's: it makes a retry harmless."""

    id: str
    role: str  # user | assistant
    text: str
    user: str | None = None  # who wrote it (a user's id); required for role user
    name: str | None = None  # their display name (kept in L1 only, never in facts)
    time: float | None = None  # when it was written (epoch seconds); None: now


@dataclass(frozen=True)
class StoredMessage:
    id: str
    role: str
    l1_id: int
    block_index: int | None
    flagged: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "l1_id": self.l1_id, "block_index": self.block_index,
                "flagged": self.flagged}


@dataclass
class Ingested:
    """What `add_messages` stored: the new messages, the ids seen before (sent again unchanged),
    the ids sent again with another text (`edited`: the message is replaced), the flagged ones,
    whether summaries and facts follow (a model is configured) and were started now, when the turn
    blocks are written (`index`: "now", each message's `block_index` given; "behind", null until
    written in the background), and where the time went (`timings_ms`)."""

    conversation: dict[str, str | None]
    stored: list[StoredMessage]
    duplicates: list[str]
    summaries_and_facts: str
    extraction: str
    edited: list[StoredMessage] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)  # per stage (docs/agents.md), and total_ms
    index: str = "now"

    def as_dict(self) -> dict[str, Any]:
        return {"conversation": self.conversation, "stored": [m.as_dict() for m in self.stored],
                "duplicates": self.duplicates, "edited": [m.as_dict() for m in self.edited],
                "flagged": [m.id for m in (*self.stored, *self.edited) if m.flagged],
                "summaries_and_facts": self.summaries_and_facts, "extraction": self.extraction, "index": self.index,
                "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()}}


@dataclass
class AgentContext:
    """The context for an agent's next reply: `parts` (structured), `text` (one block to paste
    into a system prompt), `tokens` per part, and where the time went."""

    conversation: dict[str, str | None] | None  # None: gieok has never seen this conversation (`warnings` say so)
    query: str
    language: str
    parts: dict[str, Any]
    text: str
    tokens: dict[str, int]
    budget_tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"conversation": self.conversation, "query": self.query, "language": self.language,
                "parts": self.parts, "text": self.text, "tokens": self.tokens, "budget_tokens": self.budget_tokens,
                "warnings": self.warnings, "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()}}


# -- checking what comes in ------------------------------------------------------------------------

def _text_field(value: Any, what: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip() or len(value) > limit or _CONTROL.search(value):
        raise InvalidInputError(f"{what} must be 1–{limit} characters without control characters")
    return value.strip()


def check_messages(messages: Sequence[Any], max_text_chars: int, zone: tzinfo = UTC,
                   now: float | None = None) -> list[MessageIn]:
    """Every message checked before anything is written; the first problem names its position.
    Dicts (the JSON shape: id, role, text, user, name, time) or `MessageIn`s. A time without a
    zone is read in `zone`; a time that cannot be a message's (`check_message_time`) is refused."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidTypeError("messages must be a list")
    if not messages:
        raise InvalidInputError("messages is empty: send at least one message")
    if len(messages) > MAX_MESSAGES:
        raise InvalidInputError(f"{len(messages)} messages in one request; the limit is {MAX_MESSAGES} "
                                "(send the rest in another request)")
    checked: list[MessageIn] = []
    seen: set[str] = set()
    for position, raw in enumerate(messages):
        try:
            fields = raw.__dict__ if isinstance(raw, MessageIn) else raw
            if not isinstance(fields, Mapping):
                raise InvalidTypeError(f"a message must be an object, not {type(raw).__name__}")
            unknown = set(fields) - {"id", "role", "text", "user", "name", "time"}
            if unknown:
                raise InvalidInputError(f"unknown field(s) {sorted(unknown)}")
            message_id = _text_field(fields.get("id"), "id", MAX_MESSAGE_ID)
            if message_id in DOT_SEGMENTS:
                raise InvalidInputError(f"id {message_id!r} cannot be a message's id (it is a path's . or ..: "
                                        "DELETE /v1/conversations/messages/{id} could not name it)")
            if message_id is None:
                raise InvalidInputError("id is missing: every message needs the sender's id for it "
                                        "(a retry with the same id is then stored once)")
            if message_id in seen:
                raise InvalidInputError(f"id {message_id!r} appears twice in this request")
            seen.add(message_id)
            role = fields.get("role")
            if role not in ("user", "assistant"):
                raise InvalidInputError(f"role must be 'user' or 'assistant', got {role!r}")
            text = clean_text(fields.get("text"), max_chars=max_text_chars, setting="max_text_chars")
            user = check_id(fields.get("user"), "user", optional=True)
            if role == "user" and user is None:
                raise InvalidInputError("user is missing: a user's message names who wrote it")
            name = _text_field(fields.get("name"), "name", MAX_NAME)
            when = check_message_time(fields.get("time"), "time", zone=zone, now=now)
            checked.append(MessageIn(message_id, role, text, user, name, when))
        except (InvalidInputError, InvalidTypeError) as exc:
            raise type(exc)(f"message {position}: {exc}") from None
    return checked


def check_budget(budget_tokens: Any) -> int:
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
        raise InvalidTypeError("budget_tokens must be an integer")
    if not MIN_BUDGET <= budget_tokens <= MAX_BUDGET:
        raise InvalidInputError(f"budget_tokens must be {MIN_BUDGET}–{MAX_BUDGET:,}, got {budget_tokens}")
    return budget_tokens


def check_include(include: Any) -> tuple[str, ...]:
    if include is None:
        return PARTS
    if isinstance(include, str) or not isinstance(include, Sequence):
        raise InvalidTypeError("include must be a list of part names")
    unknown = [part for part in include if part not in PARTS]
    if unknown or not include:
        raise InvalidInputError(f"include names parts among {', '.join(PARTS)}; got {list(include)!r}")
    return tuple(part for part in PARTS if part in include)


# -- putting the context together ------------------------------------------------------------------

def language_of(texts: Sequence[str]) -> str:
    """`ko` when Hangul carries a good share of the conversation's letters, else `en`."""
    joined = " ".join(texts)
    hangul, latin = len(_HANGUL.findall(joined)), len(_LATIN.findall(joined))
    return "ko" if hangul and hangul * 3 >= latin else "en"


# A context writes every recalled turn's time twice (its line's date, its part's ISO time): 160
# conversions with a time zone for 80 turns, a third of the assembly. Turns recur from call to call.
@functools.lru_cache(maxsize=8192)
def _iso(epoch: float | None, zone: ZoneInfo) -> str | None:
    local = local_time(epoch, zone)
    return None if local is None else local.isoformat(timespec="seconds")


def agent_context(gatherer: ContextGatherer, guild: str | None, channel: str, *, user: str | None = None,
                  query: str | None = None, budget_tokens: int = 2000, include: Sequence[str] | None = None,
                  zone: ZoneInfo, assistant_name: str) -> AgentContext:
    """What to put in an agent's next prompt: the user's facts (isolation rules as for the bot),
    the summary, recalled older turns and the recent messages, within the budget. A conversation
    gieok has never seen answers `conversation: None` with a warning that names where it looked
    (and where a conversation with that channel id is)."""
    started = time.perf_counter()
    conversation = conversation_of(check_id(guild, "guild", optional=True), str(check_id(channel, "channel")))
    user = check_id(user, "user", optional=True)
    budget_tokens, parts = check_budget(budget_tokens), check_include(include)
    s = gatherer.settings
    t = time.perf_counter()
    rows = gatherer.recent_rows(conversation, s.l1_size)
    if query is None:
        last = next((r for r in reversed(rows) if r.role == "user" and (user is None or r.user_id == user)), None)
        query = last.content if last is not None else ""
    query = clean_text(query, max_chars=s.max_text_chars, what="query", setting="max_text_chars") if query else ""
    read_ms = (time.perf_counter() - t) * 1000
    # The message the query is (an agent asks with what the user just said, stored a moment before)
    # is the question, not an earlier message to recall: without the recent part (a session that
    # gives the model its own history) it came back as the top "related earlier message".
    asked = [r.block_index for r in rows if r.role == "user" and r.block_index is not None
             and r.content.strip() == query.strip()] if query else []
    gathered = gatherer.gather(conversation, query=query, user=user, guild=conversation.guild, parts=parts,
                               facts_k=max(s.recall_k, budget_tokens // 100),
                               turns_k=min(100, max(s.recall_k, budget_tokens // 25)), rows=rows,
                               shown_blocks=asked)
    t = time.perf_counter()
    context = assemble_context(gathered, budget_tokens=budget_tokens, include=parts, zone=zone,
                               assistant_name=assistant_name)
    if not gathered.exists:
        context.conversation = None
        context.warnings.append(_unknown_conversation(conversation, gatherer.elsewhere(conversation)))
    timings = {"l1_ms": read_ms + gathered.timings_ms.pop("l1_ms", 0.0), **gathered.timings_ms}
    timings["assemble_ms"] = (time.perf_counter() - t) * 1000
    timings["total_ms"] = (time.perf_counter() - started) * 1000
    context.timings_ms = timings
    return context


def _unknown_conversation(conversation: Scope, elsewhere: Sequence[Scope]) -> str:
    where = f"channel {conversation.channel!r} " + (f"in guild {conversation.guild!r}" if conversation.guild
                                                     else "without a guild")
    said = f"no conversation {where} has been stored in this memory"
    if elsewhere:
        guilds = ", ".join(repr(s.guild) if s.guild else "no guild" for s in elsewhere[:5])
        said += f"; channel {conversation.channel!r} exists with guild {guilds}: pass that guild"
    return said


def assemble_context(gathered: Gathered, *, budget_tokens: int, include: Sequence[str], zone: ZoneInfo,
                     assistant_name: str) -> AgentContext:
    """The context within `budget_tokens` (the module docstring: what goes where). Whole items are
    kept or dropped as the bot's prompt does (context.py); a recalled turn already among the
    recent messages is not repeated."""
    where = gathered.conversation
    conversation: dict[str, str | None] = {"guild": where.guild, "channel": where.channel}
    query, facts, recalled, recent = gathered.query, gathered.facts, gathered.recalled, gathered.recent
    summary_parts = gathered.summary_parts
    language = language_of([query]) if _LETTERS.search(query) else language_of([line.content for line in recent[-8:]])
    h = HEADERS[language]
    left = budget_tokens
    text_parts: dict[str, str] = {}
    parts: dict[str, Any] = {}
    tokens: dict[str, int] = {}

    def spend(name: str, section: Section) -> None:
        nonlocal left
        block = f"# {h[name]}\n{section.text}"
        text_parts[name] = block
        tokens[name] = estimate_tokens(block)
        left -= tokens[name] + 1

    def share(name: str) -> int:
        header = estimate_tokens(f"# {h[name]}\n") + 1
        return max(0, min(left, int(budget_tokens * SHARES.get(name, 1.0))) - header)

    if "summary" in include and summary_parts and any(summary_parts.get(k) for k in ("core", "ongoing", "points")):
        section = summary_section(summary_parts, share("summary"), {"core": h["core"]})
        if section.text:
            spend("summary", section)
            parts["summary"] = {"text": section.text, "kept": section.kept, "dropped": section.dropped}
    if "facts" in include and facts:
        lines = [f"- {fact.text} {fact_period(fact.valid_from, fact.valid_to, zone, language)}" for fact in facts]
        section, kept = items_section("facts", lines, share("facts"))
        if kept:
            spend("facts", section)
            parts["facts"] = [_fact_dict(facts[i], zone) for i in kept]
    shown_blocks: set[int] = set()
    if "recent" in include and recent:
        budget = share("recent") if "recalled" in include else max(0, left - estimate_tokens(f"# {h['recent']}\n") - 1)
        section, count = recent_section(recent, budget, zone, assistant_name, {"you": h["you"]}, "%Y-%m-%d %H:%M")
        if count:
            spend("recent", section)
            parts["recent"] = [{"role": line.role, "text": line.content, "user": line.user_id,
                                "name": line.display_name, "time": _iso(line.created_at, zone),
                                **({"flagged": True} if line.flagged else {})}
                               for line in recent[len(recent) - count:]]
            shown_blocks = {line.block_index for line in recent[len(recent) - count:] if line.block_index is not None}
    if "recalled" in include and recalled:
        fresh = [turn for turn in recalled if turn.block_index not in shown_blocks]
        # Each speaker's id once, in a legend, instead of on every line: a third of a turn's tokens
        # went to "(<user:…>)". A name two speakers share keeps the id on its lines.
        named = _named_speakers(fresh)
        reserve = estimate_tokens(f"# {h['recalled']}\n") + 1 + estimate_tokens(_legend(named, h)) + 1
        section, kept = _recalled_section(fresh, zone, assistant_name, named, max(0, left - reserve), language,
                                          gathered.about_time)
        if kept:
            legend = _legend({turn.name: turn.speaker for turn in (fresh[i] for i in kept)
                              if turn.name and turn.speaker and named.get(turn.name) == turn.speaker}, h)
            text = f"{legend}\n{section.text}" if legend else section.text
            spend("recalled", Section(section.name, text, estimate_tokens(text), kept=section.kept,
                                      dropped=section.dropped))
            parts["recalled"] = [_turn_dict(fresh[i], zone) for i in kept]
    # The text reads best in this order: what is known, what the conversation is about, what was
    # said before, what was said just now.
    text = "\n\n".join(text_parts[name] for name in ("facts", "summary", "recalled", "recent") if name in text_parts)
    tokens = {name: tokens.get(name, 0) for name in include}  # every part asked for, 0 when it had nothing
    tokens["total"] = estimate_tokens(text)
    return AgentContext(conversation, query, language, parts, text, tokens, budget_tokens)


def _fact_dict(fact: KnownFact, zone: ZoneInfo) -> dict[str, Any]:
    return {"text": fact.text, "type": fact.fact_type, "user": fact.user, "guild": fact.guild,
            "valid_from": _iso(fact.valid_from, zone), "valid_to": _iso(fact.valid_to, zone),
            "current": fact.valid_to is None, "score": round(fact.score, 4), "block_index": fact.block_index}


def _named_speakers(turns: Sequence[RecalledTurn]) -> dict[str, str]:
    """Display name -> user id for the users' turns whose name belongs to exactly one speaker."""
    ids: dict[str, set[str]] = {}
    for turn in turns:
        if turn.role != "assistant" and turn.name and turn.speaker:
            ids.setdefault(turn.name, set()).add(turn.speaker)
    return {name: next(iter(speakers)) for name, speakers in ids.items() if len(speakers) == 1}


def _legend(named: Mapping[str, str], h: dict[str, str]) -> str:
    """`(Speakers: Melanie = <user:…>, Caroline = <user:…>)`; empty without named speakers."""
    pairs = [f"{name} = <user:{speaker}>" for name, speaker in named.items()]
    return f"({h['speakers']}: {', '.join(pairs)})" if pairs else ""


def _recalled_section(turns: Sequence[RecalledTurn], zone: ZoneInfo, assistant_name: str,
                      named: Mapping[str, str], budget: int, language: str,
                      resolve_dates: bool = False) -> tuple[Section, list[int]]:
    """Whole turns in score order while they fit (a long one is skipped, a later short one may still
    fit), written by day: a `[YYYY-MM-DD]` line, then that day's turns in the order they were said,
    the days oldest first. A day's line is paid for by the first turn of that day kept; written on
    every turn, the date cost a tenth of a LoCoMo turn's tokens. Returns the section and the
    positions of the turns kept (score order)."""
    tally = TokenTally()
    days: dict[str, list[int]] = {}
    written: list[str] = []  # each turn's line, made once
    for position, turn in enumerate(turns):
        day = day_of(turn.time, zone)
        line = _turn_line(turn, assistant_name, named, zone, language, resolve_dates)
        written.append(line)
        cost = line if day in days or not day else f"[{day}]\n{line}"  # a count does not depend on line order
        if tally.with_line(cost) <= budget:
            tally.add(cost)
            days.setdefault(day, []).append(position)
    kept = [position for day in days.values() for position in day]
    lines: list[str] = []
    for day in sorted(days):
        if day:
            lines.append(f"[{day}]")
        in_order = sorted(days[day], key=lambda i: (turns[i].time or 0.0, turns[i].block_index))
        lines.extend(written[i] for i in in_order)
    text = "\n".join(lines)
    return Section("recalled", text, estimate_tokens(text), kept=len(kept),
                   dropped=len(turns) - len(kept)), sorted(kept)


def _turn_line(turn: RecalledTurn, assistant_name: str, named: Mapping[str, str], zone: ZoneInfo,
               language: str, resolve_dates: bool = False) -> str:
    text = marked_text(turn.text, said_at=turn.time if resolve_dates else None, zone=zone, language=language,
                       flagged=turn.flagged,
                       later=(turn.later.text, turn.later.since) if turn.later else None)
    if turn.role == "assistant":
        who = turn.name or assistant_name
    elif turn.speaker and turn.name and named.get(turn.name) == turn.speaker:
        who = turn.name  # its id is in the section's legend
    elif turn.speaker:
        who = f"{turn.name} (<user:{turn.speaker}>)" if turn.name else f"<user:{turn.speaker}>"
    else:
        who = ""
    return f"- {who}: {text}" if who else f"- {text}"


def _turn_dict(turn: RecalledTurn, zone: ZoneInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"text": turn.text, "speaker": turn.speaker, "name": turn.name, "role": turn.role,
                           "time": _iso(turn.time, zone), "score": round(turn.score, 4),
                           "block_index": turn.block_index, "kind": turn.kind}
    if turn.flagged:
        out["flagged"] = True
    if turn.later is not None:
        out["superseded_by"] = {"text": turn.later.text, "valid_from": _iso(turn.later.since, zone)}
    return out

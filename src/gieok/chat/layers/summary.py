"""L2: a rolling, structured summary of each conversation.

The stage-2 analysis sends `summary_updates` {topic, mood, new_topic, new_point, stage}:
topic, mood and stage overwrite; new topics and points are appended unless already there
and only the newest `max_topics` / `max_points` are kept. The permanent core (facts no
conversation may change) is never touched by updates: only configuration (`core_file`) and
the operator (`set_core`) write it. Every change is saved at once, so a crash loses nothing
(a summary saved only at shutdown is lost with the process).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...errors import InvalidInputError, InvalidTypeError
from ...store.conversation import ConversationStore
from ...types import Scope, scope_key

__all__ = ["ChannelSummary", "SummaryStore", "STAGES"]

log = logging.getLogger(__name__)

STAGES = ("start", "ongoing", "closing")
UPDATE_KEYS = ("topic", "mood", "new_topic", "new_point", "stage")
MAX_ITEM_CHARS = 300
MAX_PARTICIPANTS = 12


def _clean_item(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidTypeError(f"summary {what} must be a string, not {type(value).__name__}")
    text = " ".join(value.split())
    return text[:MAX_ITEM_CHARS] or None


def _same(a: str, b: str) -> bool:
    return re.sub(r"[\W_]+", "", a.casefold()) == re.sub(r"[\W_]+", "", b.casefold())


def _append_unique(items: list[str], new: Sequence[str], cap: int) -> list[str]:
    out = list(items)
    for item in new:
        out = [old for old in out if not _same(old, item)] + [item]  # a repeat moves to the newest end
    return out[-cap:]


@dataclass(frozen=True)
class ChannelSummary:
    topic: str = ""
    mood: str = ""
    participants: tuple[str, ...] = ()  # user ids, most recent last
    ongoing_topics: tuple[str, ...] = ()
    key_points: tuple[str, ...] = ()
    core: tuple[str, ...] = ()  # this conversation's permanent core (operator-set)
    stage: str = "start"
    last_speaker: str | None = None
    updates: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChannelSummary:
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        for name in ("participants", "ongoing_topics", "key_points", "core"):
            if name in known:
                known[name] = tuple(known[name])
        return cls(**known)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("participants", "ongoing_topics", "key_points", "core"):
            data[name] = list(data[name])
        return data

    def merge(self, updates: Mapping[str, Any], *, max_topics: int = 5, max_points: int = 10) -> ChannelSummary:
        """Apply `summary_updates`. Unknown keys (including any attempt at `core`) are ignored."""
        if not isinstance(updates, Mapping):
            raise InvalidTypeError(f"summary_updates must be an object, not {type(updates).__name__}")
        ignored = sorted(set(updates) - set(UPDATE_KEYS))
        if ignored:
            log.info("summary update: ignoring keys %s", ", ".join(ignored))
        changes: dict[str, Any] = {}
        for name in ("topic", "mood"):
            value = _clean_item(updates.get(name), name)
            if value is not None:
                changes[name] = value
        stage = updates.get("stage")
        if isinstance(stage, str) and stage.strip().lower() in STAGES:
            changes["stage"] = stage.strip().lower()
        elif stage not in (None, ""):
            log.info("summary update: ignoring unknown stage %r", stage)
        for key, field_name, cap in (("new_topic", "ongoing_topics", max_topics),
                                     ("new_point", "key_points", max_points)):
            raw = updates.get(key)
            values = raw if isinstance(raw, list) else [raw]
            items = [v for v in (_clean_item(x, key) for x in values if x is not None) if v]
            if items:
                changes[field_name] = tuple(_append_unique(list(getattr(self, field_name)), items, cap))
        if not changes:
            return self
        return replace(self, **changes, updates=self.updates + 1)

    def with_speaker(self, user_id: str) -> ChannelSummary:
        participants = [p for p in self.participants if p != user_id] + [user_id]
        stage = "ongoing" if self.stage == "start" and len(participants) > 0 and self.last_speaker else self.stage
        return replace(self, participants=tuple(participants[-MAX_PARTICIPANTS:]), last_speaker=user_id, stage=stage)

    def without_user(self, user_id: str) -> tuple[ChannelSummary, int]:
        """"Forget me" for L2: the user leaves the participants, and every topic or point that
        names them (`<user:ID>`, as extraction writes users) is dropped. The operator's core
        stays. Returns the scrubbed summary and how many items were dropped."""
        tag = f"<user:{user_id}>"
        topics = tuple(t for t in self.ongoing_topics if tag not in t)
        points = tuple(p for p in self.key_points if tag not in p)
        dropped = (len(self.ongoing_topics) - len(topics)) + (len(self.key_points) - len(points))
        changes: dict[str, Any] = {"ongoing_topics": topics, "key_points": points,
                                   "participants": tuple(p for p in self.participants if p != user_id)}
        for name in ("topic", "mood"):
            if tag in getattr(self, name):
                changes[name] = ""
                dropped += 1
        if self.last_speaker == user_id:
            changes["last_speaker"] = None
        changed = replace(self, **changes)
        return (self, 0) if changed == self else (changed, dropped)

    def to_markdown(self, global_core: Sequence[str] = (), names: Mapping[str, str] | None = None) -> str:
        names = names or {}
        who = ", ".join(names.get(p, f"<user:{p}>") for p in self.participants) or "-"
        lines = [f"- **Topic:** {self.topic or '-'}", f"- **Mood:** {self.mood or '-'}", f"- **Stage:** {self.stage}",
                 f"- **Participants:** {who}"]
        if self.last_speaker:
            lines.append(f"- **Last speaker:** {names.get(self.last_speaker, f'<user:{self.last_speaker}>')}")
        for title, items in (("Permanent core", (*global_core, *self.core)), ("Ongoing topics", self.ongoing_topics),
                             ("Key points", self.key_points)):
            if items:
                lines.append(f"\n**{title}**")
                lines.extend(f"- {item}" for item in items)
        return "\n".join(lines)

    def context_lines(self, global_core: Sequence[str] = ()) -> dict[str, list[str]]:
        """The compact prompt form, by part, so the context budget can drop parts in order."""
        head = []
        if self.topic:
            head.append(f"topic: {self.topic}")
        if self.mood:
            head.append(f"mood: {self.mood}")
        head.append(f"stage: {self.stage}")
        if self.participants:
            head.append("participants: " + ", ".join(f"<user:{p}>" for p in self.participants))
        return {"core": [*global_core, *self.core], "head": head, "ongoing": list(self.ongoing_topics),
                "points": list(self.key_points)}


@dataclass
class SummaryStore:
    tables: ConversationStore
    max_topics: int = 5
    max_points: int = 10
    global_core: tuple[str, ...] = ()
    clock: Callable[[], float] = time.time
    _cache: dict[str, ChannelSummary] = field(default_factory=dict)

    def get(self, conversation: Scope) -> ChannelSummary:
        key = scope_key(conversation)
        if key not in self._cache:
            data = self.tables.summary_load(key)
            self._cache[key] = ChannelSummary.from_dict(data) if data else ChannelSummary()
        return self._cache[key]

    def _save(self, conversation: Scope, summary: ChannelSummary) -> ChannelSummary:
        key = scope_key(conversation)
        self.tables.summary_save(key, summary.as_dict(), self.clock())  # saved first, then cached
        self._cache[key] = summary
        return summary

    def update(self, conversation: Scope, updates: Mapping[str, Any]) -> ChannelSummary:
        current = self.get(conversation)
        merged = current.merge(updates, max_topics=self.max_topics, max_points=self.max_points)
        return merged if merged is current else self._save(conversation, merged)

    def note_speaker(self, conversation: Scope, user_id: str) -> ChannelSummary:
        current = self.get(conversation)
        if current.last_speaker == user_id:
            return current
        return self._save(conversation, current.with_speaker(user_id))

    def set_core(self, conversation: Scope, lines: Sequence[str]) -> ChannelSummary:
        """Operator command: replace this conversation's permanent core."""
        if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
            raise InvalidTypeError("core must be a list of strings")
        cleaned = tuple(c for c in (_clean_item(line, "core") for line in lines) if c)
        if len(cleaned) > 20:
            raise InvalidInputError("the permanent core holds at most 20 lines")
        return self._save(conversation, replace(self.get(conversation), core=cleaned))

    def forget_user(self, user_id: str) -> int:
        """Scrub a user from every conversation's summary; returns the items dropped."""
        dropped = 0
        for key in self.tables.summary_keys():
            data = self.tables.summary_load(key)
            if not data:
                continue
            current = ChannelSummary.from_dict(data)
            scrubbed, removed = current.without_user(user_id)
            if scrubbed is not current:
                self.tables.summary_save(key, scrubbed.as_dict(), self.clock())
                self._cache[key] = scrubbed
                dropped += removed
        return dropped

    def forget_cached(self) -> None:
        self._cache.clear()

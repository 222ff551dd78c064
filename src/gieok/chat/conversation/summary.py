"""L2: a rolling, structured summary of each conversation.

The stage-2 analysis sends `summary_updates` {topic, mood, new_topic, new_point, stage}:
topic, mood and stage overwrite; new topics and points are appended unless already there
and only the newest `max_topics` / `max_points` are kept. The permanent core (facts no
conversation may change) is never touched by updates: only configuration (`core_file`) and
the operator (`set_core`) write it. Every change is saved at once, so a crash loses nothing
(a summary saved only at shutdown is lost with the process).

Each topic, point, topic line and mood keeps the users whose messages it was made from
(`sources`): erasing a user drops every item made from their messages, and any that names them.
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
from ...types import Scope, scope_from_key, scope_key

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
    # "<field>:<item>" → the users whose messages the item was made from (lineage: erasure reaches it)
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChannelSummary:
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        for name in ("participants", "ongoing_topics", "key_points", "core"):
            if name in known:
                known[name] = tuple(known[name])
        if "sources" in known:
            raw = known["sources"]
            known["sources"] = {str(k): tuple(str(u) for u in v) for k, v in raw.items()
                                if isinstance(v, list)} if isinstance(raw, Mapping) else {}
        return cls(**known)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("participants", "ongoing_topics", "key_points", "core"):
            data[name] = list(data[name])
        data["sources"] = {k: list(v) for k, v in self.sources.items()}
        return data

    def _kept_sources(self, changes: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        """The sources of the items a change leaves (those of dropped items go)."""
        after = {"topic": changes.get("topic", self.topic), "mood": changes.get("mood", self.mood)}
        items = {f"{name}:{value}" for name, value in after.items() if value}
        for name in ("ongoing_topics", "key_points"):
            items.update(f"{name}:{item}" for item in changes.get(name, getattr(self, name)))
        return {key: users for key, users in self.sources.items() if key in items}

    def merge(self, updates: Mapping[str, Any], *, max_topics: int = 5, max_points: int = 10,
              users: Sequence[str] = ()) -> ChannelSummary:
        """Apply `summary_updates`, made from the messages of `users`. Unknown keys (including any
        attempt at `core`) are ignored."""
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
        sources = self._kept_sources(changes)
        if users:
            made = {f"{name}:{changes[name]}" for name in ("topic", "mood") if name in changes}
            for name in ("ongoing_topics", "key_points"):
                made.update(f"{name}:{item}" for item in changes.get(name, ()) if item not in getattr(self, name))
            for key in made:
                sources[key] = tuple(dict.fromkeys((*sources.get(key, ()), *users)))
        return replace(self, **changes, updates=self.updates + 1, sources=sources)

    def with_speaker(self, user_id: str) -> ChannelSummary:
        participants = [p for p in self.participants if p != user_id] + [user_id]
        stage = "ongoing" if self.stage == "start" and len(participants) > 0 and self.last_speaker else self.stage
        return replace(self, participants=tuple(participants[-MAX_PARTICIPANTS:]), last_speaker=user_id, stage=stage)

    def without_user(self, user_id: str, names: Sequence[str] = ()) -> tuple[ChannelSummary, int]:
        """"Forget me" for L2: the user leaves the participants, and every topic, point, topic
        line or mood made from their messages (`sources`) or naming them — `<user:ID>`, as
        extraction writes users, or one of their display `names` — is dropped. The operator's core
        stays. Returns the scrubbed summary and how many items were dropped."""
        marks = [f"<user:{user_id}>", *(n for n in names if len(n) >= 2)]

        def theirs(field_name: str, item: str) -> bool:
            return user_id in self.sources.get(f"{field_name}:{item}", ()) or any(m in item for m in marks)

        topics = tuple(t for t in self.ongoing_topics if not theirs("ongoing_topics", t))
        points = tuple(p for p in self.key_points if not theirs("key_points", p))
        dropped = (len(self.ongoing_topics) - len(topics)) + (len(self.key_points) - len(points))
        changes: dict[str, Any] = {"ongoing_topics": topics, "key_points": points,
                                   "participants": tuple(p for p in self.participants if p != user_id)}
        for name in ("topic", "mood"):
            if getattr(self, name) and theirs(name, getattr(self, name)):
                changes[name] = ""
                dropped += 1
        if self.last_speaker == user_id:
            changes["last_speaker"] = None
        changes["sources"] = {k: v for k, v in self._kept_sources(changes).items()}
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

    def update(self, conversation: Scope, updates: Mapping[str, Any], users: Sequence[str] = ()) -> ChannelSummary:
        """Merge `updates`, made from the messages of `users` (their lineage: erasure reaches them)."""
        current = self.get(conversation)
        merged = current.merge(updates, max_topics=self.max_topics, max_points=self.max_points, users=users)
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

    def items_of(self, user_id: str, names: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The summary items made from a user's messages or naming them, in every conversation (what
        an access request shows, and what erasure drops)."""
        found: list[dict[str, Any]] = []
        for key in self.tables.summary_keys():
            data = self.tables.summary_load(key)
            if not data:
                continue
            current = ChannelSummary.from_dict(data)
            scrubbed, _ = current.without_user(user_id, names)
            for name in ("topic", "mood"):
                if getattr(current, name) and not getattr(scrubbed, name):
                    found.append({"conversation": scope_from_key(key).as_dict(), "field": name,
                                  "text": getattr(current, name)})
            for name in ("ongoing_topics", "key_points"):
                found += [{"conversation": scope_from_key(key).as_dict(), "field": name, "text": item}
                          for item in getattr(current, name) if item not in getattr(scrubbed, name)]
        return found

    def forget_user(self, user_id: str, names: Sequence[str] = ()) -> int:
        """Scrub a user from every conversation's summary (`ChannelSummary.without_user`);
        returns the items dropped."""
        dropped = 0
        for key in self.tables.summary_keys():
            data = self.tables.summary_load(key)
            if not data:
                continue
            current = ChannelSummary.from_dict(data)
            scrubbed, removed = current.without_user(user_id, names)
            if scrubbed is not current:
                self.tables.summary_save(key, scrubbed.as_dict(), self.clock())
                self._cache[key] = scrubbed
                dropped += removed
        return dropped

    def forget_cached(self) -> None:
        self._cache.clear()

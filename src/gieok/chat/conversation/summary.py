"""L2: a rolling, structured summary of each conversation.

The stage-2 analysis sends `summary_updates` {topic, mood, new_topic, new_point, stage}:
topic, mood and stage overwrite; new topics and points are appended unless already there
and only the newest `max_topics` / `max_points` are kept. The permanent core (facts no
conversation may change) is never touched by updates: only configuration (`core_file`) and
the operator (`set_core`) write it. Every change is saved at once, so a crash loses nothing
(a summary saved only at shutdown is lost with the process).

Each topic, point, topic line and mood keeps the users whose messages it was made from
(`sources`): erasing a user drops every item made from their messages, and any that names them.
It keeps the messages too (`spans`: the first and last L1 message of the batches it was made
from): a message deleted or edited drops every item whose span holds it (what the old text said
may be in it), and the next extraction writes the summary again from what is left.

The summary is read from the store at every use and changed inside one transaction
(`ConversationStore.summary_change`), never cached in a process: processes sharing a database
(`gieok serve --workers N`, bot processes) each change it as it is now — a copy one of them read
earlier, written back, would undo another's erasure.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
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
    # "<field>:<item>" → (first, last) L1 message id of the batches it was made from (a deletion reaches it)
    spans: Mapping[str, tuple[int, int]] = field(default_factory=dict)

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
        if "spans" in known:
            raw = known["spans"]
            known["spans"] = {str(k): (int(v[0]), int(v[1])) for k, v in raw.items()
                              if isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v)
                              } if isinstance(raw, Mapping) else {}
        return cls(**known)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("participants", "ongoing_topics", "key_points", "core"):
            data[name] = list(data[name])
        data["sources"] = {k: list(v) for k, v in self.sources.items()}
        data["spans"] = {k: list(v) for k, v in self.spans.items()}
        return data

    def _items_after(self, changes: Mapping[str, Any]) -> set[str]:
        """The "<field>:<item>" keys of the items a change leaves."""
        after = {"topic": changes.get("topic", self.topic), "mood": changes.get("mood", self.mood)}
        items = {f"{name}:{value}" for name, value in after.items() if value}
        for name in ("ongoing_topics", "key_points"):
            items.update(f"{name}:{item}" for item in changes.get(name, getattr(self, name)))
        return items

    def _kept_sources(self, changes: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
        """The sources of the items a change leaves (those of dropped items go)."""
        items = self._items_after(changes)
        return {key: users for key, users in self.sources.items() if key in items}

    def _kept_spans(self, changes: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        items = self._items_after(changes)
        return {key: span for key, span in self.spans.items() if key in items}

    def merge(self, updates: Mapping[str, Any], *, max_topics: int = 5, max_points: int = 10,
              users: Sequence[str] = (), messages: Sequence[int] = ()) -> ChannelSummary:
        """Apply `summary_updates`, made from the messages of `users`, whose L1 ids are `messages`.
        Unknown keys (including any attempt at `core`) are ignored."""
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
        sources, spans = self._kept_sources(changes), self._kept_spans(changes)
        made = {f"{name}:{changes[name]}" for name in ("topic", "mood") if name in changes}
        for name in ("ongoing_topics", "key_points"):
            made.update(f"{name}:{item}" for item in changes.get(name, ()) if item not in getattr(self, name))
        for key in made:
            if users:
                sources[key] = tuple(dict.fromkeys((*sources.get(key, ()), *users)))
            if messages:
                # One span per item, widened by each batch that makes it again — bounded, where a list
                # of ids would grow with every batch that repeats a topic. It may also hold messages of
                # batches in between (their deletion drops the item too: the next extraction writes
                # it again) and other conversations' ids, which no deletion here names.
                first, last = spans.get(key, (min(messages), max(messages)))
                spans[key] = (min(first, *messages), max(last, *messages))
        return replace(self, **changes, updates=self.updates + 1, sources=sources, spans=spans)

    def with_speaker(self, user_id: str) -> ChannelSummary:
        participants = [p for p in self.participants if p != user_id] + [user_id]
        stage = "ongoing" if self.stage == "start" and len(participants) > 0 and self.last_speaker else self.stage
        return replace(self, participants=tuple(participants[-MAX_PARTICIPANTS:]), last_speaker=user_id, stage=stage)

    def without_user(self, user_id: str, names: Sequence[str] = ()) -> tuple[ChannelSummary, int]:
        """"Forget me" for L2: the user leaves the participants, and every topic, point, topic
        line or mood made from their messages (`sources`) or naming them — `<user:ID>`, as
        extraction writes users, or one of their display `names` — is dropped. The operator's core
        stays. Returns the scrubbed summary and how many items were dropped (their place among the
        participants one: a summary whose items a deletion already took still names them there)."""
        marks = [f"<user:{user_id}>", *(n for n in names if len(n) >= 2)]

        def theirs(field_name: str, item: str) -> bool:
            return user_id in self.sources.get(f"{field_name}:{item}", ()) or any(m in item for m in marks)

        topics = tuple(t for t in self.ongoing_topics if not theirs("ongoing_topics", t))
        points = tuple(p for p in self.key_points if not theirs("key_points", p))
        dropped = (len(self.ongoing_topics) - len(topics)) + (len(self.key_points) - len(points))
        dropped += int(user_id in self.participants or self.last_speaker == user_id)
        changes: dict[str, Any] = {"ongoing_topics": topics, "key_points": points,
                                   "participants": tuple(p for p in self.participants if p != user_id)}
        for name in ("topic", "mood"):
            if getattr(self, name) and theirs(name, getattr(self, name)):
                changes[name] = ""
                dropped += 1
        if self.last_speaker == user_id:
            changes["last_speaker"] = None
        changes["sources"] = self._kept_sources(changes)
        changes["spans"] = self._kept_spans(changes)
        changed = replace(self, **changes)
        return (self, 0) if changed == self else (changed, dropped)

    def without_messages(self, message_ids: Collection[int]) -> tuple[ChannelSummary, int]:
        """Messages deleted or edited: every topic, point, topic line or mood made from a batch that
        held one of them is dropped — and every item whose messages are not known (made before
        summaries kept them, or by a caller that named none): what the old text said may be in
        it. The participants and the operator's core stay. Returns the summary and the items dropped."""
        if not message_ids:
            return self, 0

        def held(field_name: str, item: str) -> bool:
            span = self.spans.get(f"{field_name}:{item}")
            return span is None or any(span[0] <= m <= span[1] for m in message_ids)

        topics = tuple(t for t in self.ongoing_topics if not held("ongoing_topics", t))
        points = tuple(p for p in self.key_points if not held("key_points", p))
        dropped = (len(self.ongoing_topics) - len(topics)) + (len(self.key_points) - len(points))
        changes: dict[str, Any] = {"ongoing_topics": topics, "key_points": points}
        for name in ("topic", "mood"):
            if getattr(self, name) and held(name, getattr(self, name)):
                changes[name] = ""
                dropped += 1
        if not dropped:
            return self, 0
        changes["sources"] = self._kept_sources(changes)
        changes["spans"] = self._kept_spans(changes)
        return replace(self, **changes), dropped

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


def _readable(key: str, data: dict[str, Any] | None) -> ChannelSummary:
    """The stored summary; an empty one (logged) for a row whose fields are not what summaries write —
    a stored value must not make every read and message of the conversation fail."""
    if not data:
        return ChannelSummary()
    try:
        return ChannelSummary.from_dict(data)
    except (TypeError, ValueError) as exc:
        log.error("the stored summary of %s cannot be read (%s): read as empty (the next update replaces it)",
                  key, exc)
        return ChannelSummary()


@dataclass
class SummaryStore:
    tables: ConversationStore
    max_topics: int = 5
    max_points: int = 10
    global_core: tuple[str, ...] = ()
    clock: Callable[[], float] = time.time
    # told (conversation key, items) when items are withdrawn: a deleted or edited message, an erased
    # user — the live stream's `summary.updated` events that showed them are redacted then
    on_withdrawn: Callable[[str, int], None] | None = None

    def get(self, conversation: Scope) -> ChannelSummary:
        """The conversation's summary as stored now (read at every call: another process may have
        changed it)."""
        return _readable(scope_key(conversation), self.tables.summary_load(scope_key(conversation)))

    def _change(self, key: str,
                change: Callable[[ChannelSummary], ChannelSummary]) -> tuple[ChannelSummary, ChannelSummary]:
        """`change` applied to the summary as stored, in one transaction; (before, after)."""
        seen: list[ChannelSummary] = []

        def apply(data: dict[str, Any] | None) -> dict[str, Any] | None:
            current = _readable(key, data)
            changed = change(current)
            seen[:] = [current, changed]
            return None if changed == current else changed.as_dict()

        self.tables.summary_change(key, apply, self.clock())
        return seen[0], seen[1]

    def update(self, conversation: Scope, updates: Mapping[str, Any], users: Sequence[str] = (),
               messages: Sequence[int] = ()) -> ChannelSummary:
        """Merge `updates`, made from the messages of `users` whose L1 ids are `messages` (their
        lineage: erasure and deletion reach them). Returns the summary after."""
        if not isinstance(updates, Mapping):  # refused before any transaction
            raise InvalidTypeError(f"summary_updates must be an object, not {type(updates).__name__}")
        return self._change(scope_key(conversation), lambda current: current.merge(
            updates, max_topics=self.max_topics, max_points=self.max_points, users=users, messages=messages))[1]

    def note_speaker(self, conversation: Scope, user_id: str) -> ChannelSummary:
        current = self.get(conversation)
        if current.last_speaker == user_id:  # the common case (one speaker in a row) writes nothing
            return current
        return self._change(scope_key(conversation), lambda now: now.with_speaker(user_id))[1]

    def forget_messages(self, conversation: Scope, message_ids: Collection[int]) -> int:
        """Messages of this conversation deleted or edited: the summary items made from them go
        (`ChannelSummary.without_messages`); the count dropped."""
        return self._scrub(scope_key(conversation), lambda now: now.without_messages(message_ids)) if message_ids else 0

    def _scrub(self, key: str, scrub: Callable[[ChannelSummary], tuple[ChannelSummary, int]]) -> int:
        """`scrub` (a summary → the summary without some items, and how many) applied as stored.
        Looked at first outside a transaction: an erasure passes over every conversation, and most
        have nothing of the user's."""
        data = self.tables.summary_load(key)
        if not data or not scrub(_readable(key, data))[1]:
            return 0
        counted: list[int] = []

        def change(current: ChannelSummary) -> ChannelSummary:
            scrubbed, removed = scrub(current)
            counted[:] = [removed]
            return scrubbed

        self._change(key, change)
        removed = counted[0] if counted else 0
        if removed and self.on_withdrawn is not None:
            self.on_withdrawn(key, removed)
        return removed

    def set_core(self, conversation: Scope, lines: Sequence[str]) -> ChannelSummary:
        """Operator command: replace this conversation's permanent core."""
        if isinstance(lines, str) or not all(isinstance(line, str) for line in lines):
            raise InvalidTypeError("core must be a list of strings")
        cleaned = tuple(c for c in (_clean_item(line, "core") for line in lines) if c)
        if len(cleaned) > 20:
            raise InvalidInputError("the permanent core holds at most 20 lines")
        return self._change(scope_key(conversation), lambda now: replace(now, core=cleaned))[1]

    def items_of(self, user_id: str, names: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The summary items made from a user's messages or naming them, in every conversation (what
        an access request shows, and what erasure drops)."""
        found: list[dict[str, Any]] = []
        for key in self.tables.summary_keys():
            data = self.tables.summary_load(key)
            if not data:
                continue
            current = _readable(key, data)
            scrubbed, _ = current.without_user(user_id, names)
            if (scrubbed.participants, scrubbed.last_speaker) != (current.participants, current.last_speaker):
                found.append({"conversation": scope_from_key(key).as_dict(), "field": "participants",
                              "text": f"<user:{user_id}>"})
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
        return sum(self._scrub(key, lambda now: now.without_user(user_id, names)) for key in self.tables.summary_keys())

"""The conversation memory of one `Memory`: L1 recent messages, L2 rolling summaries and L3
facts, with the views every front-end shows (the terminal chat, the Discord bot, the CLI, the
server). The pipeline judges and writes through it; a reader needs no model, no classifier and
no pipeline to open it.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ...callbacks import weakly
from ...config import read_text_file
from ...errors import InvalidInputError, InvalidTypeError
from ...memory import Memory
from ...store.conversation import ConversationStore, FactSourceRow, L1Row
from ...types import Block, Scope, scope_from_key
from ..settings import ChatSettings, chat_settings
from .facts import FACT_STREAM_NAMES, FactOutcome, FactStore, FactType, PairJudge, Statement
from .recent import RecentMessages
from .summary import SummaryStore

__all__ = ["ConversationMemory", "check_id", "MAX_ID_CHARS"]

MAX_ID_CHARS = 100
_ID = re.compile(r"^[\w.:@#-]{1,100}$")
DOT_SEGMENTS = (".", "..")


def check_id(value: Any, what: str, *, optional: bool = False) -> str | None:
    """A user, channel or guild id as transports give them: 1–100 letters, digits or . : @ # - _
    (an int is taken as its digits). Ids starting with 'gieok:' are gieok's own (lore)."""
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidTypeError(f"{what} must be a string, not {type(value).__name__}")
    if not _ID.match(value):
        raise InvalidInputError(f"{what} must be 1–{MAX_ID_CHARS} letters, digits or . : @ # - _ (got {value[:40]!r})")
    if value in DOT_SEGMENTS:  # a URL's path cannot name it: /v1/users/.. is /v1/ to every HTTP client
        raise InvalidInputError(f"{what} {value!r} cannot be an id (it is a path's . or ..)")
    if value.startswith("gieok:"):
        raise InvalidInputError(f"{what} values starting with 'gieok:' are reserved")
    return value


# A user's store lease (`user_held`) is held this long at most (an edit of one of their messages, or
# an erasure's start: well under a second each; a holder that died lets it lapse); whoever waits for
# it waits a little longer at most, then is told to try again.
USER_LEASE_SECONDS = 30.0
REPLY_WINDOW = 64  # blocks after a turn looked at for the reply that answered it (`replies_to`)


class ConversationMemory:
    """L1, L2 and L3 over one memory. `commit_lock` serialises whoever turns L1 rows into turn
    blocks with whoever erases a user: share one instance between a bot and a server that
    watch the same memory."""

    def __init__(self, memory: Memory, settings: ChatSettings | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        s = chat_settings(settings if settings is not None else memory.settings)
        self.memory = memory
        self.settings = s
        self.clock = clock
        self.tables: ConversationStore = memory.store.conversation
        self.l1 = RecentMessages(self.tables, capacity=s.l1_size, clock=clock)
        core = tuple(line.strip() for line in read_text_file(s.core_file, "core").splitlines()
                     if line.strip() and not line.startswith("#")) if s.core_file else ()
        self.summaries = SummaryStore(self.tables, s.summary_max_topics, s.summary_max_points, core, clock,
                                      on_withdrawn=weakly(self._summary_withdrawn))
        self.facts = FactStore(memory, self.tables, judge=PairJudge(s.fact_duplicate_threshold,
                                                                    s.fact_conflict_threshold,
                                                                    s.fact_span_threshold),
                               global_user_facts=s.global_user_facts, clock=clock)
        self.commit_lock = threading.Lock()
        self._holder = f"conversation:{uuid.uuid4().hex}"  # this instance, as a lease holder (`user_held`)
        self.resume_erasures()  # an erasure a crash interrupted is finished before anything reads

    # -- views ------------------------------------------------------------------------------------
    def summary_view(self, conversation: Scope) -> dict[str, Any]:
        """The conversation's L2 summary as every front-end shows it: the summary's fields, the
        permanent core that applies to every conversation, display names and a markdown form."""
        summary = self.summaries.get(conversation)
        names = self.l1.display_names(conversation)
        global_core = self.summaries.global_core
        shown = summary.as_dict()
        del shown["spans"]  # which stored messages each item came from: the deletion's bookkeeping, not the summary
        return {**shown, "global_core": list(global_core), "names": names,
                "markdown": summary.to_markdown(global_core, names)}

    def summary_markdown(self, conversation: Scope) -> str:
        return str(self.summary_view(conversation)["markdown"])

    def channels(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Conversations with L1 messages, most recently active first."""
        return [{"conversation": conversation.as_dict(), "messages": count, "last_message_at": last}
                for conversation, count, last in self.tables.l1_conversations(limit)]

    def recent_messages(self, conversation: Scope, limit: int | None = None) -> list[dict[str, Any]]:
        return [row.as_dict() for row in self.l1.recent(conversation, limit)]

    # -- facts stated by hand -----------------------------------------------------------------------
    def state_fact(self, text: str, *, user: str | None, guild: str | None, author: str, topic: str = "",
                   when: float | None = None) -> FactOutcome:
        """A fact stated by hand (an operator's or an agent's key: `POST /v1/facts`, MCP
        `remember_fact`), judged as an extracted one is, from `when` (default now); said on the
        live stream as the pipeline says an extracted one (`fact.added`, `fact.superseded`,
        `fact.duplicate`), with the key as its source."""
        if user is None and guild is None:
            raise InvalidInputError("a fact is about a user (user) or a guild (guild)")
        outcome = self.facts.add(text, fact_type=FactType.USER if user else FactType.GUILD, topic=topic,
                                 guild=guild, user_id=user,
                                 statement=Statement(self.facts.clock() if when is None else when, author=author))
        self._fact_event(outcome.action, outcome, author)
        return outcome

    def correct_fact(self, block_index: int, text: str, *, author: str, valid_from: float | None = None) -> FactOutcome:
        """`FactStore.correct`, said on the live stream (`fact.corrected`)."""
        outcome = self.facts.correct(block_index, text, author=author, valid_from=valid_from)
        self._fact_event("corrected", outcome, author)
        return outcome

    def _fact_event(self, action: str, outcome: FactOutcome, author: str) -> None:
        self.memory.emit(FACT_STREAM_NAMES.get(action, f"fact.{action}"), {
            "event": f"fact_{action}", "fact": outcome.fact.text if outcome.fact else None,
            "block": outcome.fact.block_index if outcome.fact else None, "judged_by": outcome.judged_by,
            "source": author, "replaced": outcome.replaced.block_index if outcome.replaced else None})

    # -- forgetting a person ----------------------------------------------------------------------
    def forget_user(self, user_id: str, *, reason: str = "") -> dict[str, int]:
        """Erase everything of a user in this memory ("forget me", GDPR art. 17), following lineage
        (docs/privacy.md): the facts about them (history included) and every statement of a fact
        their messages made (a fact only they stated goes; one others stated too stays, dated by
        the rest); their messages — every block of any kind whose scope user or speaker is their id
        (turns, the working-memory notes promoted from them, facts), content forgotten with its
        vector and index entries, and the turns after theirs embedded again without their words;
        their recent lines, the names they were seen with, and every summary item made from their
        messages or naming them. Other users' messages that name them stay (that is the other
        user's speech). The erasure is recorded before it starts and finished on the next open if
        a crash interrupts it (`resume_erasures`): never half done. Someone with background
        extraction running (it could write a fact back) waits for it first, as the chat front-ends
        do. Returns counts per kind."""
        check_id(user_id, "user_id")
        # begun once no edit of one of their messages is under way in any process (`user_held`); from
        # then on such an edit's new turn is refused (`message_block_hook`)
        with self.user_held(user_id), self.commit_lock:
            self.tables.erasure_begin(user_id, self.clock(), reason)
        with self.commit_lock:  # no commit may write this user's L1 rows while they are erased
            receipt = self._erase(user_id)
            self.tables.erasure_end(user_id)
        return receipt

    def user_held(self, user_id: str | None) -> AbstractContextManager[None]:
        """The user's store lease, shared by every process of the memory: an edit of one of their
        messages holds it while it erases the old turn and writes the new one (`ConversationPipeline`),
        and an erasure of the user while it records its start. An edit stored in one process while the
        author's erasure ran in another wrote its new turn after the erasure had listed their blocks:
        their words, kept after their erasure. Now an erasure starts once no such edit is under way;
        one that comes after the start has its new turn refused (`message_block_hook`), and one after
        the end finds nothing left to edit. Nothing for a message without a user."""
        if user_id is None:
            return nullcontext()
        return self.memory.store.leases.held(f"user:{user_id}", self._holder, USER_LEASE_SECONDS,
                                             wait=USER_LEASE_SECONDS + 5)

    def user_data(self, user_id: str, *, page: int = 500) -> Iterator[str]:
        """Everything held about one user (GDPR art. 15), as one JSON document written a piece at
        a time (a user with 10,000 messages is never held whole): the names they were seen with;
        their messages (each with its conversation, time and id) and the notes copied from them,
        and their recent messages not yet turns; the facts about them, current and past, each with
        its period and sources; the statements of facts their messages made about anyone; the
        summary items made from their messages or naming them."""
        check_id(user_id, "user_id")
        yield '{"user": ' + json.dumps(user_id) + ', "generated_at": ' + json.dumps(self.clock())
        names = [{"name": n, "first_seen": a, "last_seen": b} for n, a, b in self.tables.user_names_of(user_id)]
        yield ', "names": ' + json.dumps(names, ensure_ascii=False)
        yield ', "messages": ['
        after, first, notes, replies = 0, True, [], set()
        while rows := self.tables.user_blocks_page(user_id, after, page):
            parts = []
            for index, kind, guild, channel, text, when, metadata in rows:
                meta = _json_object(metadata)
                item = {"block_index": index, "kind": kind, "conversation": {"guild": guild, "channel": channel},
                        "time": when, "text": text, "message_id": meta.get("external_id"), "role": meta.get("role")}
                if kind == "note":
                    notes.append(item)
                elif kind != "fact":  # facts are listed below, with their history
                    parts.append(json.dumps(item, ensure_ascii=False))
            if parts:
                yield ("" if first else ",") + ",".join(parts)
                first = False
            replies |= self._replies_after([row[0] for row in rows if row[1] == "turn"])
            after = int(rows[-1][0])
        yield '], "pending_messages": ' + json.dumps(
            [{"conversation": scope_from_key(r.scope_key).as_dict(), "time": r.created_at, "text": r.content,
              "message_id": r.external_id} for r in self.tables.user_l1_rows(user_id) if r.block_index is None],
            ensure_ascii=False)
        yield ', "notes": ' + json.dumps(notes, ensure_ascii=False)
        recent, unwritten = self._replies_in_recent(self.tables.user_l1_rows(user_id))
        yield ', "replies": ['
        ordered, separator = sorted(replies | recent), ""
        for start in range(0, len(ordered), page):
            for b in self.memory.store.get_many(ordered[start:start + page]).values():
                if not b.forgotten:
                    yield separator + json.dumps({"block_index": b.block_index, "conversation": b.scope.as_dict(),
                                                  "time": b.event_time, "text": b.text,
                                                  "message_id": b.metadata.get("external_id")}, ensure_ascii=False)
                    separator = ","
        for r in unwritten:
            yield separator + json.dumps({"conversation": scope_from_key(r.scope_key).as_dict(), "time": r.created_at,
                                          "text": r.content, "message_id": r.external_id}, ensure_ascii=False)
            separator = ","
        yield "]"
        facts = self.facts.facts(user_id=user_id, include_history=True, limit=1_000_000)
        sources = self.facts.sources([f.block_index for f in facts])
        yield ', "facts": ' + json.dumps([{**f.as_dict(), "sources": [_source(s) for s in
                                                                      sources.get(f.block_index, [])]}
                                          for f in facts], ensure_ascii=False)
        stated = self.tables.fact_sources_by_user(user_id)
        about = self.tables.facts_get(sorted({s.block_index for s in stated}))
        texts = self.memory.store.get_many(sorted(about))
        yield ', "statements": ' + json.dumps(
            [{**_source(s), "fact": texts[s.block_index].text, "about": about[s.block_index].user_id}
             for s in stated if s.block_index in about and s.block_index in texts], ensure_ascii=False)
        seen_as = [name for name, *_ in self.tables.user_names_of(user_id)]
        yield ', "summary_items": ' + json.dumps(self.summaries.items_of(user_id, seen_as), ensure_ascii=False)
        yield "}"

    def replies_to(self, rows: Sequence[L1Row], blocks: Iterable[int]) -> tuple[set[int], list[L1Row]]:
        """The replies (the bot's, an agent's) that answered a user's messages — `rows`, their recent
        ones, and `blocks`, their blocks — which may repeat what they said: a reply answers what was
        said in its conversation since the last reply, so each message's is the first reply after it.
        Found in the recent rows while they hold it (its row, and its block once written), else among
        the turns after the message's turn block. Returns (reply blocks, reply rows with no block yet)."""
        found, unwritten = self._replies_in_recent(rows)
        return found | self._replies_after(blocks), unwritten

    def _replies_in_recent(self, rows: Sequence[L1Row]) -> tuple[set[int], list[L1Row]]:
        found: set[int] = set()
        unwritten: list[L1Row] = []
        for key in sorted({row.scope_key for row in rows}):
            theirs = {row.message_id for row in rows if row.scope_key == key}
            answering = False
            # every recent row of the conversation (a few dozen), in the order they were said
            for line in self.l1.recent(scope_from_key(key), 100_000):
                if line.message_id in theirs:
                    answering = True
                elif line.role == "assistant" and answering:
                    answering = False
                    if line.block_index is None:
                        unwritten.append(line)
                    else:
                        found.add(line.block_index)
        return found, unwritten

    def _replies_after(self, blocks: Iterable[int]) -> set[int]:
        """For turn blocks out of the recent rows: the first reply said after each in its
        conversation, among the `REPLY_WINDOW` blocks written after it (a reply is written after
        the message it answers; one read for them all)."""
        turns = [b for b in self.memory.store.get_many(sorted(blocks)).values()
                 if b.kind == "turn" and not b.forgotten and b.conv_pos is not None
                 and b.metadata.get("role") != "assistant"]
        later = sorted({i for t in turns for i in range(t.block_index + 1, t.block_index + 1 + REPLY_WINDOW)})
        by_conversation: dict[tuple[str | None, str | None], list[Block]] = {}
        for b in self.memory.store.get_many(later).values():
            if b.kind == "turn" and not b.forgotten and b.metadata.get("role") == "assistant":
                by_conversation.setdefault((b.scope.guild, b.scope.channel), []).append(b)
        found: set[int] = set()
        for turn in turns:
            after = [r for r in by_conversation.get((turn.scope.guild, turn.scope.channel), [])
                     if turn.block_index < r.block_index <= turn.block_index + REPLY_WINDOW
                     and r.event_time >= turn.event_time]
            if after:
                found.add(min(after, key=lambda r: (r.event_time, r.block_index)).block_index)
        return found

    def _summary_withdrawn(self, key: str, items: int) -> None:
        """Summary items withdrawn from a conversation: said on the live stream (`summary.withdrawn`),
        which redacts its earlier `summary.updated` events — they showed the withdrawn items' words."""
        self.memory.emit("summary.withdrawn", {"conversation": scope_from_key(key).as_dict(), "items": items})

    def erasure_unfinished(self, user_id: str) -> bool:
        """An erasure of this user was begun and cut short (the process died, or the database went
        away after part of it was done): the next `forget_user` finishes it, and counts only what
        was left."""
        return user_id in self.tables.erasures_pending()

    def resume_erasures(self) -> list[str]:
        """Finish the erasures a crash interrupted (they were recorded before they began)."""
        done = []
        for user_id in self.tables.erasures_pending():
            with self.commit_lock:
                self._erase(user_id)
                self.tables.erasure_end(user_id)
            done.append(user_id)
        return done

    def _erase(self, user_id: str) -> dict[str, int]:
        """Every step can run again: a resumed erasure repeats what a crash cut short."""
        stated = sorted({s.message_id for s in self.tables.fact_sources_by_user(user_id) if s.message_id is not None})
        withdrawn = self.facts.forget_statements(stated) if stated else []
        about = self.facts.forget_user(user_id)
        turns = self.tables.l1_user_blocks(user_id)
        blocks = {*turns, *self.memory.store.live_blocks_of_user(user_id)}
        blocks |= set(self.tables.notes_copying(user_id))  # promoted before notes had users
        recent = self.tables.user_l1_rows(user_id)
        reply_blocks, reply_rows = self.replies_to(recent, blocks)
        blocks |= reply_blocks
        said = [b.text for b in self.memory.store.get_many(sorted(blocks)).values() if len(b.text) >= 8]
        # her recent messages whose turns were still to be written (`index="behind"`): no block to
        # forget, but their texts may be cache keys already (the guard's vectors, passages in flight)
        unwritten = [row.content for row in [*recent, *reply_rows] if row.block_index is None]
        erased, refreshed = self.memory.forget_with_neighbours(sorted(blocks), unwritten) \
            if blocks or unwritten else ([], [])
        # counted before: forgetting their turns' blocks takes the rows that held them with it
        removed = max(len(recent), self.tables.l1_delete_user(user_id))
        self.tables.l1_delete_messages([row.message_id for row in reply_rows])
        names = [name for name, *_ in self.tables.user_names_of(user_id)]
        summary_items = self.summaries.forget_user(user_id, names)
        self.tables.user_names_delete(user_id)
        answers = self.memory.store.idempotency.redact_answers(set(erased), [user_id, *said])
        self.memory.emit("user.erased", {"user": user_id, "blocks": sorted({*erased, *about, *withdrawn})})
        return {"facts": len(set(about) | set(withdrawn)), "messages": len(erased), "blocks": len(erased),
                "l1_rows": removed, "summary_items": summary_items, "names": len(names),
                "neighbours_reembedded": len(refreshed), "stored_answers": answers}


def _json_object(text: Any) -> dict[str, Any]:
    try:
        data = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _source(row: FactSourceRow) -> dict[str, Any]:
    """A fact's statement as a user's data shows it: the message (its id and conversation) or the
    key that wrote it, and when it was said and learned."""
    return {"said_at": row.said_at, "message_id": row.name, "user": row.user_id, "author": row.author,
            "conversation": scope_from_key(row.scope_key).as_dict() if row.scope_key else None,
            "recorded_at": row.recorded_at}

"""What each dashboard page shows, as plain data for its template: the engine's own views
(`Memory.stats`, `layer_stats`, `search`, `neighbours`, `working_slots`, `stm_entries`, the
conversation layers) trimmed to a page. Nothing here renders HTML and nothing reads a request:
the routes pass in the caller's open tenant and already-checked parameters.

Every list is bounded (a page of it, never all of it), so a page costs the same at 100k blocks
as at 100."""

from __future__ import annotations

import statistics
from typing import Any

from ...chat.conversation.facts import LORE_GUILD, Fact
from ...chat.conversation.recent import conversation_of
from ...errors import NotFoundError
from ...store.conversation import UserRow
from ...types import Scope
from ..events import EventBus
from ..tenants import Tenant

__all__ = ["LAYERS", "BREAKDOWN", "TIMINGS", "PAGE", "overview", "search", "context", "conversations",
           "conversation", "facts", "find_source", "health", "bar_scale", "users", "user_row", "user"]

LAYERS = ("working_memory", "cache", "checkpoint", "full")  # the order a search tries them in
BREAKDOWN = ("bm25", "vector", "neighbour", "importance", "recency")  # the parts of a hit's score, drawn as bars
TIMINGS = ("stage1_ms", "stage2_ms", "recall_ms", "first_token_ms", "generation_ms")  # a bot turn, charted live
PAGE = 50  # rows per page of every list
LATENCY_SEARCHES = 200  # the overview's latency chart: this many last searches
MAX_SCAN = 10_000  # facts and channels are paged by slicing a bounded read: no page reaches deeper than this
SOURCE_SCAN = 5_000  # turns of one user looked through for a fact's source message
USER_SCAN = 20  # pages of `users_page` looked through for one user's row (ids just below theirs come first)


def bar_scale(values: list[float]) -> float:
    """The value a full bar stands for: 1, or the largest value when one exceeds 1 (a BM25
    score or a neighbour bonus may), so the bars of one part compare across hits."""
    return max([1.0, *[v for v in values if v == v]])  # v == v: NaN never sets the scale


def overview(t: Tenant, bus: EventBus, tenant: str) -> dict[str, Any]:
    stats = t.memory.stats().as_dict()
    stats.pop("path", None)  # where the server keeps files is not the caller's business
    layer_stats = t.memory.layer_stats()
    counters = layer_stats.get("layers", {})
    parts = ("attempts", "answers", "hit_rate", "avg_ms")
    layers: list[dict[str, Any]] = [{"name": name, **{k: counters.get(name, {}).get(k, 0) for k in parts}}
                                    for name in LAYERS]
    slowest = max([row["avg_ms"] for row in layers] + [1.0])
    for row in layers:
        row["ms_share"] = row["avg_ms"] / slowest
    events = bus.recent(tenant, "search.answered", LATENCY_SEARCHES)
    latency: list[dict[str, Any]] = [{"seq": e.seq, "time": e.time, "ms": float(e.data.get("search_time_ms", 0.0)),
                "source": str(e.data.get("source", "")), "query": str(e.data.get("query", ""))} for e in events]
    times: list[float] = [row["ms"] for row in latency]
    summary = None
    if times:
        ordered = sorted(times)
        summary = {"count": len(times), "mean": statistics.fmean(times), "p50": ordered[len(ordered) // 2],
                   "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], "max": ordered[-1]}
    kinds = sorted(stats.get("by_kind", {}).items(), key=lambda kv: -kv[1])
    return {"stats": stats, "kinds": kinds, "kind_scale": max([1, *[n for _, n in kinds]]), "layers": layers,
            "searches": layer_stats.get("searches", 0), "cache": layer_stats.get("cache", {}),
            "latency": latency, "latency_recent": latency[-10:][::-1], "latency_summary": summary}


def search(t: Tenant, query: str, k: int, scope: dict[str, str], kind: str | None, mode: str) -> dict[str, Any]:
    result = t.memory.search(query, k, scope=scope or None, kinds=kind, mode=mode).as_dict()
    hits = result["hits"]
    # each part against its own largest value: BM25 scores are unbounded, the others mostly 0–1
    scales = {part: bar_scale([float(hit["breakdown"].get(part) or 0.0) for hit in hits]) for part in BREAKDOWN}
    for hit in hits:
        hit["bars"] = [{"name": part, "value": float(hit["breakdown"].get(part) or 0.0)} for part in BREAKDOWN]
    return {"result": result, "scales": scales}


def context(t: Tenant, block_index: int, window: int = 3) -> dict[str, Any]:
    """A block and the turns around it in its conversation."""
    block = t.memory.get(block_index)
    around = t.memory.neighbours(block_index, window) if not block.forgotten else [block]
    return {"block": block.as_dict(), "around": [b.as_dict() for b in around]}


def conversations(t: Tenant, page: int) -> dict[str, Any]:
    start = page * PAGE
    rows = t.conversation.channels(min(start + PAGE + 1, MAX_SCAN))[start:]
    return {"channels": rows[:PAGE], "page": page, "more": len(rows) > PAGE}


def conversation(t: Tenant, guild: str | None, channel: str) -> dict[str, Any]:
    where = conversation_of(guild, channel)
    messages = t.conversation.recent_messages(where, PAGE * 2)
    return {"where": where.as_dict(), "messages": messages[::-1],  # newest first, as a feed reads
            "flagged": sum(1 for m in messages if m.get("flagged")),
            "summary": t.conversation.summary_view(where),
            "slots": t.memory.working_slots(where),
            "stm": t.memory.stm_entries(where, PAGE)}


def _subject(fact: Fact) -> tuple[str, str]:
    if fact.guild == LORE_GUILD or fact.fact_type == "lore":
        return "lore", ""
    if fact.fact_type == "guild_fact":
        return "guild", fact.guild or ""
    return "user", fact.user_id or ""


def facts(t: Tenant, *, user: str | None, guild: str | None, history: bool, page: int) -> dict[str, Any]:
    """One page of facts grouped by subject (users, guilds, lore), each current fact with the
    superseded facts it replaced (when `history`)."""
    start = page * PAGE
    found = t.conversation.facts.facts(user_id=user, guild=guild, include_history=history,
                                       limit=min(start + PAGE + 1, MAX_SCAN))[start:]
    more = len(found) > PAGE
    found = found[:PAGE]
    replaced: dict[int, list[Fact]] = {}
    for fact in found:
        if fact.superseded_by is not None:
            replaced.setdefault(fact.superseded_by, []).append(fact)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    shown: set[int] = set()
    on_page = {fact.block_index for fact in found}
    for fact in found:
        if fact.superseded_by is not None and fact.superseded_by in on_page:
            continue  # shown under the fact that replaced it
        chain, todo = [], list(replaced.get(fact.block_index, []))
        while todo:  # the whole line of facts this one replaced, newest first
            old = todo.pop()
            if old.block_index in shown:
                continue
            shown.add(old.block_index)
            chain.append(old.as_dict())
            todo.extend(replaced.get(old.block_index, []))
        chain.sort(key=lambda f: -f["valid_from"])
        groups.setdefault(_subject(fact), []).append({**fact.as_dict(), "history": chain})
    order = {"user": 0, "guild": 1, "lore": 2}
    return {"groups": [{"kind": kind, "subject": subject, "facts": rows}
                       for (kind, subject), rows in sorted(groups.items(), key=lambda g: (order[g[0][0]], g[0][1]))],
            "count": len(found), "page": page, "more": more}


def find_source(t: Tenant, block_index: int) -> int | None:
    """The turn block a fact was extracted from: the fact names its source message (the
    transport's message id, or the L1 row's id), and the turn written from that message carries
    the same id in its metadata. Only that user's turns are looked through, newest first."""
    rows = t.conversation.tables.facts_get([block_index])
    row = rows.get(block_index)
    if row is None or not row.source_message or not row.user_id:
        return None
    wanted = str(row.source_message)
    before: int | None = None
    scanned = 0
    while scanned < SOURCE_SCAN:
        blocks = t.memory.list_blocks(scope=Scope(user=row.user_id), kinds="turn", before=before, limit=200)
        for block in blocks:
            meta = block.metadata or {}
            if str(meta.get("external_id", "")) == wanted or str(meta.get("l1_message", "")) == wanted:
                return block.block_index
        if len(blocks) < 200:
            return None
        scanned += len(blocks)
        before = blocks[-1].block_index
    return None


def health(t: Tenant, bot: Any) -> dict[str, Any]:
    """The bot's stages and its providers' keys, when a bot runs in this process and this
    tenant is its memory (another tenant sees none of it)."""
    if bot is None or t.memory is not getattr(getattr(bot, "pipeline", None), "memory", None):
        return {"bot": None}
    llm = getattr(bot, "llm", None)
    llm_health = getattr(llm, "health", None)
    key_status = getattr(llm, "key_status", None)
    return {"bot": bot.health.as_dict(),
            "providers": llm_health.as_dict() if llm_health is not None and hasattr(llm_health, "as_dict") else None,
            "keys": key_status() if callable(key_status) else []}


# -- users ----------------------------------------------------------------------------------------

def users(t: Tenant, after: str | None) -> dict[str, Any]:
    """A page of the tenant's users in id order after `after` (the previous page's `next`)."""
    found = t.conversation.tables.users_page(after, PAGE + 1)
    rows = [u.as_dict() for u in found[:PAGE]]
    return {"users": rows, "after": after, "next": rows[-1]["user"] if len(found) > PAGE else None}


def user_row(t: Tenant, user_id: str) -> UserRow | None:
    """One user's row (`users_page` pages by id, so the paging starts just below theirs: at
    their id without its last character), or None when this memory holds nothing of them."""
    after: str | None = user_id[:-1] or None
    for _ in range(USER_SCAN):
        rows = t.conversation.tables.users_page(after, 500)
        for row in rows:
            if row.user_id == user_id:
                return row
            if row.user_id > user_id:
                return None
        if len(rows) < 500:
            return None
        after = rows[-1].user_id
    return None


def _source(row: Any) -> dict[str, Any]:
    """A statement of a fact as the user page shows it: the message that said it (its id) or the
    key that wrote it, and when."""
    return {"message": row.name, "author": row.author, "said_at": row.said_at, "recorded_at": row.recorded_at}


def user(t: Tenant, user_id: str, page: int = 0) -> dict[str, Any]:
    """A user's row and their facts, each line of versions (`FactStore.history`) newest first,
    every version with its period, whether it is current, and its sources. NotFoundError when
    this memory holds nothing of them."""
    row = user_row(t, user_id)
    found = t.conversation.facts.facts(user_id=user_id, include_history=True, limit=MAX_SCAN)
    if row is None and not found:
        raise NotFoundError(f"no user {user_id!r} in this memory")
    heads = sorted((f for f in found if f.superseded_by is None), key=lambda f: (-f.valid_from, -f.block_index))
    start = page * PAGE
    lines: list[dict[str, Any]] = []
    for head in heads[start : start + PAGE]:
        try:
            versions = t.conversation.facts.history(head.block_index)
        except NotFoundError:
            continue  # forgotten meanwhile
        shown = [{**fact.as_dict(), "current": fact.current, "sources": [_source(s) for s in sources]}
                 for fact, sources in reversed(versions)] or [{**head.as_dict(), "current": head.current,
                                                               "sources": []}]
        lines.append({"head": shown[0], "versions": shown})
    return {"user": row.as_dict() if row is not None else {"user": user_id, "names": [], "messages": 0,
                                                            "facts": 0, "conversations": 0, "first_seen": None,
                                                            "last_seen": None},
            "lines": lines, "versions": len(found), "current": sum(1 for f in found if f.current),
            "page": page, "more": len(heads) > start + PAGE}

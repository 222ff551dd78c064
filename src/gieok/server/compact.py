"""What an MCP tool answers by default: what a model needs to use a memory, and nothing else.

An MCP client puts every tool result into the model's context, where it is paid for in tokens:
one search hit as the full record (hashes, digests, the score's parts, keywords) was ~3 kB of
JSON. The compact forms keep the text, the block index (what the other tools take), the speaker,
the time and the score; a tool's `detail: true` gives the full record."""

from __future__ import annotations

from typing import Any

from ..chat.agent.agents import AgentContext, Ingested
from ..chat.conversation.facts import Fact
from ..text.dates import calendar_time
from ..types import Block, SearchResult

__all__ = ["block", "search", "fact", "context", "ingested", "when"]


def when(epoch: float | None) -> str | None:
    """A time as ISO 8601 in UTC, to the second (a model reads it better than epoch seconds)."""
    moment = None if epoch is None else calendar_time(epoch)
    if moment is None:
        return None
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def block(b: Block) -> dict[str, Any]:
    scope = {k: v for k, v in b.scope.as_dict().items() if v is not None}
    out: dict[str, Any] = {"block_index": b.block_index, "text": b.text, "kind": b.kind, "time": when(b.event_time)}
    if b.speaker:
        out["speaker"] = b.speaker
    if scope:
        out["scope"] = scope
    if b.forgotten:
        out["forgotten"] = True
    return out


def search(result: SearchResult) -> dict[str, Any]:
    hits = []
    for hit in result.hits:
        item = {"block_index": hit.block.block_index, "text": hit.block.text, "score": round(hit.score, 4),
                "time": when(hit.block.event_time)}
        if hit.block.speaker:
            item["speaker"] = hit.block.speaker
        hits.append(item)
    return {"hits": hits, "source": result.source, "search_time_ms": round(result.search_time_ms, 2)}


def fact(f: Fact) -> dict[str, Any]:
    out: dict[str, Any] = {"block_index": f.block_index, "text": f.text, "type": f.fact_type,
                           "valid_from": when(f.valid_from), "current": f.valid_to is None}
    if f.valid_to is not None:
        out["valid_to"] = when(f.valid_to)
    if f.user_id:
        out["user"] = f.user_id
    if f.guild:
        out["guild"] = f.guild
    return out


def context(found: AgentContext) -> dict[str, Any]:
    out: dict[str, Any] = {"text": found.text, "language": found.language, "tokens": found.tokens["total"]}
    if found.conversation is None:  # a channel never seen: the warning says where it looked
        out["conversation"] = None
    if found.warnings:
        out["warnings"] = found.warnings
    return out


def ingested(result: Ingested) -> dict[str, Any]:
    data = result.as_dict()
    return {"stored": len(data["stored"]), "duplicates": data["duplicates"],
            "edited": [message["id"] for message in data["edited"]], "flagged": data["flagged"],
            "summaries_and_facts": data["summaries_and_facts"], "extraction": data["extraction"],
            "index": data["index"]}

"""The SHA-256 hash chain over blocks.

Each block's hash covers its header and a digest of its content, never the content
itself, so `forget` can erase the content for privacy and the chain still verifies:
the digest stays, proving that *something* was there without revealing what.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Block

__all__ = ["GENESIS", "canonical_json", "content_digest", "block_hash", "digest_of", "hash_of"]

GENESIS = "0" * 64


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def content_digest(text: str, speaker: str | None, keywords: list[str], tags: list[str],
                   metadata: dict[str, Any]) -> str:
    payload = {"text": text, "speaker": speaker, "keywords": keywords, "tags": tags, "metadata": metadata}
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def block_hash(
    *,
    block_index: int,
    prev_hash: str,
    kind: str,
    guild: str | None,
    channel: str | None,
    user: str | None,
    event_time: float,
    insert_time: float,
    importance: float,
    conv_pos: int | None,
    digest: str,
) -> str:
    header = {
        "i": block_index,
        "prev": prev_hash,
        "kind": kind,
        "scope": [guild, channel, user],
        "event_time": f"{event_time:.6f}",
        "insert_time": f"{insert_time:.6f}",
        "importance": f"{importance:.6f}",
        "conv_pos": conv_pos,
        "digest": digest,
    }
    return hashlib.sha256(canonical_json(header).encode("utf-8")).hexdigest()


def digest_of(block: Block) -> str:
    """The content digest a live block should carry."""
    return content_digest(block.text, block.speaker, list(block.keywords), list(block.tags), block.metadata)


def hash_of(block: Block) -> str:
    """The hash a block should carry, from its header and stored digest."""
    return block_hash(
        block_index=block.block_index, prev_hash=block.prev_hash, kind=block.kind, guild=block.scope.guild,
        channel=block.scope.channel, user=block.scope.user, event_time=block.event_time,
        insert_time=block.insert_time, importance=block.importance, conv_pos=block.conv_pos,
        digest=block.content_digest,
    )

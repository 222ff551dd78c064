"""How new blocks join the chain — shared by every backend, so the hashes cannot drift apart:
consecutive indices after the last block, each linked to the hash before it, and a conversation
position for each turn in a channel (one more than the channel's last)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..chain import block_hash, content_digest
from ..types import Block
from .base import NewBlock

__all__ = ["link_blocks"]


def link_blocks(blocks: Sequence[NewBlock], insert_time: float, last_index: int, prev_hash: str,
                last_position: Callable[[str], int]) -> list[Block]:
    """The blocks as they will be stored. `last_position(channel)` is the channel's highest
    conversation position so far (0 if none); it is asked once per channel."""
    out: list[Block] = []
    positions: dict[str, int] = {}
    index = last_index
    for new in blocks:
        index += 1
        conv_pos = None
        channel = new.scope.channel
        if channel is not None and new.kind == "turn":  # only turns make up the conversation
            if channel not in positions:
                positions[channel] = last_position(channel)
            positions[channel] += 1
            conv_pos = positions[channel]
        digest = content_digest(new.text, new.speaker, new.keywords, new.tags, new.metadata)
        hash_ = block_hash(
            block_index=index, prev_hash=prev_hash, kind=new.kind, guild=new.scope.guild, channel=channel,
            user=new.scope.user, event_time=new.event_time, insert_time=insert_time, importance=new.importance,
            conv_pos=conv_pos, digest=digest,
        )
        out.append(Block(
            block_index=index, kind=new.kind, text=new.text, scope=new.scope, speaker=new.speaker,
            event_time=new.event_time, insert_time=insert_time, importance=new.importance,
            keywords=tuple(new.keywords), tags=tuple(new.tags), metadata=new.metadata, conv_pos=conv_pos,
            content_digest=digest, prev_hash=prev_hash, hash=hash_,
        ))
        prev_hash = hash_
    return out

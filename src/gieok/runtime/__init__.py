"""The chat runtime between a transport (Discord, terminal, HTTP) and the agent: deciding
whether a message calls the bot, and turning the model's text into chat messages."""

from .calls import (
    CallDetector,
    CallHow,
    CallMatch,
    fold_for_matching,
    has_batchim,
    particle_variant,
)
from .postprocess import (
    MIN_CHUNK_LIMIT,
    EditThrottle,
    MessageOp,
    StreamView,
    chunk_message,
    correct_self_reference,
    render_mentions,
    stream_view,
)

__all__ = [
    "CallDetector", "CallMatch", "CallHow", "has_batchim", "particle_variant", "fold_for_matching",
    "render_mentions", "correct_self_reference", "chunk_message", "MIN_CHUNK_LIMIT",
    "EditThrottle", "StreamView", "MessageOp", "stream_view",
]

"""The chat runtime between a transport (Discord, terminal, HTTP) and the agent: the bot core
(debounce, batching, rate limits, streaming), deciding whether a message calls the bot, and
turning the model's text into chat messages."""

from .calls import (
    CallDetector,
    CallHow,
    CallMatch,
    fold_for_matching,
    has_batchim,
    particle_variant,
)
from .core import BotCore, ChannelRef, InboundMessage, Outbox, Reply
from .health import Health, TurnTimings
from .postprocess import (
    MIN_CHUNK_LIMIT,
    EditThrottle,
    MessageOp,
    SelfCorrector,
    StreamView,
    chunk_message,
    correct_self_reference,
    render_mentions,
    stream_view,
)

__all__ = [
    "BotCore", "InboundMessage", "Outbox", "ChannelRef", "Reply", "Health", "TurnTimings",
    "CallDetector", "CallMatch", "CallHow", "has_batchim", "particle_variant", "fold_for_matching",
    "render_mentions", "SelfCorrector", "correct_self_reference", "chunk_message", "MIN_CHUNK_LIMIT",
    "EditThrottle", "StreamView", "MessageOp", "stream_view",
]

"""The conversation layers over one `Memory`: L1 recent messages, L2 rolling summaries and L3
facts (with their alignment judge), and `ConversationMemory`, which holds all three."""

from .facts import Fact, FactStore, FactType, PairJudge, visible
from .memory import ConversationMemory
from .recent import RecentMessages, conversation_key, conversation_of
from .summary import ChannelSummary, SummaryStore

__all__ = [
    "ConversationMemory", "RecentMessages", "conversation_of", "conversation_key", "ChannelSummary", "SummaryStore",
    "Fact", "FactStore", "FactType", "PairJudge", "visible",
]

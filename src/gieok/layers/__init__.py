"""The layers a search can be answered from — working memory, short-term memory, the result
cache, checkpoint-localized search and the coordinator that tries them in order — and the
conversation layers: L1 recent messages, L2 rolling summaries, L3 facts."""

from .cache import SearchCache
from .checkpoints import Checkpoint, CheckpointManager
from .conversation import ConversationMemory
from .coordinator import CoordinatorConfig, LayeredResult, SearchCoordinator
from .facts import Fact, FactStore, FactType, PairJudge, visible
from .localized import LocalizedSearch
from .recent import RecentMessages, conversation_key, conversation_of
from .stm import HybridSTM, ShortTermMemory
from .summary import ChannelSummary, SummaryStore
from .working import Slot, SlotPriority, WorkingMemory

__all__ = [
    "WorkingMemory", "Slot", "ShortTermMemory", "HybridSTM", "Checkpoint", "CheckpointManager",
    "LocalizedSearch", "SearchCache", "SearchCoordinator", "CoordinatorConfig", "LayeredResult", "SlotPriority",
    "ConversationMemory", "RecentMessages", "conversation_of", "conversation_key", "ChannelSummary", "SummaryStore",
    "Fact", "FactStore", "FactType", "PairJudge", "visible",
]

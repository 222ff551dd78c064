"""The layers a search can be answered from — working memory, short-term memory, the result
cache, checkpoint-localized search — and the coordinator that tries them in order. (The
conversation layers that use a `Memory` — L1, L2, L3 — are the chat's: `gieok.chat.conversation`.)"""

from .cache import SearchCache
from .checkpoints import Checkpoint, CheckpointManager
from .coordinator import CoordinatorConfig, LayeredResult, SearchCoordinator
from .localized import LocalizedSearch
from .stm import HybridSTM, ShortTermMemory
from .working import Slot, SlotPriority, WorkingMemory

__all__ = [
    "WorkingMemory", "Slot", "ShortTermMemory", "HybridSTM", "Checkpoint", "CheckpointManager",
    "LocalizedSearch", "SearchCache", "SearchCoordinator", "CoordinatorConfig", "LayeredResult", "SlotPriority",
]

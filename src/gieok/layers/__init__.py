"""The layers a search can be answered from: working memory, short-term memory, the
result cache, checkpoint-localized search and the coordinator that tries them in order."""

from .cache import SearchCache
from .checkpoints import Checkpoint, CheckpointManager
from .coordinator import CoordinatorConfig, LayeredResult, SearchCoordinator
from .localized import LocalizedSearch
from .stm import HybridSTM, ShortTermMemory
from .working import Slot, WorkingMemory

__all__ = [
    "WorkingMemory", "Slot", "ShortTermMemory", "HybridSTM", "Checkpoint", "CheckpointManager",
    "LocalizedSearch", "SearchCache", "SearchCoordinator", "CoordinatorConfig", "LayeredResult",
]

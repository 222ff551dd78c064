"""gieok (기억): a layered memory engine for LLM chat agents.

    from gieok import Memory
    with Memory.open("chat.db") as memory:
        memory.add("민지: 고양이 이름은 나비야", scope={"channel": "general"}, speaker="민지")
        for hit in memory.search("민지 고양이 이름", scope={"channel": "general"}):
            print(hit.score, hit.block.text)
"""

from .config import Settings, load_settings
from .errors import *  # noqa: F403 - the exception hierarchy is public
from .errors import __all__ as _errors_all
from .memory import Memory
from .store.base import VerifyReport
from .types import Block, Hit, Kind, Scope, ScoreBreakdown, SearchResult, Stats

__version__ = "0.1.0"

__all__ = [
    "Memory", "Settings", "load_settings", "Block", "Hit", "Kind", "Scope", "ScoreBreakdown",
    "SearchResult", "Stats", "VerifyReport", "__version__", *_errors_all,
]

"""The agent half of the bot: guardrails, the gatekeeper, context assembly and the
conversation pipeline that runs them in order."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import AssembledPrompt, Budget, ContextBuilder
    from .gatekeeper import Analyst, Decision, Extraction
    from .guard import GuardVerdict, InjectionGuard
    from .guardrails import MessageGuard, is_meta_fact
    from .pipeline import ConversationPipeline, IncomingMessage, Plan

__all__ = ["ConversationPipeline", "IncomingMessage", "Plan", "InjectionGuard", "GuardVerdict", "MessageGuard",
           "is_meta_fact", "Analyst", "Decision", "Extraction", "ContextBuilder", "AssembledPrompt", "Budget"]

# Loaded when first asked for (PEP 562), as `gieok.chat` does: a module of this package read for one
# constant (the benchmarks' options read the guard's threshold) must not load the pipeline.
_HOMES = {"ConversationPipeline": ".pipeline", "IncomingMessage": ".pipeline", "Plan": ".pipeline",
          "InjectionGuard": ".guard", "GuardVerdict": ".guard", "MessageGuard": ".guardrails",
          "is_meta_fact": ".guardrails", "Analyst": ".gatekeeper", "Decision": ".gatekeeper",
          "Extraction": ".gatekeeper", "ContextBuilder": ".context", "AssembledPrompt": ".context",
          "Budget": ".context"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value

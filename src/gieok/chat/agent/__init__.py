"""The agent half of the bot: guardrails, the gatekeeper, context assembly and the
conversation pipeline that runs them in order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_members import lazy_members

if TYPE_CHECKING:
    from .context import AssembledPrompt, Budget, ContextBuilder
    from .gatekeeper import Analyst, Decision, Extraction
    from .guard import GuardVerdict, InjectionGuard
    from .guardrails import MessageGuard, is_meta_fact
    from .pipeline import ConversationPipeline, IncomingMessage, Plan

__all__ = ["ConversationPipeline", "IncomingMessage", "Plan", "InjectionGuard", "GuardVerdict", "MessageGuard",
           "is_meta_fact", "Analyst", "Decision", "Extraction", "ContextBuilder", "AssembledPrompt", "Budget"]

# Loaded when first asked for: chat/lazy_members.py says why.
_HOMES = {"ConversationPipeline": ".pipeline", "IncomingMessage": ".pipeline", "Plan": ".pipeline",
          "InjectionGuard": ".guard", "GuardVerdict": ".guard", "MessageGuard": ".guardrails",
          "is_meta_fact": ".guardrails", "Analyst": ".gatekeeper", "Decision": ".gatekeeper",
          "Extraction": ".gatekeeper", "ContextBuilder": ".context", "AssembledPrompt": ".context",
          "Budget": ".context"}

__getattr__ = lazy_members(__name__, _HOMES)

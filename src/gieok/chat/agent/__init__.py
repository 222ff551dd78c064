"""The agent half of the bot: guardrails, the gatekeeper, context assembly and the
conversation pipeline that runs them in order."""

from .context import AssembledPrompt, Budget, ContextBuilder
from .gatekeeper import Analyst, Decision, Extraction
from .guard import GuardVerdict, InjectionGuard
from .guardrails import MessageGuard, is_meta_fact
from .pipeline import ConversationPipeline, IncomingMessage, Plan

__all__ = ["ConversationPipeline", "IncomingMessage", "Plan", "InjectionGuard", "GuardVerdict", "MessageGuard",
           "is_meta_fact", "Analyst", "Decision", "Extraction", "ContextBuilder", "AssembledPrompt", "Budget"]

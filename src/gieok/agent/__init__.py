"""The agent half of the bot: guardrails first (more — gatekeeper, context assembly — comes
with the conversation-memory issue)."""

from .guard import GuardVerdict, InjectionGuard

__all__ = ["InjectionGuard", "GuardVerdict"]

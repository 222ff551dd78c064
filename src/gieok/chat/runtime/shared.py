"""A message waiting for its turn, as it travels between bot processes through a channel's
shared inbox (`coordination.SharedChannels`): the message, whether it called the bot, and what
observing it stored (its L1 row, the guard's verdict), so the process that answers it plans
exactly as the one that received it would have."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ...store.conversation import L1Row
from ..agent.guard import GuardVerdict
from ..agent.pipeline import IncomingMessage, Observation
from ..conversation.recent import conversation_of

__all__ = ["to_payload", "from_payload"]

PAYLOAD_VERSION = 1


def to_payload(message: Any, observation: Observation, explicit: bool) -> dict[str, Any]:
    """`message` is the runtime's InboundMessage (not imported: core.py imports this module)."""
    return {
        "v": PAYLOAD_VERSION,
        "message": {"channel": message.ref.channel, "guild": message.ref.guild, "user_id": message.user_id,
                    "content": message.content, "display_name": message.display_name,
                    "message_id": message.message_id, "mentions": list(message.mentions),
                    "reply_to_bot": message.reply_to_bot, "timestamp": message.timestamp,
                    "privileged": message.privileged},
        "explicit": explicit,
        "incoming": asdict(observation.message),
        "verdict": {"score": observation.verdict.score, "attack": observation.verdict.attack,
                    "matches": list(observation.verdict.matches)},
        "row": asdict(observation.row),
        "first": observation.first,
    }


def from_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], Observation, bool]:
    """(the message's fields for InboundMessage, its observation, explicit)."""
    if payload.get("v") != PAYLOAD_VERSION:
        raise ValueError(f"a queued message of payload version {payload.get('v')!r}; this gieok reads "
                         f"{PAYLOAD_VERSION} (all processes of a deployment must run the same version)")
    fields = dict(payload["message"])
    fields["mentions"] = tuple(fields.get("mentions") or ())
    incoming = IncomingMessage(**payload["incoming"])
    verdict = payload["verdict"]
    observation = Observation(incoming, conversation_of(incoming.guild, incoming.channel),
                              GuardVerdict(float(verdict["score"]), bool(verdict["attack"]), tuple(verdict["matches"])),
                              L1Row(**payload["row"]), bool(payload["first"]))
    return fields, observation, bool(payload["explicit"])

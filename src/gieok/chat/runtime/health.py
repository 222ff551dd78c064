"""What an operator asks a running bot: is it well (`status`), and how long did the last turn
take, stage by stage (`timer`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Health", "StageHealth", "TurnTimings", "STAGES"]

STAGES = ("observe", "gatekeeper", "recall", "generation", "send", "record", "shared")


@dataclass
class StageHealth:
    successes: int = 0
    failures: int = 0
    last_success: float | None = None
    last_failure: float | None = None
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"successes": self.successes, "failures": self.failures, "last_success": self.last_success,
                "last_failure": self.last_failure, "last_error": self.last_error}


@dataclass
class Health:
    clock: Callable[[], float] = time.time
    started: float = field(default_factory=time.time)
    stages: dict[str, StageHealth] = field(default_factory=lambda: {name: StageHealth() for name in STAGES})
    messages_in: int = 0
    replies_out: int = 0
    rate_limited: int = 0
    merged: int = 0  # plans redone because the same user wrote again while planning
    duplicates: int = 0  # messages another process (a replica) had already taken in
    claims_taken_over: int = 0  # messages taken in here because the process that claimed them died first
    caught_up: int = 0  # messages taken in from a channel's history after a (re)connect: said while nobody listened
    edited: int = 0  # stored messages replaced by their edit where they were said
    deleted: int = 0  # stored messages erased because they were deleted where they were said
    limited_calls: int = 0  # calls not answered: a user's, a channel's limit or a guild's budget was spent
    notices: int = 0  # limit notices sent (one per window)
    # model calls by purpose ("reply", "decide", "extract"); the pipeline's counter, shared
    model_calls: Counter[str] = field(default_factory=Counter)

    def ok(self, stage: str) -> None:
        entry = self.stages[stage]
        entry.successes += 1
        entry.last_success = self.clock()

    def failed(self, stage: str, error: BaseException | str) -> None:
        entry = self.stages[stage]
        entry.failures += 1
        entry.last_failure = self.clock()
        entry.last_error = str(error)[:300]

    def model_calls_per_reply(self) -> float | None:
        """Every model call (replies, decisions, extractions) over the replies sent: what a reply costs."""
        return round(sum(self.model_calls.values()) / self.replies_out, 3) if self.replies_out else None

    def as_dict(self) -> dict[str, Any]:
        return {"uptime_s": round(self.clock() - self.started, 1), "messages_in": self.messages_in,
                "replies_out": self.replies_out, "rate_limited": self.rate_limited, "merged": self.merged,
                "duplicates": self.duplicates, "claims_taken_over": self.claims_taken_over,
                "caught_up": self.caught_up,
                "edited": self.edited, "deleted": self.deleted, "limited_calls": self.limited_calls,
                "notices": self.notices, "model_calls": dict(self.model_calls),
                "model_calls_per_reply": self.model_calls_per_reply(),
                "stages": {name: s.as_dict() for name, s in self.stages.items()}}


@dataclass
class TurnTimings:
    """One turn, in milliseconds: debounce wait, gatekeeper stage 1 and 2, recall, generation
    (to the first token and in total), sending, and the pipeline overhead without the LLM."""

    channel: str
    messages: int
    debounce_ms: float = 0.0
    stage1_ms: float = 0.0
    stage2_ms: float = 0.0
    recall_ms: float = 0.0
    first_token_ms: float = 0.0  # generation start → first token (includes the provider)
    provider_first_token_ms: float = 0.0  # of which: the provider's time to its first token
    generation_ms: float = 0.0
    send_ms: float = 0.0
    overhead_ms: float = 0.0  # message ready (debounce over) → prompt ready, LLM calls excluded
    to_first_token_ms: float = 0.0  # debounce over → first token out
    turn_overhead_ms: float = 0.0  # the same without the stage-2 call and the provider's first-token wait
    responded: bool = False
    reason: str = ""
    ready_at: float = 0.0  # the runtime clock when the debounce ended (not a duration)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items() if k != "ready_at"}

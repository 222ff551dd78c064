"""Rate limits on unsolicited replies: per channel and across all channels.

Only replies the bot volunteers are limited. Explicit calls and messages the gatekeeper is
very sure about bypass the limits; a message that is limited is still in L1 and long-term
memory (it was observed on arrival), so it is never lost — the bot just stays quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RateLimiter"]


@dataclass
class RateLimiter:
    channel_seconds: float = 20.0
    global_seconds: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _last_channel: dict[str, float] = field(default_factory=dict)
    _last_global: float | None = None
    limited: int = 0

    def allows(self, channel_key: str, *, bypass: bool = False) -> bool:
        if bypass:
            return True
        now = self.clock()
        last = self._last_channel.get(channel_key)
        if last is not None and now - last < self.channel_seconds:
            return False
        return self._last_global is None or now - self._last_global >= self.global_seconds

    def note_reply(self, channel_key: str) -> None:
        """An unsolicited reply went out now."""
        now = self.clock()
        self._last_channel[channel_key] = now
        self._last_global = now

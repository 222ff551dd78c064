"""Rate limits: on unsolicited replies (per channel and across all channels), and on calls
(per user and per channel: `CallLimits`).

`RateLimiter` limits the replies the bot volunteers; messages the gatekeeper is very sure about
bypass it. `CallLimits` limits how often calls are answered, so one member cannot spend a
community's model budget; owners and moderators bypass it. A message that is limited either way
is still in L1 and long-term memory (it was observed on arrival), so it is never lost — the bot
just stays quiet (after one notice per window, for a call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RateLimiter", "TokenBuckets", "CallLimits"]


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


@dataclass
class TokenBuckets:
    """A token bucket per key: up to `capacity` calls at once, one more every `seconds / capacity`
    (so `capacity` per `seconds` in the long run). `capacity` 0: no limit."""

    capacity: int
    seconds: float
    clock: Callable[[], float] = time.monotonic
    _levels: dict[str, tuple[float, float]] = field(default_factory=dict)  # key → (tokens, when)

    def _level(self, key: str) -> float:
        tokens, when = self._levels.get(key, (float(self.capacity), self.clock()))
        return min(float(self.capacity), tokens + (self.clock() - when) * self.capacity / self.seconds)

    def ready(self, key: str) -> bool:
        return self.capacity <= 0 or self._level(key) >= 1.0

    def take(self, key: str) -> None:
        if self.capacity <= 0:
            return
        self._levels[key] = (self._level(key) - 1.0, self.clock())
        if len(self._levels) > BUCKETS_KEPT:  # forget the full ones: they read the same as new
            self._levels = {k: v for k, v in self._levels.items() if self._level(k) < self.capacity}

    def wait(self, key: str) -> float:
        """Seconds until `key` may take one."""
        if self.capacity <= 0:
            return 0.0
        return max(0.0, (1.0 - self._level(key)) * self.seconds / self.capacity)


BUCKETS_KEPT = 10_000


@dataclass
class CallLimits:
    """How often calls (mentions, replies to the bot, its name) are answered: per user and per
    channel, token buckets. A call over a limit is not answered (it is stored like every
    message); its caller hears about it once per window — a notice, then quiet until the
    bucket has a call again. Owners and moderators (`privileged`) are not limited."""

    users: TokenBuckets
    channels: TokenBuckets
    clock: Callable[[], float] = time.monotonic
    _noticed: dict[str, float] = field(default_factory=dict)  # user key → noticed until

    @classmethod
    def of(cls, user_calls: int, user_seconds: float, channel_calls: int, channel_seconds: float,
           clock: Callable[[], float] = time.monotonic) -> CallLimits:
        return cls(TokenBuckets(user_calls, user_seconds, clock), TokenBuckets(channel_calls, channel_seconds, clock),
                   clock)

    def admit(self, user_key: str, channel_key: str, *, privileged: bool = False) -> float | None:
        """None: answer it (a call is taken from both buckets); else the seconds until this user
        may be answered here again."""
        if privileged:
            return None
        if self.users.ready(user_key) and self.channels.ready(channel_key):
            self.users.take(user_key)
            self.channels.take(channel_key)
            return None
        return max(self.users.wait(user_key), self.channels.wait(channel_key))

    def notice_due(self, user_key: str, wait: float) -> bool:
        """Whether a refused caller should be told (the first refusal of a window)."""
        now = self.clock()
        if self._noticed.get(user_key, 0.0) > now:
            return False
        self._noticed[user_key] = now + max(wait, 1.0)
        if len(self._noticed) > BUCKETS_KEPT:
            self._noticed = {k: v for k, v in self._noticed.items() if v > now}
        return True

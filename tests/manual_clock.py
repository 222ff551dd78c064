"""A clock a test sets by hand, for code that takes `clock: Callable[[], float]`."""

from __future__ import annotations

__all__ = ["HOUR", "ManualClock"]

HOUR = 3600.0


class ManualClock:
    """`clock()` is `now` until the test moves it (`now = …` or `advance(seconds)`)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

"""What text a block's vector is computed from: a turn together with the turns just before it.

A chat turn is often meaningless alone ("시간대 문제였어", "finally!! what was it?"): the
question it answers, or the topic it continues, sits one turn earlier. Embedding each turn with
the previous turn of the same channel (when it came within `gap_seconds`) lets the vector
search find answers that share no words with the question. Measured on LoCoMo dev and the
Korean dev set: docs/benchmarks.md, "Contextual passages". BM25 and the stored text are the
turn's own words only; the context changes nothing but the vector.

Every path that embeds blocks — adding, importing, `gieok reindex` — walks blocks in order
through one `PassageContext`, so a block gets the same vector whichever path wrote it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PassageContext", "PassageSource"]


@dataclass(frozen=True, slots=True)
class PassageSource:
    """The fields of a block that decide its passage text."""

    text: str
    kind: str
    channel: str | None
    event_time: float


EarlierTurns = Callable[[str], Sequence[PassageSource]]


class PassageContext:
    """Walks blocks in append order, remembering each channel's last turns, and returns the
    text to embed for each. `earlier(channel)` supplies the turns already stored before the
    walk began (oldest first); it is asked once per channel."""

    def __init__(self, turns: int, gap_seconds: float, earlier: EarlierTurns | None = None) -> None:
        self.turns = max(0, int(turns))
        self.gap_seconds = float(gap_seconds)
        self._earlier = earlier
        self._recent: dict[str, deque[PassageSource]] = {}

    def text_for(self, block: PassageSource) -> str:
        """The passage text of `block`; turns are then remembered for the blocks after it."""
        if self.turns == 0 or block.kind != "turn" or block.channel is None:
            return block.text
        recent = self._channel(block.channel)
        context = [t.text for t in recent
                   if t.text and abs(block.event_time - t.event_time) <= self.gap_seconds]
        recent.append(block)
        return "\n".join([*context, block.text]) if context else block.text

    def texts_for(self, blocks: Sequence[PassageSource]) -> list[str]:
        return [self.text_for(b) for b in blocks]

    def _channel(self, channel: str) -> deque[PassageSource]:
        recent = self._recent.get(channel)
        if recent is None:
            recent = self._recent[channel] = deque(maxlen=self.turns)
            if self._earlier is not None:
                recent.extend(self._earlier(channel))
        return recent

"""What text a block's vector is computed from: a turn together with the turns just before it.

A chat turn is often meaningless alone ("시간대 문제였어", "finally!! what was it?"): the
question it answers, or the topic it continues, sits one turn earlier. Embedding each turn with
the previous turn of the same channel (when it came within `gap_seconds`) lets the vector
search find answers that share no words with the question. Measured on LoCoMo dev and the
Korean dev set: docs/benchmarks.md, "Contextual passages". BM25 and the stored text are the
turn's own words only; the context changes nothing but the vector.

A turn whose metadata names its speaker (`speaker_name`: the chat bot stores the author's display
name there, since its text and speaker field carry no name) is embedded as "name: text", and so is
each context turn that has one: questions name people ("민지가 추천한 식당"), and a vector that saw
the name finds their turns (docs/benchmarks.md, "Speakers as the chat bot stores them").

Every path that embeds blocks — adding, importing, `gieok reindex` — walks blocks in order
through one `PassageContext`, so a block gets the same vector whichever path wrote it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PassageContext", "PassageSource", "SPEAKER_NAME_KEY", "PASSAGES_KEY", "passage_recipe", "speaker_name_of"]

SPEAKER_NAME_KEY = "speaker_name"  # the metadata key of the name a turn's vector is embedded with
PASSAGES_KEY = "passages"  # the store's meta key of the recipe its vectors were made with (passage_recipe)


def passage_recipe(turns: int, gap_seconds: float, context_words: int = 0) -> str:
    """How turns become passage texts, in words: recorded with a memory's vectors (meta
    `passages`) when it first embeds and by `gieok reindex`. Vectors of two recipes are
    comparable (one model) but not the same, so a memory whose recipe differs from the settings'
    says so (`Memory.stats().passages`) until `gieok reindex` re-embeds it."""
    if turns <= 0:
        return "the turn alone"
    earlier = "the turn before" if turns == 1 else f"the {turns} turns before"
    cut = f" (its last {context_words} words)" if context_words > 0 and turns == 1 else (
        f" (their last {context_words} words each)" if context_words > 0 else "")
    return f"the turn with {earlier}{cut} within {gap_seconds:g} s"


def speaker_name_of(metadata: Any) -> str | None:
    """The speaker's name in a block's metadata (a mapping; anything else has none), if it
    holds a non-blank string there."""
    name = metadata.get(SPEAKER_NAME_KEY) if isinstance(metadata, Mapping) else None
    return name.strip() or None if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class PassageSource:
    """The fields of a block that decide its passage text."""

    text: str
    kind: str
    channel: str | None
    event_time: float
    name: str | None = None  # the speaker's name from the metadata (speaker_name_of)
    speaker: str | None = None  # the block's speaker field: a text that starts "speaker: " keeps it when cut

    @property
    def line(self) -> str:
        return f"{self.name}: {self.text}" if self.name and self.text else self.text

    def context_line(self, words: int) -> str:
        """The line as context for the next turn: its last `words` words (all when 0), the
        speaker's label ("민지: ", from the metadata or at the head of the text) always kept."""
        if words <= 0:
            return self.line
        text = self.text
        label = f"{self.name}: " if self.name else ""
        if not label and self.speaker and text.startswith(f"{self.speaker}: "):
            label, text = f"{self.speaker}: ", text[len(self.speaker) + 2 :]
        kept = text.split()
        return label + " ".join(kept[-words:]) if len(kept) > words else label + text


EarlierTurns = Callable[[str], Sequence[PassageSource]]


class PassageContext:
    """Walks blocks in append order, remembering each channel's last turns, and returns the
    text to embed for each. `earlier(channel)` supplies the turns already stored before the
    walk began (oldest first); it is asked once per channel."""

    def __init__(self, turns: int, gap_seconds: float, earlier: EarlierTurns | None = None,
                 context_words: int = 0) -> None:
        self.turns = max(0, int(turns))
        self.gap_seconds = float(gap_seconds)
        self.context_words = max(0, int(context_words))
        self._earlier = earlier
        self._recent: dict[str, deque[PassageSource]] = {}

    def text_for(self, block: PassageSource) -> str:
        """The passage text of `block`; turns are then remembered for the blocks after it."""
        if block.kind != "turn":
            return block.text
        if self.turns == 0 or block.channel is None:
            return block.line
        recent = self._channel(block.channel)
        context = [t.context_line(self.context_words) for t in recent
                   if t.text and abs(block.event_time - t.event_time) <= self.gap_seconds]
        recent.append(block)
        return "\n".join([*context, block.line]) if context else block.line

    def texts_for(self, blocks: Sequence[PassageSource]) -> list[str]:
        return [self.text_for(b) for b in blocks]

    @property
    def recipe(self) -> str:
        return passage_recipe(self.turns, self.gap_seconds, self.context_words)

    def _channel(self, channel: str) -> deque[PassageSource]:
        recent = self._recent.get(channel)
        if recent is None:
            recent = self._recent[channel] = deque(maxlen=self.turns)
            if self._earlier is not None:
                recent.extend(self._earlier(channel))
        return recent

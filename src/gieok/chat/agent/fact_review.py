"""The extraction model as the fact judge: what it is shown, and how its answer is checked.

Before the (background) extraction call, the current facts about the conversation's users and
its guild are listed with short ids — `F1 <user:42>: <user:42>는 고양이 나비를 키운다.` — and the
model answers, for each new fact, `add`, `duplicate` of an id, `replaces` an id, or `ignore`, in
the same call that extracts the facts (no extra call: the facts about the speakers are known
before it starts). Its answer is checked here against what it was shown: an id it was not shown,
an id about another subject, or an unreadable action leaves that fact to the offline judge
(`conversation.facts.PairJudge`) — the fact is never dropped and no stored fact changes on a bad
answer. `FactStore.add` checks once more, at write time, that the named fact is still current.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..conversation.facts import FactOutcome, FactStore, FactType, ModelVerdict, Statement
from .gatekeeper import ExtractedFact

__all__ = ["KnownFact", "KnownFacts", "list_known_facts", "review", "store_reviewed", "MAX_SHOWN_PER_SUBJECT",
           "MAX_SHOWN"]

MAX_SHOWN_PER_SUBJECT = 20  # the newest facts of each user (and of the guild)
MAX_SHOWN = 60  # in one prompt
MAX_SHOWN_CHARS = 300  # a fact's text in the list


@dataclass(frozen=True, slots=True)
class KnownFact:
    ref: str  # "F1"
    block_index: int
    user_id: str | None  # None: a guild fact
    text: str


@dataclass(frozen=True)
class KnownFacts:
    items: tuple[KnownFact, ...] = ()

    def render(self) -> str:
        """The list as the prompt shows it, one fact a line; "-" when there is none."""
        if not self.items:
            return "-"
        return "\n".join(f"{k.ref} {f'<user:{k.user_id}>' if k.user_id else 'server'}: "
                         f"{' '.join(k.text.split())[:MAX_SHOWN_CHARS]}" for k in self.items)

    def get(self, ref: str) -> KnownFact | None:
        return next((k for k in self.items if k.ref == ref), None)

    def shown(self, user_id: str | None) -> frozenset[int]:
        """Block indices of the facts shown about one subject (None: the guild)."""
        return frozenset(k.block_index for k in self.items if k.user_id == user_id)


def list_known_facts(facts: FactStore, guild: str | None, user_ids: Iterable[str]) -> KnownFacts:
    """The current facts the model is shown: each user's in this guild (or DM), then the guild's;
    the newest `MAX_SHOWN_PER_SUBJECT` of each, at most `MAX_SHOWN` in all."""
    subjects: list[tuple[FactType, str | None]] = [(FactType.USER, u) for u in sorted(set(user_ids))]
    if guild is not None:
        subjects.append((FactType.GUILD, None))
    items: list[KnownFact] = []
    for fact_type, user_id in subjects:
        current = facts.current_facts(fact_type, guild, user_id)[-MAX_SHOWN_PER_SUBJECT:]
        for fact in current:
            if len(items) >= MAX_SHOWN:
                return KnownFacts(tuple(items))
            items.append(KnownFact(f"F{len(items) + 1}", fact.block_index, user_id, fact.text))
    return KnownFacts(tuple(items))


def review(item: ExtractedFact, known: KnownFacts) -> tuple[ModelVerdict | None, str | None]:
    """(the verdict to apply, or None for the offline judge; why the answer was not used).
    An `ignore` comes back as `ModelVerdict("ignore")`: the caller stores nothing."""
    if item.action is None:
        return None, item.problem
    if item.action == "ignore":
        return ModelVerdict("ignore"), None
    shown = known.shown(item.user_id)
    if item.action == "add":
        return ModelVerdict("add", None, shown), None
    target = known.get(item.ref or "")
    if target is None:
        return None, f"{item.action} {item.ref}: no fact with that id was shown"
    if target.user_id != item.user_id:
        return None, f"{item.action} {item.ref}: that fact is about another subject"
    return ModelVerdict(item.action, target.block_index, shown), None


def store_reviewed(facts: FactStore, item: ExtractedFact, text: str, known: KnownFacts, *, guild: str | None,
                   source_message: str | None = None,
                   statement: Statement | None = None) -> tuple[FactOutcome | None, str | None]:
    """Store one extracted fact (its `text` already cleaned by the caller) under the model's
    checked verdict: (the outcome, or None when the model said `ignore`; why the model's answer
    was not used, if it was not). `statement`: the message that said it (its time dates the fact).
    Raises what `FactStore.add` raises for bad input."""
    verdict, problem = review(item, known)
    if verdict is not None and verdict.action == "ignore":
        return None, None
    if item.user_id is not None:
        outcome = facts.add(text, fact_type=FactType.USER, topic=item.topic, keywords=item.keywords, guild=guild,
                            user_id=item.user_id, source_message=source_message, verdict=verdict,
                            statement=statement)
    else:
        outcome = facts.add(text, fact_type=FactType.GUILD, topic=item.topic, keywords=item.keywords, guild=guild,
                            source_message=source_message, verdict=verdict, statement=statement)
    return outcome, problem or outcome.note

"""Guardrails around what the bot reads and what it remembers.

- The input length limit is checked on the raw input, before anything trims it (the system
  this replaces truncated first, so its limit never fired).
- Prompt injection: the pattern guard (guard.py) and, when trained, the embedding classifier
  (classifier.py) over the same normalised text; either one firing flags the message.
- Meta facts — statements about the bot itself ("the bot is an AI", "누리는 프로그램이다") —
  are never stored: they are either trivia or an attempt to rewrite the persona.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.labeled import GUARD_CORPUS, data_digest, guard_split, load_guard_corpus
from ..errors import InvalidInputError, InvalidTypeError, TextTooLongError
from .bundled import trained_classifier
from .classifier import embed_messages, message_model_name
from .guard import GuardVerdict, InjectionGuard
from .kernel_classifier import KernelTextClassifier

__all__ = ["check_raw_input", "is_meta_fact", "MessageGuard", "guard_classifier", "train_guard_classifier",
           "fit_guard_classifier", "GUARD_CLASSIFIER_THRESHOLD", "GUARD_MESSAGE_GAMMA", "GUARD_NGRAM_WEIGHT"]

# The classifier's operating point: the lowest probability at which the guard (patterns or
# classifier) raises at most 2 % false alarms on out-of-fold predictions over the dev half of the
# guard corpus (5 folds, 3 shuffles), rounded up to 0.01 — `gieok bench guard --calibrate`
# prints it. The held-out half never took part (docs/benchmarks.md, "Prompt-injection guard").
GUARD_CLASSIFIER_THRESHOLD = 0.75

# The guard classifier's kernel (kernel_classifier.py): RBF width over centred USE vectors, the
# weight of the character n-gram kernel beside it and the fit, chosen on the dev half by
# out-of-fold detection at ≤ 2 % false alarms (γ 0.5 / 0.7 / 1 / 2, n-gram weight 0.5 / 1 / 2,
# l2 1e-4 … 1e-5 scored 0.810–0.857; docs/benchmarks.md, "Prompt-injection guard").
GUARD_MESSAGE_GAMMA = 1.0
GUARD_NGRAM_WEIGHT = 1.0
GUARD_L2 = 1e-5
GUARD_STEPS = 1000


def check_raw_input(content: object, limit: int) -> str:
    if not isinstance(content, str):
        raise InvalidTypeError(f"message content must be a string, not {type(content).__name__}")
    if len(content) > limit:
        raise TextTooLongError(f"message is {len(content):,} characters; the limit is {limit:,} (max_input_chars)")
    if not content.strip():
        raise InvalidInputError("message is empty")
    if "\x00" in content:
        raise InvalidInputError("message contains a NUL character")
    return content


_AI_WORDS = (r"(?:ai|a\.i\.|artificial intelligence|bot|chatbot|program|software|language model|llm|machine|robot|"
             r"인공지능|에이아이|봇|챗봇|프로그램|소프트웨어|언어\s*모델|기계|로봇)")


def is_meta_fact(text: str, bot_names: Sequence[str]) -> bool:
    """A statement about the bot itself rather than about people or the server."""
    lowered = text.casefold()
    for name in bot_names:
        name = name.strip().casefold()
        if name and re.search(rf"(?<![\w]){re.escape(name)}", lowered):
            return True
    if re.search(r"\b(?:the|this|our) (?:bot|assistant|ai)\b|(?:^|\s)(?:이|그|저)?\s*봇(?:은|는|이|가|의)", lowered):
        return True
    if re.search(rf"\b(?:you|you're|you are)\b.{{0,30}}{_AI_WORDS}|"
                 rf"(?:^|\s)(?:너|넌|니가|네가)\S*\s*.{{0,20}}{_AI_WORDS}", lowered):
        return True
    return "<user:" not in lowered and bool(re.search(rf"(?:is|are)\s+(?:an?\s+|just\s+an?\s+)?{_AI_WORDS}\b|"
                                                     rf"{_AI_WORDS}(?:이다|다|야|입니다)", lowered))


@dataclass
class MessageGuard:
    """Pattern guard, plus the embedding classifier when one is given (the benchmark shows
    patterns alone miss most paraphrased attacks: docs/benchmarks.md, "Prompt-injection guard")."""

    patterns: InjectionGuard
    classifier: KernelTextClassifier | None = None
    # Its own threshold: the patterns' weights were set for 0.7, while the classifier's
    # operating point was chosen on the dev half for false alarms ≤ 2 % (docs/benchmarks.md).
    classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD

    def check(self, text: str, vector: np.ndarray | None = None) -> GuardVerdict:
        """`vector`: the message's vector from the classifier encoder (`embed_messages`)."""
        verdict = self.patterns.check(text)
        if self.classifier is None or vector is None:
            return verdict
        p = float(self.classifier.probabilities(np.asarray(vector)[None, :], None, [text])[0])
        attack = verdict.attack or p >= self.classifier_threshold
        return GuardVerdict(round(max(p, verdict.score), 4), attack, (*verdict.matches, f"classifier={p:.2f}"))


def fit_guard_classifier(vectors: np.ndarray, texts: Sequence[str], labels: Sequence[bool], *,
                         encoder_name: str, dataset_sha256: str = "custom") -> KernelTextClassifier:
    """The guard's model on ready vectors (the calibration refits it on folds of the dev half)."""
    return KernelTextClassifier.fit(vectors, None, texts, labels, encoder_name=encoder_name,
                                    dataset_sha256=dataset_sha256, message_gamma=GUARD_MESSAGE_GAMMA,
                                    ngram_weight=GUARD_NGRAM_WEIGHT, l2=GUARD_L2, steps=GUARD_STEPS)


def train_guard_classifier(encoder: Any) -> KernelTextClassifier:
    """The guard's model on the dev half of the bundled guard corpus (the test half stays held
    out for `gieok bench guard`), reading `encoder`'s vectors (`embed_messages`)."""
    rows = [r for r in load_guard_corpus() if guard_split(r) == "dev"]
    texts = [r["text"] for r in rows]
    return fit_guard_classifier(embed_messages(encoder, texts), texts, [r["attack"] for r in rows],
                                encoder_name=message_model_name(encoder.name),
                                dataset_sha256=data_digest(GUARD_CORPUS))


def guard_classifier(encoder: Any) -> KernelTextClassifier:
    """The shipped guard model for `encoder` (the classifier encoder), or one trained once and cached."""
    return trained_classifier("guard", message_model_name(encoder.name), data_digest(GUARD_CORPUS),
                              lambda: train_guard_classifier(encoder))

"""Guardrails around what the bot reads and what it remembers.

- The input length limit is checked on the raw input, before anything trims it (the system
  this replaces truncated first, so its limit never fired).
- Prompt injection: the pattern guard (guard.py) and, when trained, the embedding classifier
  (classifier.py) over the same normalised text; either one firing flags the message. A
  message the classifier is unsure of (probability in the `guard_second_*` band) is decided by
  a second classifier that also reads the message's e5 query vector (the vector a reply's
  search would use, shared through the memory embedder's cache).
- Meta facts — statements about the bot itself ("the bot is an AI", "누리는 프로그램이다") —
  are never stored: they are either trivia or an attempt to rewrite the persona.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from ...errors import InvalidInputError, InvalidTypeError, TextTooLongError
from ..data.labeled import GUARD_CORPUS, data_digest, guard_split, load_guard_corpus
from .bundled import bundled_model_name, trained_classifier
from .classifier import embed_messages, message_model_name
from .guard import GuardVerdict, InjectionGuard
from .kernel_classifier import KernelTextClassifier, unit_rows

__all__ = ["check_raw_input", "is_meta_fact", "MessageGuard", "guard_classifier", "train_guard_classifier",
           "fit_guard_classifier", "GUARD_CLASSIFIER_THRESHOLD", "GUARD_MESSAGE_GAMMA", "GUARD_NGRAM_WEIGHT",
           "GUARD_SECOND_LOW", "GUARD_SECOND_HIGH", "GUARD_SECOND_THRESHOLD", "second_vectors",
           "second_model_name", "fit_guard_second", "train_guard_second", "guard_second_classifier", "SECOND_NAME"]

# The classifier's operating point: the lowest probability at which the guard (patterns or
# classifier) raises at most 2 % false alarms on out-of-fold predictions over the dev half of the
# guard corpus (5 folds, 3 shuffles), rounded up to 0.01 — `gieok bench guard --calibrate`
# prints it. The 2 % is counted on the corpus's benign look-alikes, not on ordinary chat rows
# (`ORDINARY_KIND`: the 92 greetings, goodbyes and reactions added in issue 42, which taught the classifier
# that "anyway, see you" is not an order), as the held-out half measures it. The held-out half never
# took part (docs/benchmarks.md, "Prompt-injection guard").
GUARD_CLASSIFIER_THRESHOLD = 0.72

# The guard classifier's kernel (kernel_classifier.py): RBF width over centred USE vectors, the
# weight of the character n-gram kernel beside it and the fit, chosen on the dev half by
# out-of-fold detection at ≤ 2 % false alarms (γ 0.5 / 0.7 / 1 / 2, n-gram weight 0.5 / 1 / 2,
# l2 1e-4 … 1e-5 scored 0.810–0.857; docs/benchmarks.md, "Prompt-injection guard").
GUARD_MESSAGE_GAMMA = 1.0
GUARD_NGRAM_WEIGHT = 1.0
GUARD_L2 = 1e-5
GUARD_STEPS = 1000

# The cascade (docs/benchmarks.md, "Prompt-injection guard", third round): a message whose
# classifier probability falls in [GUARD_SECOND_LOW, GUARD_SECOND_HIGH) is decided by the second
# classifier — the same kernel over the USE vector and the message's e5 query vector side by side,
# plus the n-grams — at p ≥ GUARD_SECOND_THRESHOLD. Out of fold on the dev half (2,272 messages) it
# caught 0.864 of attacks at ≤ 2 % false alarms where the first classifier alone caught 0.854, with
# 15.0 % of dev messages in the band (each pays one e5 embedding unless a reply's search already
# asked for it); every band from 0.2–0.9 to 0.6–0.9 scored the same as the second classifier on
# every message, and the threshold is `gieok bench guard --calibrate`'s. Outside the band the first
# classifier's own threshold (between the two ends) gives the same verdict.
GUARD_SECOND_LOW = 0.5
GUARD_SECOND_HIGH = 0.9
GUARD_SECOND_THRESHOLD = 0.77
SECOND_NAME = "guard2"


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
    # The second opinion for the classifier's unsure band (None: the classifier decides alone).
    second: KernelTextClassifier | None = None
    second_low: float = GUARD_SECOND_LOW
    second_high: float = GUARD_SECOND_HIGH
    second_threshold: float = GUARD_SECOND_THRESHOLD

    def probability(self, text: str, vector: np.ndarray) -> float:
        """The classifier's p(attack) from the message's classifier-encoder vector."""
        if self.classifier is None:
            raise ValueError("this guard has no classifier")
        return float(self.classifier.probabilities(np.asarray(vector)[None, :], None, [text])[0])

    def needs_second(self, probability: float) -> bool:
        """Whether the classifier is unsure enough to ask the second classifier (which then needs
        the message's e5 query vector)."""
        return self.second is not None and self.second_low <= probability < self.second_high

    def unsure(self, texts: Sequence[str], vectors: np.ndarray) -> tuple[list[float], list[int]]:
        """The classifier's probability for each message, and the indices of those in the second
        classifier's band: the messages whose e5 query vectors `check` will want."""
        probabilities = [self.probability(text, vector) for text, vector in zip(texts, vectors)]
        return probabilities, [i for i, p in enumerate(probabilities) if self.needs_second(p)]

    def check(self, text: str, vector: np.ndarray | None = None, query_vector: np.ndarray | None = None,
              *, probability: float | None = None) -> GuardVerdict:
        """`vector`: the message's vector from the classifier encoder (`embed_messages`);
        `query_vector`: its e5 query vector from the memory embedder, read only when the
        classifier's probability is in the second classifier's band (without it the classifier's
        own threshold decides); `probability`: the classifier's, when already computed."""
        verdict = self.patterns.check(text)
        if self.classifier is None or vector is None:
            return verdict
        p = self.probability(text, vector) if probability is None else probability
        matches = (*verdict.matches, f"classifier={p:.2f}")
        if self.second is not None and query_vector is not None and self.needs_second(p):
            both = second_vectors(np.asarray(vector)[None, :], np.asarray(query_vector)[None, :])
            p2 = float(self.second.probabilities(both, None, [text])[0])
            return GuardVerdict(round(max(p2, verdict.score), 4), verdict.attack or p2 >= self.second_threshold,
                                (*matches, f"second={p2:.2f}"))
        attack = verdict.attack or p >= self.classifier_threshold
        return GuardVerdict(round(max(p, verdict.score), 4), attack, matches)


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


def second_vectors(vectors: np.ndarray, query_vectors: np.ndarray) -> np.ndarray:
    """The second classifier's input: the classifier-encoder vector and the e5 query vector,
    each at unit length, side by side (the kernel's distance is then the sum of both distances)."""
    return np.hstack([unit_rows(vectors), unit_rows(query_vectors)])


def second_model_name(encoder_name: str, embedder_name: str) -> str:
    """The name the second classifier is kept under: both encoders, e5 read as queries."""
    return f"{message_model_name(encoder_name)}+{embedder_name}:query"


def fit_guard_second(vectors: np.ndarray, query_vectors: np.ndarray, texts: Sequence[str], labels: Sequence[bool],
                     *, encoder_name: str, dataset_sha256: str = "custom") -> KernelTextClassifier:
    """The second classifier on ready vectors: the first one's kernel and fit over both vectors."""
    return KernelTextClassifier.fit(second_vectors(vectors, query_vectors), None, texts, labels,
                                    encoder_name=encoder_name, dataset_sha256=dataset_sha256,
                                    message_gamma=GUARD_MESSAGE_GAMMA, ngram_weight=GUARD_NGRAM_WEIGHT,
                                    l2=GUARD_L2, steps=GUARD_STEPS)


def train_guard_second(encoder: Any, embedder: Any) -> KernelTextClassifier:
    """The second classifier on the dev half of the bundled guard corpus: `encoder`'s vectors
    (the classifier encoder) beside `embedder`'s query vectors (the memory's e5)."""
    rows = [r for r in load_guard_corpus() if guard_split(r) == "dev"]
    texts = [r["text"] for r in rows]
    return fit_guard_second(embed_messages(encoder, texts), np.asarray(embedder.embed_queries(texts), np.float32),
                            texts, [r["attack"] for r in rows],
                            encoder_name=second_model_name(encoder.name, embedder.name),
                            dataset_sha256=data_digest(GUARD_CORPUS))


def guard_second_classifier(encoder: Any, embedder: Any) -> KernelTextClassifier | None:
    """The shipped second classifier for this pair of encoders (retrained once and cached when
    the corpus changed), or None when weights were shipped for another memory embedder: the
    guard then decides with the first classifier alone rather than embed the corpus through,
    say, a paid embedding API at start-up."""
    name = second_model_name(encoder.name, embedder.name)
    if not resources.files("gieok.chat.data").joinpath(bundled_model_name(SECOND_NAME, name)).is_file():
        return None
    return trained_classifier(SECOND_NAME, name, data_digest(GUARD_CORPUS),
                              lambda: train_guard_second(encoder, embedder))

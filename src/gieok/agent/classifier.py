"""The classifiers' encoder, and a small logistic-regression classifier over sentence embeddings.

No packaged Korean classifier exists offline, so judgement calls on chat messages (is this
an injection attempt? does this need a reply?) are learned from labeled examples the
project ships, on top of the packaged embedder. Plain numpy: a few hundred examples train
in well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["EmbeddingClassifier", "CLASSIFIER_ENCODER", "classifier_encoder", "embed_messages", "message_model_name"]

# The classifiers (guard, gatekeeper stage 1) read a chat message through their own encoder,
# USE multilingual (~1 ms a message here), not through the memory's embedder (e5: 10–21 ms):
# e5 is then spent on a reply only for its search query, and a message nobody answers costs no
# e5 at all. With character n-grams beside the vector (kernel_classifier.py) the classifiers
# are as accurate as they were on e5 passage vectors or better (docs/benchmarks.md). Tried and
# not kept: e5 query vectors (guard held-out detection 0.789 → 0.762). The choice is made here
# only: every classifier, its training and its benchmark embed through these functions.
CLASSIFIER_ENCODER = "use"


def classifier_encoder(settings: Any = None) -> Any:
    """The classifiers' encoder (one engine per process, cached like any embedder)."""
    from ..config import load_settings
    from ..embed import create_embedder

    return create_embedder(CLASSIFIER_ENCODER, settings or load_settings())


def embed_messages(encoder: Any, texts: Sequence[str]) -> np.ndarray:
    """Messages as the classifiers read them (the encoder is symmetric: one kind of vector)."""
    return np.asarray(encoder.embed_passages(list(texts)), dtype=np.float32)


def message_model_name(encoder_name: str) -> str:
    """The name a classifier trained on `embed_messages` vectors is kept under."""
    return encoder_name


@dataclass
class EmbeddingClassifier:
    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, vectors: np.ndarray, labels: Sequence[bool], *, l2: float = 1e-2, steps: int = 3000,
            learning_rate: float = 0.5) -> EmbeddingClassifier:
        """Full-batch gradient descent at a fixed `learning_rate` on the L2-regularised log loss."""
        xs, y, mean, scale = _standardise(vectors, labels)
        w = np.zeros(xs.shape[1])
        b = 0.0
        for _ in range(steps):
            p = 1.0 / (1.0 + np.exp(-(xs @ w + b)))
            error = p - y
            w -= learning_rate * (xs.T @ error / len(y) + l2 * w)
            b -= learning_rate * float(error.mean())
        return cls(w, b, mean, scale)

    @classmethod
    def fit_accelerated(cls, features: np.ndarray, labels: Sequence[bool], *, l2: float = 1e-3,
                        steps: int = 1500) -> EmbeddingClassifier:
        """The same model by Nesterov-accelerated gradient descent, for features whose scale
        makes a fixed learning rate unstable (kernel maps): the step is 1 / the largest
        eigenvalue of the features' second moment — the log loss's curvature is at most a
        quarter of that, so the step is safe."""
        xs, y, mean, scale = _standardise(features, labels)
        step = 1.0 / max(float(np.linalg.eigvalsh(xs.T @ xs / len(xs))[-1]), 1e-6)
        w, b = np.zeros(xs.shape[1]), 0.0
        previous_w, previous_b = w, b
        for t in range(steps):
            momentum = t / (t + 3.0)
            look_w, look_b = w + momentum * (w - previous_w), b + momentum * (b - previous_b)
            error = 1.0 / (1.0 + np.exp(-(xs @ look_w + look_b))) - y
            previous_w, previous_b = w, b
            w = look_w - step * (xs.T @ error / len(y) + l2 * look_w)
            b = look_b - step * float(error.mean())
        return cls(w, b, mean, scale)

    def predict_proba(self, vectors: np.ndarray) -> np.ndarray:
        xs = (np.atleast_2d(np.asarray(vectors, dtype=np.float64)) - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-(xs @ self.weights + self.bias)))

    def save(self, target: str | Path | IO[bytes], **meta: str) -> None:
        """Weights plus free-form metadata (which embedder, which dataset) in one .npz."""
        np.savez(target, weights=self.weights, bias=np.array([self.bias]), mean=self.mean, scale=self.scale,
                 meta=np.array(json.dumps(meta, ensure_ascii=False)))

    @classmethod
    def load(cls, source: str | Path | IO[bytes]) -> tuple[EmbeddingClassifier, dict[str, Any]]:
        with np.load(source, allow_pickle=False) as data:
            model = cls(data["weights"], float(data["bias"][0]), data["mean"], data["scale"])
            return model, json.loads(str(data["meta"]))


def _standardise(vectors: np.ndarray, labels: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(vectors, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or len(x) < 2:
        raise ValueError("need a 2-d matrix with one label per row (at least two rows)")
    if y.min() == y.max():
        raise ValueError("need examples of both classes")
    mean = x.mean(axis=0)
    scale = x.std(axis=0) + 1e-6
    return (x - mean) / scale, y, mean, scale

"""A small logistic-regression classifier over sentence embeddings.

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

__all__ = ["EmbeddingClassifier", "MESSAGE_VECTORS", "embed_messages", "message_model_name"]

# The classifiers read a chat message's e5 *passage* vector. Query vectors were tried (the search
# could then reuse the message's vector when the message is its own query, one embedding fewer
# per reply) and cost the guard detection on held-out data (0.789 → 0.762 at its calibrated
# threshold; docs/benchmarks.md, "Conversation pipeline"), so they are not used. The choice is
# made here only: every classifier, its training and its benchmark embed through this function.
MESSAGE_VECTORS = "passage"


def embed_messages(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """Messages as the classifiers read them."""
    method = embedder.embed_queries if MESSAGE_VECTORS == "query" else embedder.embed_passages
    return np.asarray(method(list(texts)), dtype=np.float32)


def message_model_name(embedder_name: str) -> str:
    """The name a classifier trained on `embed_messages` vectors is kept under (the embedder's own
    name for passage vectors, the default kind)."""
    return embedder_name if MESSAGE_VECTORS == "passage" else f"{embedder_name}+{MESSAGE_VECTORS}"


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

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

__all__ = ["EmbeddingClassifier"]


@dataclass
class EmbeddingClassifier:
    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def fit(cls, vectors: np.ndarray, labels: Sequence[bool], *, l2: float = 1e-2, steps: int = 3000,
            learning_rate: float = 0.5) -> "EmbeddingClassifier":
        x = np.asarray(vectors, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if x.ndim != 2 or len(x) != len(y) or len(x) < 2:
            raise ValueError("need a 2-d matrix with one label per row (at least two rows)")
        if y.min() == y.max():
            raise ValueError("need examples of both classes")
        mean = x.mean(axis=0)
        scale = x.std(axis=0) + 1e-6
        xs = (x - mean) / scale
        w = np.zeros(x.shape[1])
        b = 0.0
        for _ in range(steps):  # full-batch gradient descent on the L2-regularised log loss
            p = 1.0 / (1.0 + np.exp(-(xs @ w + b)))
            error = p - y
            w -= learning_rate * (xs.T @ error / len(y) + l2 * w)
            b -= learning_rate * float(error.mean())
        return cls(w, b, mean, scale)

    def predict_proba(self, vectors: np.ndarray) -> np.ndarray:
        xs = (np.atleast_2d(np.asarray(vectors, dtype=np.float64)) - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-(xs @ self.weights + self.bias)))

    def save(self, target: str | Path | IO[bytes], **meta: str) -> None:
        """Weights plus free-form metadata (which embedder, which dataset) in one .npz."""
        np.savez(target, weights=self.weights, bias=np.array([self.bias]), mean=self.mean, scale=self.scale,
                 meta=np.array(json.dumps(meta, ensure_ascii=False)))

    @classmethod
    def load(cls, source: str | Path | IO[bytes]) -> tuple["EmbeddingClassifier", dict[str, Any]]:
        with np.load(source, allow_pickle=False) as data:
            model = cls(data["weights"], float(data["bias"][0]), data["mean"], data["scale"])
            return model, json.loads(str(data["meta"]))

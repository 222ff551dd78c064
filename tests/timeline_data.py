"""A timeline test set: seven weeks of a Korean/English guild chat and an English direct
conversation, whose facts change over time — homes, jobs, pets, relationships, hobbies and
preferences, three of them changing and changing back (A → B → A), some said again later, some with
relative dates ("어제", "next Friday", "다음 달") — and the fact each message states.

`script_extraction` is the extraction model's side, as a loopback OpenAI-compatible server runs it:
it reads the transcript gieok sends (each line `[m3 2026-09-12 (토) 10:00] <user:ID>: text`),
answers each line's facts with that line's reference as their `source`, and — as a model that reads
the "Known facts" list would — says `duplicate` of a known fact with the same text, `replaces` one
of the same attribute, else `add`. What gieok must make of it (intervals, current facts, dates) is
computed here from the messages alone (`expected_versions`), not from gieok.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

SEOUL = ZoneInfo("Asia/Seoul")
DAY0 = datetime(2026, 9, 1, 10, 0, tzinfo=SEOUL)
GUILD, LOUNGE, DM = "g-time", "lounge", "dm-alex"
NAMES = {"u-minji": "민지", "u-alex": "Alex", "u-jisoo": "지수", "u-sam": "Sam"}


@dataclass(frozen=True)
class Said:
    """One message: who, when (days after DAY0, plus minutes), where, what, and the fact it states
    (its attribute key — one per user and thing that can change — and its sentence)."""

    id: str
    user: str
    day: int
    text: str
    key: str | None = None
    fact: str | None = None
    channel: str = LOUNGE
    minute: int = 0
    dated: str | None = None  # the day (or month) a relative date in the fact resolves to

    @property
    def time(self) -> float:
        return (DAY0 + timedelta(days=self.day, minutes=self.minute)).timestamp()

    @property
    def guild(self) -> str | None:
        return None if self.channel == DM else GUILD


MESSAGES: tuple[Said, ...] = (
    # 민지 (Korean): home 부산 → 서울 → 부산 again, job, a cat said twice, a drink, a licence "어제"
    Said("t01", "u-minji", 0, "나 부산에 살아 ㅎㅎ", "minji.home", "<user:u-minji>는 부산에 산다."),
    Said("t02", "u-minji", 2, "나 요즘 카페에서 일해", "minji.job", "<user:u-minji>는 카페에서 일한다."),
    Said("t03", "u-minji", 3, "요즘 라떼만 마셔", "minji.drink", "<user:u-minji>가 좋아하는 음료는 라떼다."),
    Said("t04", "u-minji", 5, "우리 고양이 보리 너무 귀여워", "minji.pet", "<user:u-minji>는 고양이 보리를 키운다."),
    Said("t05", "u-minji", 10, "다음 주에 서울로 이사 가"),
    Said("t06", "u-minji", 12, "어제 운전면허 땄어!!", "minji.licence", "<user:u-minji>는 어제 운전면허를 땄다.",
         dated="2026-09-12"),
    Said("t07", "u-minji", 20, "서울로 이사 왔어, 짐 정리 중", "minji.home", "<user:u-minji>는 서울에 산다."),
    Said("t08", "u-minji", 25, "카페 그만두고 출판사 다녀", "minji.job", "<user:u-minji>는 출판사에서 일한다."),
    Said("t09", "u-minji", 30, "보리가 요즘 살이 쪘어", "minji.pet", "<user:u-minji>는 고양이 보리를 키운다."),
    Said("t10", "u-minji", 33, "라떼 끊고 녹차만 마셔", "minji.drink", "<user:u-minji>가 좋아하는 음료는 녹차다."),
    Said("t11", "u-minji", 40, "결국 부산으로 다시 내려왔어", "minji.home", "<user:u-minji>는 부산에 산다."),
    # Alex (English): home, job Nuvola → Brightline → Nuvola again, a dog, dating → engaged, a visit "next Friday"
    Said("t12", "u-alex", 1, "I live in Berlin, for the record", "alex.home", "<user:u-alex> lives in Berlin."),
    Said("t13", "u-alex", 4, "I work at Nuvola Labs", "alex.job", "<user:u-alex> works at Nuvola Labs."),
    Said("t14", "u-alex", 6, "We adopted a dog, his name is Max", "alex.pet", "<user:u-alex> has a dog named Max."),
    Said("t15", "u-alex", 8, "I'm dating Sam btw", "alex.partner", "<user:u-alex> is dating <user:u-sam>."),
    Said("t16", "u-alex", 9, "I went vegetarian this month", "alex.diet", "<user:u-alex> is vegetarian."),
    Said("t17", "u-alex", 15, "Moved to Lisbon, the light here is amazing", "alex.home",
         "<user:u-alex> lives in Lisbon."),
    Said("t18", "u-alex", 18, "My sister visits next Friday", "alex.visit",
         "<user:u-alex>'s sister visits next Friday.", dated="2026-09-25"),
    Said("t19", "u-alex", 22, "I quit Nuvola and joined Brightline", "alex.job", "<user:u-alex> works at Brightline."),
    Said("t20", "u-alex", 35, "Sam and I got engaged yesterday!", "alex.partner",
         "<user:u-alex> got engaged to <user:u-sam> yesterday.", dated="2026-10-05"),
    Said("t21", "u-alex", 45, "Brightline didn't work out, I'm back at Nuvola Labs", "alex.job",
         "<user:u-alex> works at Nuvola Labs."),
    # 지수 (Korean): home, job, a dog, hobby 클라이밍 → 테니스 → 클라이밍 again, school "다음 달부터"
    Said("t22", "u-jisoo", 7, "나는 대구 살아", "jisoo.home", "<user:u-jisoo>는 대구에 산다."),
    Said("t23", "u-jisoo", 11, "학원 강사로 일하고 있어", "jisoo.job", "<user:u-jisoo>는 학원 강사로 일한다."),
    Said("t24", "u-jisoo", 14, "강아지 입양했어! 이름은 콩이", "jisoo.pet", "<user:u-jisoo>는 강아지 콩이를 키운다."),
    Said("t25", "u-jisoo", 16, "요즘 클라이밍에 빠졌어", "jisoo.hobby", "<user:u-jisoo>의 취미는 클라이밍이다."),
    Said("t26", "u-jisoo", 28, "다음 달부터 대학원 다녀", "jisoo.school",
         "<user:u-jisoo>는 다음 달부터 대학원에 다닌다.", dated="2026-10"),
    Said("t27", "u-jisoo", 38, "클라이밍 접고 테니스 시작했어", "jisoo.hobby", "<user:u-jisoo>의 취미는 테니스다."),
    Said("t28", "u-jisoo", 50, "테니스도 그만두고 다시 클라이밍 해", "jisoo.hobby",
         "<user:u-jisoo>의 취미는 클라이밍이다."),
    # Sam (English): home, job nurse → teacher, engaged
    Said("t29", "u-sam", 13, "I'm in Seoul these days", "sam.home", "<user:u-sam> lives in Seoul."),
    Said("t30", "u-sam", 19, "Started as a nurse at Severance", "sam.job", "<user:u-sam> works as a nurse."),
    Said("t31", "u-sam", 36, "Alex and I are engaged!!", "sam.partner", "<user:u-sam> is engaged to <user:u-alex>."),
    Said("t32", "u-sam", 42, "Switched to teaching, no more night shifts", "sam.job",
         "<user:u-sam> works as a teacher."),
    # chatter that states nothing
    Said("t33", "u-sam", 13, "ㅋㅋ 다들 주말 잘 보내", minute=5),
    Said("t34", "u-jisoo", 16, "오늘 점심 뭐 먹지", minute=5),
    # Alex's direct conversation, in English only
    Said("d01", "u-alex", 21, "By the way my birthday is on March 3", "alex.birthday",
         "<user:u-alex>'s birthday is March 3.", channel=DM),
    Said("d02", "u-alex", 23, "tomorrow I fly to Tokyo for work", "alex.trip", "<user:u-alex> flies to Tokyo tomorrow.",
         channel=DM, dated="2026-09-25"),
    Said("d03", "u-alex", 23, "thanks for listening, talk soon", channel=DM, minute=10),
)
BY_TEXT = {m.text: m for m in MESSAGES}
STATED = [m for m in MESSAGES if m.fact]
A_B_A = ("minji.home", "alex.job", "jisoo.hobby")
_LINE = re.compile(r"^\[(m\d+) [^\]]*\] <user:([^>]+)>: (.*)$")
_KNOWN = re.compile(r"^(F\d+) (?:<user:([^>]+)>|server): (.*)$")
_ANNOTATION = re.compile(r"\s?\(\d{4}(?:-\d{2}){0,2}(?:~\d{4}(?:-\d{2}){0,2})?\)")


def plain(text: str) -> str:
    """A fact's text without the dates gieok resolved into it."""
    return _ANNOTATION.sub("", text)


def wire(said: Said) -> dict[str, Any]:
    return {"id": said.id, "role": "user", "user": said.user, "name": NAMES[said.user], "text": said.text,
            "time": said.time}


def script_extraction(prompt_text: str) -> dict[str, Any]:
    """The scripted model's answer to one extraction prompt (module docstring)."""
    known: dict[str, tuple[str | None, str]] = {}
    lines = prompt_text.splitlines()
    for line in lines:
        if found := _KNOWN.match(line.strip()):
            known[found.group(1)] = (found.group(2), plain(found.group(3)))
    facts = []
    for line in lines:
        found = _LINE.match(line.strip())
        said = BY_TEXT.get(found.group(3)) if found else None
        if found is None or said is None or said.fact is None:
            continue
        siblings = {m.fact for m in STATED if m.key == said.key}
        item: dict[str, Any] = {"user_id": said.user, "fact": said.fact, "topic": said.key, "source": found.group(1),
                                "action": "add"}
        for ref, (user, text) in known.items():
            if user == said.user and text in siblings:
                item.update(action="duplicate" if text == said.fact else "replaces", ref=ref)
                break
        facts.append(item)
    return {"guild_facts": [], "user_facts": facts, "summary_updates": {}}


@dataclass(frozen=True)
class Version:
    key: str
    text: str
    valid_from: float
    valid_to: float | None
    dated: str | None


def expected_versions() -> list[Version]:
    """Each attribute's versions as its messages make them: ordered by when they were said, a
    statement repeating the value before it joins that version, each version lasting until the next."""
    out: list[Version] = []
    for key in dict.fromkeys(m.key for m in STATED):
        said = sorted((m for m in STATED if m.key == key), key=lambda m: m.time)
        runs: list[list[Said]] = []
        for message in said:
            if runs and runs[-1][-1].fact == message.fact:
                runs[-1].append(message)
            else:
                runs.append([message])
        for position, run in enumerate(runs):
            after = runs[position + 1][0].time if position + 1 < len(runs) else None
            out.append(Version(str(key), str(run[0].fact), run[0].time, after, run[0].dated))
    return out

"""The demo's language model: a `ScriptedLLM` whose rule answers the pipeline's extraction prompt
offline, from a table of the bundled chat's facts (gieok/data/sample_conversation.json).

`gieok demo` has no model to call, yet its memory should look like a bot's after the same chat:
facts (L3) with their history and sources, and a rolling summary (L2). This model reads the
transcript of an extraction prompt — lines like `[m3 2026-03-02 (월) 19:31] <user:민지>: …` —
and, for each line that holds one of the table's phrases and was said by the table's speaker,
states the table's fact about `<user:ID>` with `"source": "m3"`: in Korean for a Korean line, in
English for an English one. A fact that replaces an earlier one (the cat's weight, a job offer
after an interview) names the known fact it replaces ("F2"), as a real model is asked to; a fact
already known is a duplicate. It writes one summary update per batch from a second table.

It knows nothing but this chat: on other conversations it extracts nothing (and says so in no
fact), and any other request gets an empty answer. It is not a stand-in for a model in tests of
the pipeline: those script their own replies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .scripted import Request, ScriptedLLM

__all__ = ["DemoFact", "DemoPoint", "DEMO_FACTS", "DEMO_POINTS", "DEMO_MODEL_NAME", "demo_model", "answer"]

DEMO_MODEL_NAME = "gieok-demo"
_LINE = re.compile(r"^\[(m\d+) [^\]]*\] <user:([^>]+)>: (.*)$")
_KNOWN = re.compile(r"^(F\d+) (?:<user:([^>]+)>|server): (.*)$")


@dataclass(frozen=True, slots=True)
class DemoFact:
    """A fact the chat states: `phrase` in a line said by `speaker` states `text` ({user} is
    `<user:ID>`). `replaces`: a phrase of the earlier fact about the same subject that this one
    replaces. `guild`: a fact about the group, not the speaker."""

    phrase: str
    speaker: str
    text: str
    topic: str
    keywords: tuple[str, ...] = ()
    replaces: str = ""
    guild: bool = False


@dataclass(frozen=True, slots=True)
class DemoPoint:
    """A summary update the chat makes: when `phrase` is said by `speaker`, the current topic,
    mood, a new thread and a point worth keeping, each (Korean, English) for the prompt's language."""

    phrase: str
    speaker: str
    topic: tuple[str, str]
    point: tuple[str, str]
    new_topic: tuple[str, str] = ("", "")
    mood: tuple[str, str] = ("들뜨고 다정함", "excited and warm")


DEMO_FACTS: tuple[DemoFact, ...] = (
    DemoFact("망원동 보호소에서 데려온", "민지",
             "{user}는 망원동 보호소에서 3개월 된 치즈냥이를 입양했다",
             "반려동물", ("고양이", "입양", "망원동")),
    DemoFact("이름은 보리로 할게", "민지",
             "{user}의 고양이 이름은 보리다",
             "고양이 이름", ("고양이", "이름", "보리")),
    DemoFact("I live like 10 min away", "Emily",
             "{user} lives about 10 minutes from <user:민지> and will feed her cat when she is away",
             "neighbours", ("cat sitting", "neighbour")),
    DemoFact("the interview is this Thursday at 2", "Alex",
             "{user} has an interview for a frontend role at Nuvola Labs, a scheduling-app startup in Pangyo, "
             "on 2026-03-05 at 2 pm",
             "job", ("interview", "Nuvola Labs", "frontend")),
    DemoFact("my book club picked Pachinko", "Emily",
             "{user}'s book club is reading Pachinko by Min Jin Lee in March",
             "reading", ("book club", "Pachinko")),
    DemoFact("로그인하면 어떤 유저들은 바로 튕겨", "지훈",
             "{user}이 만드는 앱 밥친구에는 일부 유저가 로그인하자마자 튕기는 버그가 있다",
             "밥친구 버그", ("밥친구", "로그인", "버그")),
    DemoFact("14일 토요일 저녁 우리 집에서", "민지",
             "단톡방 친구들은 3월 14일 토요일 저녁 <user:민지>의 집에서 모인다",
             "모임", ("모임", "3월 14일"), guild=True),
    DemoFact("내 최애 음식은 평생 마라탕", "민지",
             "{user}의 최애 음식은 마라탕이다",
             "음식", ("마라탕", "최애 음식")),
    DemoFact("I got the offer from Nuvola Labs", "Alex",
             "{user} got the offer for the frontend role at Nuvola Labs",
             "job", ("offer", "Nuvola Labs"), replaces="interview"),
    DemoFact("April 13. I have to finish my last month", "Alex",
             "{user} starts at Nuvola Labs on April 13, after finishing as an English teacher at an academy",
             "start date", ("April 13", "academy")),
    DemoFact("시간대 문제였어", "지훈",
             "{user}은 밥친구 로그인 버그를 고쳤다: 새 서버 하나만 시간대가 Asia/Seoul이라 토큰이 9시간 일찍 "
             "만료됐고, 이제 서버를 전부 UTC로 통일했다",
             "밥친구 버그", ("밥친구", "시간대", "UTC"), replaces="튕기는 버그"),
    DemoFact("5월 안에 베타 열어보려고", "지훈",
             "{user}은 5월 안에 밥친구 베타를 열 계획이다",
             "밥친구 베타", ("밥친구", "베타")),
    DemoFact("보리가 어제 소파를 다 긁어놨어", "민지",
             "{user}의 고양이 보리는 스크래쳐 대신 소파를 긁는다",
             "고양이 습관", ("보리", "소파", "스크래쳐")),
    DemoFact("4월 18일 토요일에 부산 가", "지훈",
             "{user}은 4월 18일 토요일에 대학 동기들과 2박 3일 부산 여행을 간다 (KTX 아침 8시 차)",
             "여행", ("부산", "4월 18일", "KTX")),
    DemoFact("캣닢 뿌렸더니 이제 스크래쳐 위에서 자", "민지",
             "{user}의 고양이 보리는 캣닢을 뿌린 뒤로 스크래쳐를 쓰고 그 위에서 잔다",
             "고양이 습관", ("보리", "캣닢", "스크래쳐"), replaces="소파를 긁는다"),
    DemoFact("my birthday is May 9", "Emily",
             "{user}'s birthday is May 9",
             "birthday", ("birthday", "May 9")),
    DemoFact("my lease ends in June", "Alex",
             "{user}'s lease ends in June and they are looking for an apartment",
             "home", ("lease", "apartment", "June")),
    DemoFact("나 부산에서 돌아옴", "지훈",
             "{user}은 부산 여행을 다녀왔다 (돼지국밥, 광안리 드론쇼, 흰여울마을)",
             "여행", ("부산", "여행"), replaces="부산 여행을 간다"),
    DemoFact("병원에서 1.8킬로래", "민지",
             "{user}의 고양이 보리는 2차 접종을 맞았고 몸무게는 1.8킬로다",
             "고양이 몸무게", ("보리", "몸무게", "접종")),
    DemoFact("6pm at a 삼겹살 place in 홍대", "Emily",
             "{user}'s birthday dinner on May 9 is at 6 pm at a samgyeopsal place in Hongdae, then karaoke",
             "birthday plans", ("birthday", "Hongdae", "karaoke")),
    DemoFact("베타는 5월 6일에 열 거야", "지훈",
             "{user}은 5월 6일에 밥친구 베타를 연다",
             "밥친구 베타", ("밥친구", "베타", "5월 6일"), replaces="베타를 열 계획"),
    DemoFact("the Olympus one I wanted", "Emily",
             "{user} got the Olympus film camera they wanted from their friends for their birthday",
             "gifts", ("film camera", "Olympus", "birthday")),
    DemoFact("now I'm reading 불편한 편의점 in Korean", "Emily",
             "{user} finished Pachinko and is reading 불편한 편의점 in Korean for practice, understanding "
             "about 80%",
             "reading", ("불편한 편의점", "Korean"), replaces="Pachinko"),
    DemoFact("벌써 120명 가입함", "지훈",
             "{user}의 앱 밥친구 베타가 열렸고 일주일 만에 120명이 가입했다",
             "밥친구 베타", ("밥친구", "베타", "가입자"), replaces="밥친구 베타를 연다"),
    DemoFact("성수동으로 이사 가요", "Alex",
             "{user}는 6월 20일에 성수동으로 이사한다",
             "home", ("성수동", "이사", "6월 20일"), replaces="lease"),
    DemoFact("50 min on the shuttle bus", "Alex",
             "{user} commutes to Pangyo on the company's shuttle bus from Gangnam, about 50 minutes",
             "commute", ("commute", "shuttle bus", "Pangyo")),
    DemoFact("이제 3.2킬로", "민지",
             "{user}의 고양이 보리는 6개월이 됐고 몸무게는 3.2킬로다",
             "고양이 몸무게", ("보리", "몸무게"), replaces="1.8킬로"),
    DemoFact("가입자 500명 넘었다", "지훈",
             "{user}의 앱 밥친구 가입자는 500명을 넘었다",
             "밥친구 베타", ("밥친구", "가입자"), replaces="120명"),
    DemoFact("I passed TOPIK level 5", "Emily",
             "{user} passed TOPIK level 5",
             "korean", ("TOPIK", "Korean")),
    DemoFact("1박 2일까지만 가능", "민지",
             "{user}는 고양이 보리 때문에 여행은 1박 2일까지만 갈 수 있다",
             "여행", ("보리", "여행", "1박 2일")),
    DemoFact("Jeju trip is official then", "Alex",
             "The group is going on a short trip to Jeju on the weekend of the second week of August",
             "plans", ("Jeju", "August", "trip"), guild=True),
)

DEMO_POINTS: tuple[DemoPoint, ...] = (
    DemoPoint("망원동 보호소에서 데려온", "민지",
              ("민지의 새 고양이", "<user:민지>'s new cat"),
              ("<user:민지>가 망원동 보호소에서 치즈냥이를 입양했다",
               "<user:민지> adopted a kitten from a shelter in Mangwon"),
              ("민지의 고양이 보리", "<user:민지>'s cat Bori")),
    DemoPoint("the interview is this Thursday at 2", "Alex",
              ("Alex의 Nuvola Labs 면접", "<user:Alex>'s Nuvola Labs interview"),
              ("<user:Alex>는 Nuvola Labs 프론트엔드 면접을 본다",
               "<user:Alex> has a frontend interview at Nuvola Labs"),
              ("Alex 면접", "<user:Alex>'s interview")),
    DemoPoint("14일 토요일 저녁 우리 집에서", "민지",
              ("3월 14일 민지네 모임", "dinner at <user:민지>'s on March 14"),
              ("3월 14일 토요일 저녁 <user:민지>의 집에서 모이기로 했다",
               "the friends meet at <user:민지>'s on March 14"),
              ("3월 14일 모임", "the March 14 dinner")),
    DemoPoint("I got the offer from Nuvola Labs", "Alex",
              ("Alex 합격 축하", "<user:Alex>'s job offer"),
              ("<user:Alex>가 Nuvola Labs에 합격했다 (4월 13일 출근)",
               "<user:Alex> got the Nuvola Labs offer (starts April 13)"),
              mood=("축하 분위기", "celebrating")),
    DemoPoint("시간대 문제였어", "지훈",
              ("밥친구 로그인 버그 해결", "the 밥친구 login bug, solved"),
              ("<user:지훈>의 밥친구 로그인 버그는 서버 시간대 문제였다",
               "<user:지훈>'s login bug was a server time zone mismatch"),
              ("밥친구 베타", "the 밥친구 beta")),
    DemoPoint("4월 18일 토요일에 부산 가", "지훈",
              ("지훈의 부산 여행", "<user:지훈>'s Busan trip"),
              ("<user:지훈>은 4월 18일에 부산 여행을 간다", "<user:지훈> goes to Busan on April 18"),
              ("부산 여행", "the Busan trip")),
    DemoPoint("my birthday is May 9", "Emily",
              ("Emily 생일 계획", "<user:Emily>'s birthday plans"),
              ("<user:Emily>의 생일은 5월 9일 토요일이다", "<user:Emily>'s birthday is Saturday, May 9"),
              ("Emily 생일 파티", "<user:Emily>'s birthday party")),
    DemoPoint("나 부산에서 돌아옴", "지훈",
              ("부산 여행 후기", "back from Busan"),
              ("<user:지훈>이 부산 여행에서 돌아왔다", "<user:지훈> is back from Busan")),
    DemoPoint("병원에서 1.8킬로래", "민지",
              ("보리 접종과 Emily 생일 준비", "Bori's vaccine and <user:Emily>'s birthday"),
              ("보리는 2차 접종을 맞았다 (1.8킬로)", "Bori had her second vaccine (1.8 kg)")),
    DemoPoint("THE GIFT. you got me a film camera", "Emily",
              ("Emily 생일 파티", "<user:Emily>'s birthday party"),
              ("친구들이 <user:Emily>에게 필름 카메라를 선물했다", "the friends gave <user:Emily> a film camera"),
              mood=("신나고 유쾌함", "joyful")),
    DemoPoint("벌써 120명 가입함", "지훈",
              ("밥친구 베타와 노래방", "the 밥친구 beta and karaoke"),
              ("밥친구 베타가 열려 일주일 만에 120명이 가입했다", "the 밥친구 beta opened: 120 sign-ups in a week")),
    DemoPoint("성수동으로 이사 가요", "Alex",
              ("Alex의 성수동 이사", "<user:Alex>'s move to Seongsu"),
              ("<user:Alex>는 6월 20일 성수동으로 이사한다", "<user:Alex> moves to Seongsu-dong on June 20"),
              ("Alex 이사 6월 20일", "<user:Alex>'s move on June 20")),
    DemoPoint("I passed TOPIK level 5", "Emily",
              ("8월 제주 여행 계획", "a Jeju trip in August"),
              ("<user:Emily>가 TOPIK 5급에 합격했다", "<user:Emily> passed TOPIK level 5"),
              ("제주 여행 (8월 둘째 주)", "Jeju trip (second week of August)")),
    DemoPoint("Jeju trip is official then", "Alex",
              ("8월 제주 여행과 Alex의 성수동 이사", "the Jeju trip and <user:Alex>'s move"),
              ("8월 둘째 주 주말에 다 같이 제주 여행을 간다",
               "the group goes to Jeju on the second weekend of August")),
)


def _transcript(prompt: str) -> list[tuple[str, str, str]]:
    """(reference, user id, text) of each user's line between the prompt's `<<<` and `>>>`."""
    inside = prompt.split("<<<", 1)[-1].rsplit(">>>", 1)[0]
    lines = []
    for line in inside.splitlines():
        match = _LINE.match(line.strip())
        if match:
            lines.append((match.group(1), match.group(2), match.group(3)))
    return lines


def _known(prompt: str) -> list[tuple[str, str | None, str]]:
    """(F-id, user id or None for the server, text) of each fact the prompt shows as known."""
    head = prompt.split("<<<", 1)[0]
    known = []
    for line in head.splitlines():
        match = _KNOWN.match(line.strip())
        if match:
            known.append((match.group(1), match.group(2), match.group(3)))
    return known


def _verdict(fact: DemoFact, text: str, subject: str | None,
             known: list[tuple[str, str | None, str]]) -> tuple[str, str]:
    """(action, ref) against the facts the prompt showed about the same subject."""
    same = [(ref, shown) for ref, who, shown in known if who == subject]
    for ref, shown in same:
        if " ".join(shown.split()) == " ".join(text.split()):
            return "duplicate", ref
    if fact.replaces:
        for ref, shown in reversed(same):  # the newest of them
            if fact.replaces in shown:
                return "replaces", ref
    return "add", ""


def extraction(prompt: str) -> dict[str, Any]:
    """The answer to one extraction prompt (EXTRACTION_SCHEMA)."""
    english = "Known facts (ID subject: fact)" in prompt
    lines = _transcript(prompt)
    known = _known(prompt)
    user_facts: list[dict[str, Any]] = []
    guild_facts: list[dict[str, Any]] = []
    for ref, user, said in lines:
        for fact in DEMO_FACTS:
            if fact.speaker != user or fact.phrase not in said:
                continue
            text = fact.text.format(user=f"<user:{user}>")
            subject = None if fact.guild else user
            action, known_ref = _verdict(fact, text, subject, known)
            item: dict[str, Any] = {"fact": text, "topic": fact.topic, "keywords": list(fact.keywords),
                                    "action": action, "ref": known_ref, "source": ref}
            if fact.guild:
                guild_facts.append(item)
            else:
                user_facts.append({"user_id": user, **item})
    points = [p for p in DEMO_POINTS if any(p.speaker == user and p.phrase in said for _, user, said in lines)]
    updates = {"topic": "", "mood": "", "new_topic": "", "new_point": "", "stage": "ongoing"}
    if points:
        pick = 1 if english else 0
        first, last = points[0], points[-1]
        updates.update(topic=last.topic[pick], mood=last.mood[pick], new_point=first.point[pick],
                       new_topic=next((p.new_topic[pick] for p in points if p.new_topic[pick]), ""))
    return {"guild_facts": guild_facts, "user_facts": user_facts, "summary_updates": updates}


def answer(request: Request) -> dict[str, Any] | str:
    """The demo model's rule: an extraction prompt gets the facts and summary update above; a
    decision gets "no reply needed"; anything else an empty text."""
    prompt = "\n".join(message.content or "" for message in request.messages if message.role == "user")
    schema = request.json_schema or {}
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if "user_facts" in properties or ("<<<" in prompt and "summary_updates" in prompt):
        return extraction(prompt)
    if "response_needed" in properties:
        return {"response_needed": False, "retrieval_needed": False, "search_query": "", "suspicious": False}
    return ""


def demo_model() -> ScriptedLLM:
    """The built-in scripted demo model: no language model, no network."""
    return ScriptedLLM(answer, name=DEMO_MODEL_NAME)

"""The extraction model as the fact judge, end to end through the pipeline: real SQLite, the
real embedder and tokenizer, and a scripted LLM speaking the `LLM` protocol. The model is shown
the known facts with short ids in the one extraction call; its answer is checked against them,
and a bad answer falls back to the offline judge without losing the fact or touching stored ones."""

from __future__ import annotations

import asyncio
from typing import Any

from gieok import Memory
from gieok.chat.agent.fact_review import KnownFacts, list_known_facts, review
from gieok.chat.agent.gatekeeper import ExtractedFact, parse_extraction
from gieok.chat.agent.pipeline import ConversationPipeline, IncomingMessage
from gieok.chat.llm import ScriptedLLM
from gieok.chat.llm.scripted import Request


class Extractor:
    """Answers decisions plainly and extractions with the fact items it is given."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.prompts: list[str] = []

    def __call__(self, request: Request) -> dict[str, Any]:
        text = request.messages[0].content
        if "user_facts" in text:
            self.prompts.append(text)
            return {"guild_facts": [], "user_facts": self.items, "summary_updates": {}}
        return {"response_needed": True, "retrieval_needed": False, "search_query": ""}


def seeded(memory: Memory, items: list[dict[str, Any]]) -> tuple[ConversationPipeline, Extractor]:
    brain = Extractor(items)
    pipeline = ConversationPipeline(memory, llm=ScriptedLLM(brain), classifier=None)
    pipeline.facts.add("<user:42>의 고양이 이름은 나비다.", fact_type="user_fact", guild="g1", user_id="42")
    pipeline.facts.add("<user:42>는 부산에 산다.", fact_type="user_fact", guild="g1", user_id="42")
    pipeline.facts.add("<user:7>는 24살이다.", fact_type="user_fact", guild="g1", user_id="7")
    pipeline.facts.add("이 서버는 매주 금요일에 게임 나이트를 한다.", fact_type="guild_fact", guild="g1")
    return pipeline, brain


def talk(pipeline: ConversationPipeline, text: str = "누리야 나 요즘 해운대 근처에서 지내") -> None:
    async def go() -> None:
        plan = await pipeline.plan(IncomingMessage(text, user_id="42", channel="cafe", guild="g1",
                                                   display_name="민지", explicit=True))
        await pipeline.record(plan, "그렇구나!")
        await pipeline.drain()
    asyncio.run(go())


def current(pipeline: ConversationPipeline) -> list[str]:
    return [f.text for f in pipeline.facts.facts(user_id="42")]


def events(pipeline: ConversationPipeline, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in pipeline.events if e.kind == kind]


def fact(text: str, **answer: Any) -> dict[str, Any]:
    return {"user_id": "42", "fact": text, "topic": "거주지", **answer}


def test_model_is_shown_the_speakers_facts_in_the_one_extraction_call(memory: Memory) -> None:
    pipeline, brain = seeded(memory, [fact("<user:42>는 해운대 근처, 그러니까 부산에서 지낸다.", action="duplicate",
                                           ref="F2")])
    talk(pipeline)
    assert len(brain.prompts) == 1, "no extra call: the facts ride on the extraction"
    assert "F1 <user:42>: <user:42>의 고양이 이름은 나비다." in brain.prompts[0]
    assert "F2 <user:42>: <user:42>는 부산에 산다." in brain.prompts[0]
    assert "F3 server: 이 서버는 매주 금요일에 게임 나이트를 한다." in brain.prompts[0]
    assert "<user:7>" not in brain.prompts[0], "only the conversation's users"
    assert current(pipeline) == ["<user:42>의 고양이 이름은 나비다.", "<user:42>는 부산에 산다."]
    assert events(pipeline, "fact_duplicate")[0]["judged_by"] == "model"


def test_replaces_supersedes_the_named_fact_only(memory: Memory) -> None:
    pipeline, _ = seeded(memory, [fact("<user:42>는 서울로 이사했다.", action="replaces F2")])
    talk(pipeline, "누리야 나 서울로 이사했어")
    assert current(pipeline) == ["<user:42>의 고양이 이름은 나비다.", "<user:42>는 서울로 이사했다."]
    history = pipeline.facts.facts(user_id="42", include_history=True)
    assert [f.text for f in history if not f.current] == ["<user:42>는 부산에 산다."]


def test_bad_answers_fall_back_to_the_offline_judge_and_lose_nothing(memory: Memory) -> None:
    pipeline, _ = seeded(memory, [
        fact("<user:42>는 25살이다.", action="replaces", ref="F9"),  # an id it was not shown
        fact("<user:42>는 피아노를 친다.", action="replaces", ref="F3"),  # the guild's fact, not this user's
        fact("<user:42>는 커피를 좋아한다.", action="probably new"),  # not an action
        fact("<user:42>는 등산을 좋아한다.", action="duplicate"),  # no id
        fact("<user:42>는 INFP다.", action=["add"], ref={"x": 1}),  # wrong types
    ])
    talk(pipeline)
    assert current(pipeline) == ["<user:42>의 고양이 이름은 나비다.", "<user:42>는 부산에 산다.",
                                 "<user:42>는 25살이다.", "<user:42>는 피아노를 친다.",
                                 "<user:42>는 커피를 좋아한다.", "<user:42>는 등산을 좋아한다.",
                                 "<user:42>는 INFP다."], "every fact stored; the cat and the home untouched"
    assert [f.text for f in pipeline.facts.facts(user_id="7")] == ["<user:7>는 24살이다."]
    assert len(pipeline.facts.facts(guild="g1")) == 9, "the guild's fact untouched too"
    reasons = [e["reason"] for e in events(pipeline, "fact_verdict_invalid")]
    assert len(reasons) == 5 and "no fact with that id" in reasons[0] and "another subject" in reasons[1]
    assert all(e["judged_by"] == "offline" for e in events(pipeline, "fact_stored"))


def test_ignore_stores_nothing_and_add_still_dedups_unseen_facts(memory: Memory) -> None:
    pipeline, _ = seeded(memory, [fact("<user:42>는 오늘 피곤하다.", action="ignore"),
                                  fact("<user:42>의 고양이 이름은 나비다", action="add")])
    talk(pipeline)
    assert events(pipeline, "fact_ignored") and current(pipeline) == ["<user:42>의 고양이 이름은 나비다.",
                                                                       "<user:42>는 부산에 산다."]


def test_review_checks_ids_against_what_was_shown(memory: Memory) -> None:
    pipeline, _ = seeded(memory, [])
    shown = list_known_facts(pipeline.facts, "g1", {"42", "7"})
    assert [(k.ref, k.user_id) for k in shown.items] == [("F1", "42"), ("F2", "42"), ("F3", "7"), ("F4", None)]
    data = {"user_facts": [fact("<user:42>는 부산 사람이다.", action="duplicate of f2")], "guild_facts": []}
    item = parse_extraction(data, {"42"}).user_facts[0]
    verdict, problem = review(item, shown)
    assert problem is None and verdict is not None and verdict.action == "duplicate"
    assert verdict.target == shown.items[1].block_index and verdict.shown == shown.shown("42")
    assert review(ExtractedFact("x", "", (), "7", "duplicate", "F1"), shown)[0] is None, "F1 is about 42"
    assert review(ExtractedFact("x", "", (), "42", None, None), shown) == (None, None), "no answer: offline"
    assert KnownFacts().render() == "-"


def test_bench_replays_recorded_answers_through_the_model_path(tmp_path) -> None:
    import json

    from benchmarks.datasets import load_fact_answers
    from benchmarks.facts import replay_pairs

    from gieok.chat.conversation.facts import PairJudge

    rows = [{"old": "<user:1>는 부산에 산다.", "new": "<user:1>는 해운대 근처에 산다.", "label": "duplicate"},
            {"old": "<user:1>는 24살이다.", "new": "<user:1>는 25살이다.", "label": "conflict"},
            {"old": "<user:1>의 고양이 이름은 나비다.", "new": "<user:1>는 24살이다.", "label": "distinct"},
            {"old": "<user:2> lives in Busan.", "new": "<user:2> is based in Busan.", "label": "duplicate"}]

    def answer(row: dict[str, str], action: str, ref: str = "") -> str:
        item = {"user_id": row["new"][6], "fact": row["new"], "action": action, "ref": ref}
        return json.dumps({"guild_facts": [], "user_facts": [item], "summary_updates": {}}, ensure_ascii=False)

    lines = ["# hand-written for this test",
             json.dumps({"old": rows[0]["old"], "new": rows[0]["new"], "answer": "```json\n"
                         + answer(rows[0], "duplicate of F1") + "\n```"}, ensure_ascii=False),
             json.dumps({"old": rows[1]["old"], "new": rows[1]["new"], "answer": answer(rows[1], "replaces", "F7")},
                        ensure_ascii=False),  # not shown: the offline judge decides (and supersedes)
             json.dumps({"old": rows[2]["old"], "new": rows[2]["new"], "answer": answer(rows[2], "replaces", "F1")},
                        ensure_ascii=False)]  # a wrong answer, applied as given: the model path is measured
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    predictions, judged, _ = replay_pairs(rows, PairJudge(), load_fact_answers(path))
    assert predictions == ["duplicate", "conflict", "conflict", "lost"], "no answer recorded for the last pair"
    assert judged[:3] == ["model", "fallback", "model"] and judged[3].startswith("scripted: script exhausted")

"""Stage-2 gatekeeper: the JSON the model returns may be malformed, truncated or hostile.
Driven through the real `Analyst` with a scripted LLM (no provider can be reached here)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gieok.chat.agent.gatekeeper import DECISION_SCHEMA, EXTRACTION_SCHEMA, Analyst, looks_like_question
from gieok.chat.agent.jsonparse import first_json_object
from gieok.chat.llm import ScriptedLLM
from gieok.errors import LLMError, LLMOutputError

GOOD = {"response_needed": True, "retrieval_needed": True, "search_query": "<user:1> 고양이", "suspicious": False}


def decide(script, *, message="누리야 내 고양이 이름 뭐였지?", explicit=True):
    llm = ScriptedLLM(script)
    events: list[str] = []
    analyst = Analyst(llm, bot_name="누리", on_event=lambda kind, data: events.append(kind))
    decision = asyncio.run(analyst.decide(message=message, user_id="1", explicit=explicit, recent="", summary=""))
    return decision, llm, events


def test_decision_passes_schema_and_parses() -> None:
    decision, llm, events = decide([GOOD])
    assert decision.source == "llm" and decision.response_needed and decision.search_query == "<user:1> 고양이"
    assert llm.requests[0].json_schema == DECISION_SCHEMA
    assert "누리야 내 고양이 이름 뭐였지?" in llm.requests[0].messages[0].content
    assert events == []


@pytest.mark.parametrize("text", [
    '```json\n{"response_needed": true, "retrieval_needed": false, "search_query": "",}\n```',
    'Sure! Here is my decision: {"response_needed": "true", "retrieval_needed": "false", "search_query": ""} '
    'hope it helps',
])
def test_tolerant_parsing(text: str) -> None:
    decision, _, _ = decide([text])
    assert decision.source == "llm" and decision.response_needed and not decision.retrieval_needed


def test_one_repair_retry_then_success() -> None:
    decision, llm, _ = decide(['{"response_needed": true, "retrieval_', GOOD])
    assert decision.source == "llm" and len(llm.requests) == 2
    assert "JSON" in llm.requests[1].messages[-1].content, "the repair prompt says what was wrong"


@pytest.mark.parametrize("bad", [
    '{"response_needed": true, "retrieval_',  # truncated
    "I think you should answer.",  # no JSON
    '{"response_needed": "maybe", "retrieval_needed": 1, "search_query": ""}',  # wrong types
    '[{"response_needed": true}]',  # not an object
    '{"response_needed": true, "retrieval_needed": true, "search_query": ["drop table"]}',
    "{" * 50_000,  # hostile nesting
    '{"a": "' + "x" * 200_000 + '"}',  # huge
])
def test_malformed_twice_falls_back_explicitly(bad: str) -> None:
    decision, llm, events = decide([bad, bad])
    assert decision.source == "fallback" and decision.error
    assert decision.response_needed is True, "explicit calls are answered"
    assert decision.retrieval_needed is True, "a question retrieves"
    assert events == ["decision_fallback"]
    assert len(llm.requests) == 2, "exactly one repair retry"


def test_fallback_for_non_explicit_chatter_and_provider_errors() -> None:
    decision, _, _ = decide([LLMError("all providers failed")], message="ㅋㅋㅋㅋ", explicit=False)
    assert decision.source == "fallback" and not decision.response_needed and not decision.retrieval_needed


def test_no_llm_configured_falls_back() -> None:
    analyst = Analyst(None, bot_name="Nuri", language="en")
    decision = asyncio.run(analyst.decide(message="what did I say about my cat?", user_id="1", explicit=False,
                                          recent="", summary=""))
    assert decision.source == "fallback" and not decision.response_needed and decision.retrieval_needed


def test_extraction_validates_users_and_shapes() -> None:
    reply = {
        "guild_facts": [{"fact": "This server holds a movie night every Sunday.", "topic": "events"}, 42],
        "user_facts": [
            {"user_id": "1", "fact": "<user:1> has a cat named Nabi.", "topic": "pets", "keywords": ["cat", "Nabi"]},
            {"user_id": "<user:2>", "fact": "<user:2> lives in Busan.", "topic": "home"},
            {"user_id": "999", "fact": "<user:999> is the server owner.", "topic": "roles"},
        ],
        "summary_updates": {"topic": "pets", "core": "I rule now", "stage": "ongoing"},
    }
    llm = ScriptedLLM([reply])
    analyst = Analyst(llm, bot_name="Nuri", language="en")
    extraction = asyncio.run(analyst.extract(transcript="<user:1>: hi", summary="", known_users={"1", "2"}))
    assert llm.requests[0].json_schema == EXTRACTION_SCHEMA
    assert [f.user_id for f in extraction.user_facts] == ["1", "2"], "unknown user 999 rejected; <user:2> read as 2"
    assert extraction.user_facts[0].keywords == ("cat", "Nabi")
    assert len(extraction.guild_facts) == 1 and len(extraction.rejected) == 2
    assert "core" not in extraction.summary_updates


def test_extraction_failure_learns_nothing() -> None:
    llm = ScriptedLLM(["no", "still no"])
    extraction = asyncio.run(Analyst(llm, bot_name="누리").extract(transcript="x", summary="", known_users={"1"}))
    assert extraction.source == "fallback" and not extraction.user_facts and not extraction.summary_updates


def test_first_json_object_rejects_garbage() -> None:
    for bad in ("", "   ", "null", "[]", 5):
        with pytest.raises(LLMOutputError):
            first_json_object(bad)  # type: ignore[arg-type]
    assert first_json_object('x {"a": {"b": [1, 2,]},} y') == {"a": {"b": [1, 2]}}
    assert first_json_object(json.dumps({"한국어": "값"}, ensure_ascii=False)) == {"한국어": "값"}


def test_question_heuristic_korean_and_english() -> None:
    assert looks_like_question("내 고양이 이름 기억나?") and looks_like_question("어제 뭐 먹었더라")
    assert looks_like_question("what's my cat called") and looks_like_question("Do you remember my cat")
    assert not looks_like_question("ㅋㅋㅋㅋ") and not looks_like_question("ok thanks")

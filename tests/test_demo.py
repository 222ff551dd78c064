"""`gieok demo` fills every layer without a language model: the built-in scripted demo model
(chat/llm/demo_model.py) answers the pipeline's extraction prompts from the bundled chat, so the
demo memory holds facts (with history and the message each came from) and a summary beside its
turns, and its speakers are the memory's users."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cli_runner import gieok
from gieok import Memory
from gieok.chat.agent.gatekeeper import Analyst
from gieok.chat.conversation.memory import ConversationMemory
from gieok.chat.conversation.recent import conversation_of
from gieok.chat.demo import load_sample_conversation
from gieok.chat.llm.demo_model import DEMO_FACTS, DEMO_POINTS, demo_model

SPEAKERS = ["Alex", "Emily", "민지", "지훈"]


def test_every_phrase_of_the_demo_models_tables_is_in_a_line_of_its_speaker() -> None:
    lines = [(turn["speaker"], turn["text"]) for session in load_sample_conversation()["sessions"]
             for turn in session["turns"]]
    for entry in (*DEMO_FACTS, *DEMO_POINTS):
        said = [text for speaker, text in lines if speaker == entry.speaker and entry.phrase in text]
        assert len(said) == 1, (entry.phrase, said)  # exactly one line states it: one source


def test_the_demo_model_answers_an_extraction_prompt_with_sourced_facts_and_a_replacement() -> None:
    analyst = Analyst(demo_model(), bot_name="누리")
    transcript = "\n".join([
        "[m1 2026-06-01 (월) 20:36] <user:민지>: 보리 벌써 6개월 됐어! 이제 3.2킬로",
        "[m2 2026-06-01 (월) 20:37] <user:Emily>: she's not tiny anymore 😭",
        "[m3 2026-06-01 (월) 20:43] <user:Emily>: also I have news! I passed TOPIK level 5",
        "[m4 2026-06-01 (월) 20:44] 누리: 축하해!"])
    known = "F1 <user:민지>: <user:민지>의 고양이 보리는 2차 접종을 맞았고 몸무게는 1.8킬로다"
    extraction = asyncio.run(analyst.extract(transcript=transcript, summary="", known_users={"민지", "Emily"},
                                             known_facts=known, language="ko"))
    assert extraction.source != "fallback", extraction.error
    facts = {f.user_id: f for f in extraction.user_facts}
    assert facts["민지"].text == "<user:민지>의 고양이 보리는 6개월이 됐고 몸무게는 3.2킬로다"
    assert (facts["민지"].action, facts["민지"].ref, facts["민지"].source) == ("replaces", "F1", "m1")
    assert facts["Emily"].text == "<user:Emily> passed TOPIK level 5"  # an English line: an English fact
    assert (facts["Emily"].action, facts["Emily"].source) == ("add", "m3")
    assert extraction.summary_updates["new_point"] == "<user:Emily>가 TOPIK 5급에 합격했다"  # the prompt's language
    # a conversation it has no table for: nothing learned, nothing made up
    quiet = asyncio.run(analyst.extract(transcript="[m1 2026-06-01 (Mon) 20:36] <user:7>: I love tea", summary="",
                                        known_users={"7"}, language="en"))
    assert not quiet.user_facts and not quiet.guild_facts


@pytest.mark.slow
def test_the_demo_fills_facts_summary_and_users_offline(tmp_path: Path) -> None:
    """`gieok demo` through the command line's entry point (one run: the demo is the suite's
    slowest command line), then what it stored."""
    db = tmp_path / "demo.db"
    ran = gieok("demo", "--db", str(db), "-k", "5", columns=200)
    assert ran.returncode == 0, ran.stderr
    printed = ran.stdout
    assert "facts and summaries by the built-in scripted demo model (no language model needed)" in printed
    assert "added 300 messages" in printed and "questions had their evidence turn in the top 5" in printed
    data = load_sample_conversation()
    with Memory(db) as memory:
        layers = ConversationMemory(memory)
        facts = layers.facts.facts(include_history=True, limit=1000)
        current = [f for f in facts if f.current]
        assert len(current) > 20 and len(facts) - len(current) >= 5
        # through the agents' write path: the conversation has its recent messages (the dashboard's
        # Conversations page reads them) beside its 300 turns
        channels = layers.channels()
        assert len(channels) == 1 and channels[0]["messages"] >= 50
        assert all(f.source_message for f in facts), [f.text for f in facts if not f.source_message]
        by_text = {f.text: f for f in facts}
        name = by_text["<user:민지>의 고양이 이름은 보리다"]
        assert name.current and name.source_message == "s1-t15" and name.user_id == "민지"
        weight = next(f for f in facts if "3.2킬로" in f.text)  # a fact that changed: its history
        assert weight.current and weight.source_message == "s6-t13"
        (before, _), (now, _) = layers.facts.history(weight.block_index)
        assert before.text == "<user:민지>의 고양이 보리는 2차 접종을 맞았고 몸무게는 1.8킬로다"
        assert before.source_message == "s4-t22" and before.superseded_by == now.block_index == weight.block_index
        assert before.valid_to == now.valid_from  # replaced when the new weight was said
        assert by_text["<user:Emily>'s birthday is May 9"].source_message == "s3-t24"
        assert by_text["<user:Alex>는 6월 20일에 성수동으로 이사한다"].current
        assert {f.user_id for f in facts if f.current and f.user_id} == set(SPEAKERS)
        assert any(f.fact_type == "guild_fact" and f.guild == data["guild"] for f in facts)
        summary = layers.summaries.get(conversation_of(data["guild"], data["channel"]))
        assert summary.topic and len(summary.key_points) >= 5 and summary.ongoing_topics
        assert any("성수동" in point for point in summary.key_points) and "제주" in summary.topic
        users = layers.tables.users_page(None, 100)
        assert [u.user_id for u in users] == SPEAKERS
        assert all(u.messages > 0 and u.facts > 0 and u.names == (u.user_id,) for u in users)
        assert memory.stats().by_kind["turn"] == 300 and memory.verify().ok

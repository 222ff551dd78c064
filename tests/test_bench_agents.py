"""`gieok bench agents` end to end, small: a LoCoMo-format file of two short conversations (Korean
and English) played by 1 and then 2 agents at once against a real `gieok serve`, 6 loops per level;
the JSON's shape, no errors, times present, and every agent's messages stored in its own
conversation (the adds with `--index behind`: every turn block written before a level ends).
Behaviour only, never speed. Then the bad input it refuses before anything starts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from benchmarks.agents import Exchange, _agent, _Level, load_exchanges, split_turns
from benchmarks.context import slug

from cli_runner import gieok
from gieok import Memory

KOREAN = [("민지", "주말에 북한산 다녀왔어"), ("준호", "와 날씨 좋았겠다. 정상까지 갔어?"),
          ("민지", "응, 백운대까지 올라갔어"), ("준호", "나도 다음엔 같이 가고 싶다"),
          ("민지", "요즘 고양이 나비가 밥을 잘 안 먹어"), ("준호", "병원에는 가봤어?"),
          ("민지", "내일 동물병원 예약했어"), ("준호", "별일 아니었으면 좋겠다"),
          ("민지", "회사 근처에 새 카페가 생겼어"), ("준호", "커피 맛은 어때?"),
          ("민지", "라떼가 진짜 고소해"), ("준호", "이번 주에 같이 가자"),
          ("민지", "토요일에 부산 가는 기차 탔어"), ("준호", "해운대 가는 거야?"),
          ("민지", "응, 바다 보면서 산책하려고"), ("준호", "사진 많이 찍어 와")]
ENGLISH = [("Alex", "I just adopted a dog named Max"), ("Sam", "Congrats! What breed is he?"),
           ("Alex", "A beagle, two years old"), ("Sam", "Beagles love long walks"),
           ("Alex", "I started learning the cello last month"), ("Sam", "How are the lessons going?"),
           ("Alex", "Slowly, my bowing is still shaky"), ("Sam", "Practice every day and it will come"),
           ("Alex", "We are moving to Berlin in the spring"), ("Sam", "For the new job at Nuvola Labs?"),
           ("Alex", "Yes, I start there in April"), ("Sam", "That is exciting news"),
           ("Alex", "My sister is visiting next weekend"), ("Sam", "Are you showing her around town?"),
           ("Alex", "We will go to the river market"), ("Sam", "Try the fish tacos there")]


def _locomo(path: Path) -> list[Exchange]:
    """Two conversations of one session each (8 exchanges each: 12 are played, none twice)."""
    samples = []
    for sample_id, turns in (("conv-ko", KOREAN), ("conv-en", ENGLISH)):
        session = [{"speaker": who, "dia_id": f"D1:{n}", "text": text} for n, (who, text) in enumerate(turns, 1)]
        samples.append({"sample_id": sample_id, "qa": [],
                        "conversation": {"speaker_a": turns[0][0], "speaker_b": turns[1][0],
                                         "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session}})
    path.write_text(json.dumps(samples, ensure_ascii=False), encoding="utf-8")
    return load_exchanges(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bench-agents")
    exchanges = _locomo(tmp / "locomo.json")
    out = tmp / "agents.json"
    done = gieok("bench", "agents", "--agents", "2,1", "--turns", "6", "--data", tmp / "locomo.json",
                 "--max-seconds", "60", "--db", tmp / "work", "--index", "behind", "--json", out)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"report": json.loads(out.read_text(encoding="utf-8")), "stdout": done.stdout,
            "db": tmp / "work" / "agents.db", "exchanges": exchanges}


@pytest.mark.slow  # starts a real `gieok serve`
def test_bench_agents_reports_every_level(run: dict[str, Any]) -> None:
    report = run["report"]
    assert list(report["agents"]) == ["1", "2"]
    for agents, level in report["agents"].items():
        assert {"add_p50_ms", "add_p95_ms", "context_p50_ms", "context_p95_ms", "turns_per_s", "errors",
                "cpu_s_per_turn"} <= set(level)
        assert level["errors"] == 0 and level["turns"] == 6 and not level["stopped_early"], agents
        for name in ("add_p50_ms", "add_p95_ms", "context_p50_ms", "context_p95_ms", "turns_per_s",
                     "cpu_s_per_turn", "server_add_p50_ms", "server_context_p50_ms"):
            assert level[name] > 0, (agents, name)
        assert level["add_p95_ms"] >= level["add_p50_ms"] and level["context_p95_ms"] >= level["context_p50_ms"]
        assert level["calls"] == {"add": 12, "context": 6}  # each add is one message
        assert level["stored"] == {"conversations": int(agents), "messages_stored": 12,
                                   "turn_blocks_listed": 12, "turn_blocks_missing": 0}
        assert level["server_rss_mb"]["after"] > 0
        assert level["all_written"] is True and level["writes_behind_s"] >= 0 and level["answered_turns_per_s"] > 0
    assert report["errors"] == 0 and report["exchanges_reused"] == 0 and report["exchanges_in_file"] == 16
    assert report["engine"]["query"] and report["engine_from"] == "the server's /v1/health"
    assert report["index"] == "behind"
    assert report["embedding_engines"]["query"]
    assert set(report["targets"]) == {"one_agent", "32_agents"} and report["targets"]["32_agents"] is None
    assert isinstance(report["targets"]["one_agent"]["pass"], bool)
    assert "targets (issue 41)" in run["stdout"] and "(graceful)" in run["stdout"]


@pytest.mark.slow
def test_each_agent_kept_its_own_conversation(run: dict[str, Any]) -> None:
    """The 1-agent level played exchanges 1–6, the 2-agent level 7–9 (the Korean conversation's
    last two, then the English one's first) and 10–12: each agent's messages are turns of its own
    channel, in order, every user message under the agent's one user."""
    exchanges: list[Exchange] = run["exchanges"]
    plan = {"agents1-01": exchanges[0:6], "agents2-01": exchanges[6:9], "agents2-02": exchanges[9:12]}
    with Memory(run["db"]) as memory:
        for channel, played in plan.items():
            blocks = sorted(memory.list_blocks(scope={"channel": channel}, kinds="turn", limit=100),
                            key=lambda b: b.block_index)
            expected = [text for e in played for text in (e.user_text, e.reply_text)]
            assert [b.text for b in blocks] == expected, channel
            assert {b.scope.user for b in blocks[0::2]} == {f"{channel}.{slug(played[0].user_name)}"}
    assert run["exchanges"][6].user_text == KOREAN[12][1]  # the 2-agent level began where the first ended


def test_split_and_time_limit() -> None:
    assert split_turns(300, 32)[:2] == [10, 10] and sum(split_turns(300, 32)) == 300
    assert split_turns(6, 4) == [2, 2, 1, 1]
    level = _Level()
    work = [(0, Exchange("c", "D1:1", "D1:2", "민지", "안녕", "준호", "hello"))]
    advanced: list[int] = []
    # past the deadline no loop starts (so no client is ever called)
    asyncio.run(_agent(None, level, "agents1-01", work, time.perf_counter() - 1, advanced.append))
    assert level.attempted == 0 and level.turns == 0 and advanced == []


@pytest.mark.parametrize(("args", "said"), [
    (("--agents", "0"), "--agents"),
    (("--agents", "x,2"), "--agents"),
    (("--agents", "1,8", "--turns", "4"), "--turns"),
    (("--max-seconds", "0"), "--max-seconds"),
    (("--data", "missing.json"), "not found"),
])
def test_bench_agents_refuses_bad_input(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = gieok("bench", "agents", *(str(tmp_path / a) if a.endswith(".json") else a for a in args),
                 "--db", tmp_path / "work")
    assert done.returncode == 1 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
    assert not (tmp_path / "work").exists()

"""The conversation commands through the real entry point, in process (cli_runner.py):
inspect-prompt, summary, facts, lore, forget-user — and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok


def test_inspect_prompt_shows_the_prompt_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    result = gieok("inspect-prompt", "누리야 내 고양이 이름 기억나?", "--channel", "cafe", "--guild", "g1",
                   "--user", "42", "--name", "민지", "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert "respond: True" in result.stdout and "<<<사용자 입력>>>" in result.stdout and "Asia/Seoul" in result.stdout
    as_json = gieok("inspect-prompt", "hello", "--user", "7", "--json", "--db", str(db))
    data = json.loads(as_json.stdout)
    assert data["respond"] is True and data["decision"] is None and "timings_ms" in data
    stats = json.loads(gieok("stats", "--json", "--db", str(db)).stdout)
    assert stats["blocks"] == 0, "a dry run stores nothing"


def test_inspect_prompt_errors_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    for args in (["   "], ["x" * 4001], ["hi", "--user", "two words"]):  # max_input_chars: 4,000
        result = gieok("inspect-prompt", *args, "--db", str(db))
        assert result.returncode == 1 and result.stderr.count("\n") == 1 and result.stderr.startswith("error:"), \
            result.stderr


def test_summary_core_facts_and_lore(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    set_core = gieok("summary", "--channel", "cafe", "--guild", "g1", "--set-core", "이 채널은 여행 이야기 전용이다",
                     "--json", "--db", str(db))
    assert set_core.returncode == 0, set_core.stderr
    assert json.loads(set_core.stdout)["core"] == ["이 채널은 여행 이야기 전용이다"]
    shown = gieok("summary", "--channel", "cafe", "--guild", "g1", "--db", str(db))
    assert "여행 이야기 전용" in shown.stdout
    lore = tmp_path / "lore.txt"
    lore.write_text("세계관: 누리는 기억의 도서관에 산다.\n# comment\n", encoding="utf-8")
    assert "seeded 1" in gieok("lore", str(lore), "--db", str(db)).stdout
    assert "seeded 0" in gieok("lore", str(lore), "--db", str(db)).stdout
    listed = json.loads(gieok("facts", "--json", "--db", str(db)).stdout)
    assert [f["text"] for f in listed] == ["누리는 기억의 도서관에 산다."] and listed[0]["fact_type"] == "lore"
    missing = gieok("lore", str(tmp_path / "nope.txt"), "--db", str(db))
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_forget_user_needs_confirmation(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    typo = gieok("forget-user", "42", "--yes", "--db", str(tmp_path / "bto.db"))
    assert typo.returncode == 1 and typo.stderr.startswith("error: no memory at") and not (tmp_path / "bto.db").exists()
    assert gieok("stats", "--db", str(db)).returncode == 0  # the memory made
    refused = gieok("forget-user", "42", "--db", str(db), stdin="n\n")
    assert refused.returncode == 1 and "nothing erased" in refused.stderr
    done = gieok("forget-user", "42", "--yes", "--db", str(db))
    assert done.returncode == 0 and "erased 0 fact(s)" in done.stdout


def test_bench_facts_scores_a_labeled_file(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"old": "<user:1>는 24살이다.", "new": "<user:1>는 25살이다.", "label": "conflict"},
            {"old": "<user:1>는 고양이 나비를 키운다.", "new": "<user:1>는 고양이 나비를 키운다", "label": "duplicate"},
            {"old": "<user:1> likes tea.", "new": "<user:2> likes tea.", "label": "distinct"}]
    pairs.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "facts.json"
    result = gieok("bench", "facts", "--data", str(pairs), "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["n"] == 3 and report["dedup_precision"] == 1.0 and report["conflict_recall"] == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"old": "a", "new": "b", "label": "maybe"}\n', encoding="utf-8")
    refused = gieok("bench", "facts", "--data", str(bad))
    assert refused.returncode == 1 and "line 1" in refused.stderr


@pytest.mark.slow
def test_bench_runtime_loses_and_misroutes_nothing(tmp_path: Path) -> None:
    """A small run of the real benchmark (loopback provider in its own process, real runtime):
    behaviour only — every message stored and answered in its own channel; speed is the
    benchmark's business, not this test's."""
    out = tmp_path / "runtime.json"
    result = gieok("bench", "runtime", "--blocks", "0", "--channels", "3", "--duration", "2", "--rate", "2",
                   "--json", str(out), "--db", str(tmp_path / "bench"))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["messages_sent"] == 12 and report["messages_lost"] == 0 and report["misrouted_replies"] == 0
    assert report["messages_answered"] == 12 and report["arrivals"] == "random"
    assert set(report["turn_overhead_ms"]) == {"p50", "p95"}
    refused = gieok("bench", "runtime", "--arrivals", "bursty")
    assert refused.returncode == 1 and "--arrivals" in refused.stderr


@pytest.mark.slow
def test_bench_pipeline_plays_the_conversation_with_and_without_a_debounce(tmp_path: Path) -> None:
    """A small run of the real benchmark: every message after the warm-up planned and measured,
    both ways (planned at once, or observed and planned after a debounce as the runtime does)."""
    for extra in ([], ["--debounce-ms", "30"]):
        out = tmp_path / f"pipeline{len(extra)}.json"
        result = gieok("bench", "pipeline", "--blocks", "0", "--turns", "16", *extra, "--json", str(out),
                       "--db", str(tmp_path / f"bench{len(extra)}"))
        assert result.returncode == 0, result.stderr
        report = json.loads(out.read_text(encoding="utf-8"))
        assert report["measured"] == 6 and report["responded"] >= 6 and report["debounce_ms"] == (30 if extra else 0)
        assert report["searched"] >= 1 and "query_embed_ms" in report["stages_p50_ms"]
    refused = gieok("bench", "pipeline", "--debounce-ms", "-5")
    assert refused.returncode == 1 and "--debounce-ms" in refused.stderr


def test_runtime_bench_arrival_schedules() -> None:
    from benchmarks.runtime import arrival_schedule

    for arrivals in ("random", "even"):
        schedule = arrival_schedule(4, 10.0, 2.0, arrivals, seed=3)
        assert len(schedule) == 4 * 20 and schedule == sorted(schedule)
        assert all(0.0 <= at < 10.0 for at, _, _ in schedule)
        for channel in range(4):
            numbers = [n for _, c, n in schedule if c == channel]
            assert numbers == list(range(20)), "each channel's messages go out in order"
    even = arrival_schedule(4, 10.0, 2.0, "even")
    assert [(at, c) for at, c, _ in even[:4]] == [(0.0, 0), (0.125, 1), (0.25, 2), (0.375, 3)]
    assert arrival_schedule(4, 10.0, 2.0, "random", seed=3) == arrival_schedule(4, 10.0, 2.0, "random", seed=3)


def test_an_access_request_to_a_file_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "bot.db"
    typo = gieok("users", "export", "42", "--out", str(tmp_path / "42.json"), "--db", str(tmp_path / "bto.db"))
    assert typo.returncode == 1 and typo.stderr.startswith("error: no memory at"), "not an empty export"
    assert not (tmp_path / "bto.db").exists() and not (tmp_path / "42.json").exists()
    assert gieok("stats", "--db", str(db)).returncode == 0  # the memory made
    for target in (tmp_path / "no" / "such" / "dir" / "42.json", tmp_path):
        result = gieok("users", "export", "42", "--out", str(target), "--db", str(db))
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("error: cannot open") and "Traceback" not in result.stderr
    written = gieok("users", "export", "42", "--out", str(tmp_path / "42.json"), "--db", str(db))
    assert written.returncode == 0 and json.loads((tmp_path / "42.json").read_text(encoding="utf-8"))["user"] == "42"

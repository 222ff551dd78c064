"""`gieok bench context` end to end, small: a slice of LoCoMo (one conversation, one session: 17
turns and the 16 questions whose evidence lies in it, in four categories) fed through a real
`gieok serve` subprocess, the context and the plain search at two budgets, the in-process
comparisons, the JSON it writes; and the bad input it refuses before anything starts (in this
process, through the real entry point: cli_runner.py). Behaviour only (shape, ranges, no errors),
never speed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks.context import _in_process_search, load_context_data

from cli_runner import gieok

GIEOK = [sys.executable, "-m", "gieok.cli"]
RUN_SECONDS = 900  # the whole small run: model loading in two processes, 17 turns embedded twice
# Session 2 alone: every turn is embedded twice (through the server, in process), so the turns are
# what the run costs; sessions 1 and 2 doubled them for one more category (3, one question).
SESSIONS = (2,)
_EVIDENCE = re.compile(r"^D(\d+):(\d+)$")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    return {**env, "OMP_WAIT_POLICY": "PASSIVE", "COLUMNS": "200"}


def _slice(source: Path, target: Path) -> dict[str, Any]:
    """The first conversation's sessions `SESSIONS` and the questions answered inside them."""
    sample = json.loads(source.read_text(encoding="utf-8"))[0]
    conv = sample["conversation"]
    kept = {k: v for k, v in conv.items() if not re.fullmatch(r"session_\d+(_date_time)?", k)}
    dia_ids: set[str] = set()
    for n in SESSIONS:
        kept[f"session_{n}"] = conv[f"session_{n}"]
        kept[f"session_{n}_date_time"] = conv[f"session_{n}_date_time"]
        dia_ids.update(turn["dia_id"] for turn in conv[f"session_{n}"])
    qa = [q for q in sample["qa"] if q.get("evidence")
          and all(isinstance(e, str) and _EVIDENCE.match(e) and e in dia_ids for e in q["evidence"])]
    target.write_text(json.dumps([{"sample_id": sample["sample_id"], "conversation": kept, "qa": qa}],
                                 ensure_ascii=False), encoding="utf-8")
    return {"turns": len(dia_ids), "questions": len(qa), "categories": {str(q["category"]) for q in qa}}


@pytest.mark.slow
def test_bench_context_end_to_end(locomo_path: Path, tmp_path: Path) -> None:
    data = tmp_path / "slice.json"
    sizes = _slice(locomo_path, data)
    assert 10 <= sizes["turns"] <= 80 and sizes["questions"] >= 5
    out = tmp_path / "context.json"
    done = subprocess.run([*GIEOK, "bench", "context", "--data", str(data), "--budget", "2000,500",
                           "--db", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, env=_env(), timeout=RUN_SECONDS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))

    assert report["messages"] == sizes["turns"] and report["questions"] == sizes["questions"]
    assert report["conversations"] == 1 and report["errors"] == 0 and report["stored_without_block"] == 0
    assert report["facts_and_summaries"] == "off" and report["llm"] is None
    assert set(report["budgets"]) == {"500", "2000"}
    for budget, row in report["budgets"].items():
        for name in ("context_recall", "search_recall"):
            assert 0.0 <= row[name] <= 1.0, (budget, name)
        assert set(row["by_category"]) == sizes["categories"]
        for values in row["by_category"].values():
            assert 0.0 <= values["context_recall"] <= 1.0 and 0.0 <= values["search_recall"] <= 1.0
        assert sum(values["questions"] for values in row["by_category"].values()) == sizes["questions"]
        assert 0 < row["context_tokens_p50"] <= int(budget) and 0 < row["search_tokens_p50"] <= int(budget)
        assert row["evidence_found"] > 0
    # every evidence turn counted as in a context is in its text
    assert report["checks"]["not_in_text"] == 0
    # a question's first context call embeds it; every later one finds its vector cached
    samples = report["latency_samples"]
    assert 0 < samples["context_with_embedding"] <= (sizes["questions"] + 1) // 2  # the even-numbered questions
    assert samples["context_without_embedding"] > samples["context_with_embedding"]
    for name in ("context_p50_ms", "context_p95_ms"):
        assert report[name]["with_embedding"] > 0 and report[name]["without_embedding"] > 0
    assert report["in_process_search_p50_ms"] > 0
    assert report["ingest_messages_per_s"] > 0 and report["add_many_messages_per_s"] > 0
    assert report["context_search_k"] == {"500": 20, "2000": 80}

    targets = report["targets"]
    assert set(targets) == {"context_recall_at_2000", "context_p50_without_embedding", "ingest_rate",
                            "http_adds_search", "http_adds_context"}
    assert all(isinstance(target["pass"], bool) for target in targets.values())
    recall = targets["context_recall_at_2000"]
    assert recall["context_recall"] == report["budgets"]["2000"]["context_recall"]
    assert recall["pass"] == (recall["context_recall"] >= max(recall["search_recall"], 0.8))
    p50 = targets["context_p50_without_embedding"]
    assert p50["limit_ms"] == pytest.approx(report["in_process_search_p50_ms"] + 5, abs=1e-6)
    # what HTTP adds to the same search (k=100, in process) and to the server's own context time
    search, context = targets["http_adds_search"], targets["http_adds_context"]
    assert search["in_process_p50_ms"] == report["in_process_api_search_p50_ms"] > 0
    assert search["http_p50_ms"] == report["search_p50_ms"]["without_embedding"]
    assert context["server_own_p50_ms"] == report["server_context_p50_ms"]["without_embedding"]
    for adds, base in ((search, search["in_process_p50_ms"]), (context, context["server_own_p50_ms"])):
        assert adds["adds_ms"] == pytest.approx(adds["http_p50_ms"] - base, abs=1e-3)
        assert adds["pass"] == (adds["adds_ms"] <= 1.5 + 1e-9)
    assert "what HTTP adds: POST /v1/search k=100" in done.stdout
    # a budget whose context search is /v1/search's k (100) still times the API's search once a question
    in_process = _in_process_search(tmp_path / "work" / "context.db", load_context_data(data), [4000], 10)
    assert in_process["ks"] == [100] and in_process["as_api"]["searches"] == in_process["searches"] > 0
    # the tables name the targets, and the server was stopped gracefully
    assert "targets" in done.stdout and "context recall at 2,000 tokens" in done.stdout
    assert "(graceful)" in done.stdout
    assert (tmp_path / "work" / "server.log").is_file()


def test_bench_context_help_has_an_example() -> None:
    done = gieok("bench", "context", "--help")
    assert done.returncode == 0 and "Example:" in done.stdout and "--budget" in done.stdout


def _not_locomo(tmp_path: Path) -> Path:
    path = tmp_path / "other.json"
    path.write_text(json.dumps([{"messages": ["hello"]}]), encoding="utf-8")
    return path


def _not_json(tmp_path: Path) -> Path:
    path = tmp_path / "other.txt"
    path.write_text("just text", encoding="utf-8")
    return path


@pytest.mark.parametrize(("args", "message"), [
    (("--budget", "0"), "--budget"),
    (("--budget", "x"), "--budget"),
    (("--budget", "1000,99999"), "--budget"),
    (("--llm", "localhost:11434"), "--llm"),
    (("--data", "missing.json"), "not found"),
    (("--data", "not-locomo"), "not LoCoMo JSON"),
    (("--data", "not-json"), "is not JSON"),
])
def test_bench_context_refuses_bad_input(args: tuple[str, ...], message: str, locomo_path: Path,
                                         tmp_path: Path) -> None:
    work = tmp_path / "work"
    given = {"not-locomo": str(_not_locomo(tmp_path)), "not-json": str(_not_json(tmp_path)),
             "missing.json": str(tmp_path / "missing.json")}
    args = tuple(given.get(arg, arg) for arg in args)
    data = () if "--data" in args else ("--data", str(locomo_path))
    done = gieok("bench", "context", *data, *args, "--db", str(work))  # in this process: no server starts
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], done.stderr
    assert not work.exists()  # refused before anything was created

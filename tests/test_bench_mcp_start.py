"""`gieok bench mcp-start --runs 1` end to end (the benchmark in process, through the real entry
point: cli_runner.py): real `gieok mcp` subprocesses driven by the official MCP client over stdio,
a Korean message added and a Korean query answered, the JSON it writes. Behaviour only (shape, no
errors, numbers present), never speed."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_bench_mcp_start_one_run(tmp_path: Path) -> None:
    out = tmp_path / "mcp_start.json"
    work = tmp_path / "work"
    done = gieok("bench", "mcp-start", "--runs", "1", "--db", str(work), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["runs"] == 1 and report["target_s"] == 1.5
    assert list(report["first_calls"]) == ["tools/list", "add_messages", "get_context"]
    for first, row in report["first_calls"].items():
        assert set(row) == {"initialized_p50_s", "first_answer_p50_s", "first_answer_max_s", "pass"}, first
        assert 0 < row["initialized_p50_s"] <= row["first_answer_p50_s"] == row["first_answer_max_s"], first
        assert row["pass"] == (row["first_answer_p50_s"] <= 1.5), first
    assert "spawn → first answer" in done.stdout and "add_messages" in done.stdout
    # the add_messages run stored its Korean message (read with sqlite3: opening a Memory would
    # load the Korean analyser for one look)
    with closing(sqlite3.connect(work / "chat.db")) as db:
        assert db.execute("SELECT count(*) FROM blocks WHERE text LIKE ?", ("%고양이 나비%",)).fetchone() == (1,)


@pytest.mark.slow
def test_bench_mcp_start_through_the_relay(tmp_path: Path) -> None:
    """`--server`: a throwaway gieok serve on the database, each process `gieok mcp --server URL`."""
    out = tmp_path / "mcp_start_relay.json"
    work = tmp_path / "work"
    done = gieok("bench", "mcp-start", "--runs", "1", "--server", "--db", str(work), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["mode"].startswith("relay to gieok serve") and list(report["first_calls"]) == [
        "tools/list", "add_messages", "get_context"]
    for first, row in report["first_calls"].items():
        assert 0 < row["initialized_p50_s"] <= row["first_answer_p50_s"], first
    assert "relay to gieok serve" in done.stdout
    with closing(sqlite3.connect(work / "chat.db")) as db:  # stored by the server the relay handed it to
        assert db.execute("SELECT count(*) FROM blocks WHERE text LIKE ?", ("%고양이 나비%",)).fetchone() == (1,)

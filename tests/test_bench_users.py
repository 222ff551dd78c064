"""`gieok bench users` end to end, small (through the real entry point: cli_runner.py): a real
`gieok serve` subprocess, a user's data read to its end, the users listed, the user erased. Behaviour
only (shape, every message in the export, none after the erasure), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_bench_users_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "users.json"
    done = gieok("bench", "users", "--messages", "300", "--repeat", "2", "--db", str(tmp_path / "work"),
                 "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["messages"] == 300 and report["held_in_export"] >= 300 and len(report["runs"]) == 2
    assert report["export_seconds_p50"] > 0 and report["export_bytes"] > 300 * 50
    assert report["users_listed"] == 3 and report["erased"]["messages"] >= 300
    assert report["messages_after_erasure"] == 0 and report["verify_ok"] is True
    assert set(report["targets"]) == {"export_seconds", "export_memory_mb"}
    assert all(isinstance(t["pass"], bool) for t in report["targets"].values())
    assert "GET /v1/users/{user}" in done.stdout

"""`gieok bench runtime` end to end, small (through the real entry point: cli_runner.py): a loopback
provider over real HTTP, a few channels of calls; behaviour only (none lost, none misrouted, the
model calls reported by purpose), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_bench_runtime_reports_model_calls_per_reply(tmp_path: Path) -> None:
    out = tmp_path / "runtime.json"
    done = gieok("bench", "runtime", "--blocks", "0", "--channels", "2", "--duration", "4", "--rate", "0.5",
                 "--db", str(tmp_path / "work"), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["messages_sent"] == 4 and report["messages_lost"] == 0 and report["misrouted_replies"] == 0
    calls = report["model_calls"]
    assert calls.get("decide", 0) == 0, "a call is answered without a stage-2 decision"
    assert calls["reply"] == report["replies"] >= 1 and calls.get("extract", 0) >= 1
    assert report["model_calls_per_reply"] == round(sum(calls.values()) / report["replies"], 3)
    assert "model calls / reply" in done.stdout

"""`gieok bench webhooks` end to end, small (the benchmark in process, through the real entry point:
cli_runner.py): a real `gieok serve` subprocess restarted once, a receiver that goes down and comes
back, the JSON it writes. Behaviour (every event in, signatures verified, the shape), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_bench_webhooks_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "webhooks.json"
    done = gieok("bench", "webhooks", "--events", "20", "--down-seconds", "2", "--retry-seconds", "0.2",
                 "--retry-max-seconds", "0.5", "--timeout-seconds", "1", "--wait-seconds", "30",
                 "--db", str(tmp_path / "work"), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["events"] == 20 and report["delivered"] == 20 and report["missing"] == 0
    assert report["bad_signatures"] == 0 and report["under_two_ids"] == 0
    assert report["server_delivered"] == 20 and report["server_failed"] == 0
    assert report["server_attempts"] > 20  # the events sent while the receiver was down were tried again
    assert report["up_delay_ms"]["events"] == 14 and report["up_delay_ms"]["p50_ms"] > 0
    assert len(report["restart_ready_s"]) == 2  # started, and started again on the same database
    assert set(report["targets"]) == {"all_delivered", "none_twice_after_dedupe", "up_p50", "signatures_verified"}
    for name in ("all_delivered", "none_twice_after_dedupe", "signatures_verified"):
        assert report["targets"][name]["pass"] is True, name
    assert isinstance(report["targets"]["up_p50"]["pass"], bool)  # speed is the benchmark's, not the test's
    assert "every event delivered" in done.stdout and "targets" in done.stdout
    assert (tmp_path / "work" / "serve-0.log").is_file() and (tmp_path / "work" / "serve-1.log").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (("--events", "2"), "--events"),
    (("--down-seconds", "0"), "--down-seconds"),
    (("--retry-seconds", "-1"), "--retry-seconds"),
])
def test_bench_webhooks_refuses_bad_input(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = gieok("bench", "webhooks", *args, "--db", str(work))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], done.stderr
    assert not work.exists()  # refused before anything was created

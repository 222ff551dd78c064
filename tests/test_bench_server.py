"""`gieok bench server` end to end, small (the benchmark in process, through the real entry point:
cli_runner.py): a real `gieok serve` subprocess, REST at two client
counts, MCP, the JSON it writes. Behaviour only (shape, no errors, numbers present), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok


@pytest.mark.slow
def test_bench_server_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "server.json"
    done = gieok("bench", "server", "--blocks", "0", "--clients", "1,2", "--duration", "1",
                 "--queries", "200", "--db", str(tmp_path / "work"), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert set(report) == {"blocks", "in_process", "first_search", "http", "mcp", "mcp_stdio", "targets",
                           "embedding_engines"}
    assert report["first_search"]["ready_s"] > 0 and report["first_search"]["first_search_ms"] > 0
    stdio = report["mcp_stdio"]
    assert stdio["errors"] == 0 and stdio["first_search_ms"] > 0 and stdio["search_p50_ms"] > 0
    for name in ("first_search_rest", "first_search_mcp_stdio"):
        assert isinstance(report["targets"][name]["pass"], bool), name
    assert report["targets"]["first_search_rest"]["limit_ms"] == 2 * report["http"]["1"]["search_p50_ms"]
    assert report["blocks"] == 0
    assert set(report["in_process"]) == {"search_p50_ms", "search_p95_ms", "search_per_s"}
    assert set(report["http"]) == {"1", "2"}
    for run in report["http"].values():
        assert set(run) == {"search_p50_ms", "search_p95_ms", "search_per_s", "add_p50_ms", "errors"}
        assert run["errors"] == 0
        assert all(run[name] > 0 for name in ("search_p50_ms", "search_p95_ms", "search_per_s", "add_p50_ms"))
        assert run["search_p95_ms"] >= run["search_p50_ms"]
    assert all(report["in_process"][name] > 0 for name in report["in_process"])
    assert set(report["mcp"]) == {"search_p50_ms", "errors"}
    assert report["mcp"]["errors"] == 0 and report["mcp"]["search_p50_ms"] > 0
    targets = report["targets"]
    assert targets["zero_errors"] == {"errors": 0, "pass": True}
    assert targets["http_p50_1_client"]["http_p50_ms"] == report["http"]["1"]["search_p50_ms"]
    assert isinstance(targets["http_p50_1_client"]["pass"], bool)
    assert targets["throughput_at_max_clients"]["clients"] == 2
    assert isinstance(targets["throughput_at_max_clients"]["pass"], bool)
    # the table says which targets pass, and the server was stopped gracefully
    assert "targets" in done.stdout and "HTTP searches/s at 2 clients" in done.stdout
    assert "first REST search after /readyz" in done.stdout and "gieok mcp (stdio)" in done.stdout
    assert "(graceful)" in done.stdout
    assert (tmp_path / "work" / "server-0.log").is_file()


def test_bench_server_help_has_an_example() -> None:
    done = gieok("bench", "server", "--help")
    assert done.returncode == 0 and "Example:" in done.stdout and "--clients" in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--clients", "0,4"), "--clients"),
    (("--clients", "1,x"), "--clients"),
    (("--duration", "0"), "--duration"),
    (("--blocks", "-1"), "--blocks"),
])
def test_bench_server_refuses_bad_input(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = gieok("bench", "server", *args, "--db", str(work))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], done.stderr
    assert not work.exists()  # refused before anything was created

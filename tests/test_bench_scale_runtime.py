"""`gieok bench scale`'s runtime part on a small load: two real bot processes (each a BotCore on
one SQLite file and one redis-server) answer every message once, in its channel, and the driver's
checks count what it should."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.scale_runtime import measure_shared_runtime

from gieok import Memory


@pytest.mark.slow
def test_two_bot_processes_answer_a_split_load_once_each(tmp_path: Path, redis_url: str) -> None:
    db = str(tmp_path / "scale.db")
    Memory(db).close()
    report = measure_shared_runtime(db, redis_url, processes=2, channels=3, duration=4.0, rate=1.0)
    assert report["processes"] == 2 and report["messages_sent"] == 12
    assert report["messages_lost"] == 0 and report["messages_stored_twice"] == 0
    assert report["duplicate_replies"] == 0 and report["misrouted_replies"] == 0
    assert report["messages_answered"] == 12, report
    assert report["chain_verified"]
    assert sum(p["messages_in"] for p in report["per_process"]) == 12, "every message taken in by one process"
    assert all(p["shared_failures"] == 0 for p in report["per_process"])

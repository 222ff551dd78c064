"""`gieok bench ingest` end to end, small: the Korean dev set's first turns through add_many (one
and every bulk engine), an export and import, queries idle and during an import, 16 clients of
query embeddings, and the messages API of a real `gieok serve`. Behaviour only (the JSON's shape,
every turn stored, no errors, numbers present), never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.datasets import LOCOMO_KO_DEV

from cli_runner import gieok
from gieok import Memory


@pytest.mark.slow  # starts a real `gieok serve` and loads three engines
def test_bench_ingest_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "ingest.json"
    work = tmp_path / "work"
    done = gieok("bench", "ingest", "--data", LOCOMO_KO_DEV, "--turns", "60", "--queries", "8", "--query-gap-ms", "5",
                 "--group-seconds", "0.5", "--db", work, "--json", out)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["turns"] == 60
    assert set(report["add_many_turns_per_s"]) == {"1", "all"}
    rates = [*report["add_many_turns_per_s"].values(), report["api_turns_per_s"], report["import_turns_per_s"],
             report["import_with_queries_turns_per_s"]]
    assert all(isinstance(rate, float) and rate > 0 for rate in rates), rates
    assert set(report["query_embed_ms"]) == {"idle", "during_import"}
    assert report["query_embed_ms"]["idle"] > 0 and report["queries_timed"]["idle"] == 8
    assert report["queries_timed"]["during_import"] >= 1
    assert all(v > 0 for v in report["query_embeds_per_s_16_clients"].values())
    assert report["api_errors"] == 0 and report["bulk_engines"] >= 1
    assert set(report["load_1m"]) >= {"idle_queries", "add_many_1", "add_many_all", "import", "during_import", "api"}
    for name in ("ingest-1.db", "ingest-all.db", "ingest-import.db", "ingest-import-2.db", "ingest-api.db"):
        with Memory(work / name) as memory:
            assert memory.stats().live_blocks == 60, name
    assert "add_many, all cores" in done.stdout and "targets:" in done.stdout


@pytest.mark.parametrize(("content", "said"), [
    (None, "not found"),
    ('{"sample_id": 1', "is not JSON"),
    ('[{"sample_id": "a"}]', "is not LoCoMo JSON"),
    ("[]", "no turns"),
])
def test_bench_ingest_says_what_is_wrong_with_a_data_file(tmp_path: Path, content: str | None, said: str) -> None:
    data = tmp_path / "data.json"
    if content is not None:
        data.write_text(content, encoding="utf-8")
    done = gieok("bench", "ingest", "--data", data, "--db", tmp_path / "work", "--no-api")
    assert done.returncode == 1 and said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
    assert not (tmp_path / "work").exists()


def test_bench_ingest_refuses_bad_options(tmp_path: Path) -> None:
    done = gieok("bench", "ingest", "--data", LOCOMO_KO_DEV, "--turns", "0", "--db", tmp_path / "work")
    assert done.returncode == 1 and "--turns" in done.stderr
    assert not (tmp_path / "work").exists()
    helped = gieok("bench", "ingest", "--help")
    assert helped.returncode == 0 and "Example: gieok bench ingest --data" in helped.stdout

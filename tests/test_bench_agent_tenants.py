"""`python -m benchmarks.agent_tenants` end to end, short: each tenant's first message through the
real app, and the per-tenant memory and CPU it reports (docs/benchmarks.md, "Each agent's tenant")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.agent_tenants import main


def test_each_agent_tenant_is_measured_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "agent-tenants.json"
    main(["--tenants", "3", "--json", str(out)])
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["tenants"] == 3 and set(report) >= {"rss_mb_per_tenant", "rss_mb_added", "cpu_ms_per_tenant",
                                                       "first_message_ms_p50", "embedding_engines"}
    assert report["cpu_ms_per_tenant"] > 0 and report["first_message_ms_p50"] > 0
    assert "resident memory per tenant" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--tenants must be 1–1000"):
        main(["--tenants", "0"])

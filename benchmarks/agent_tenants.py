"""`python -m benchmarks.agent_tenants --tenants 20`: what each agent's tenant costs a server.

A server that records agents' conversations opens a conversation pipeline for every tenant that
writes one (the guard, the gatekeeper, L1–L3). This opens a `ServerState` (the server's tenant
registry, SQLite in a temporary folder, no language model), gives `--tenants` + 1 tenants a write
key each, and sends each tenant's first message through the real app (`POST
/v1/conversations/messages`, one Korean message): the first tenant loads the models, and the others
are measured — the process's resident memory added and its CPU time, per tenant. A table and,
with `--json`, `{"tenants", "rss_mb_per_tenant", "cpu_ms_per_tenant", "first_message_ms_p50"}`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import median, print_and_write, results_table, rss_mb, table_console

__all__ = ["measure_agent_tenants", "main"]


def measure_agent_tenants(tenants: int = 20) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings

    if not 1 <= tenants <= 1000:
        raise SystemExit(f"--tenants must be 1–1000, got {tenants}")
    with tempfile.TemporaryDirectory(prefix="gieok-agent-tenants-") as folder:
        settings = ServerSettings.load(db=str(Path(folder) / "home.db"), server_open_tenants=tenants + 1,
                                       llm_chain=())
        state = ServerState.open(settings)
        keys = [state.keys.create(f"agent{i}", "write", "bench agent tenants")[0] for i in range(tenants + 1)]
        walls: list[float] = []
        with TestClient(create_app(state)) as client:
            state.readiness.done.wait(300)

            def first_message(i: int) -> None:
                body = {"channel": "c1", "messages": [{"id": f"m{i}", "role": "user", "user": "u1", "name": "민지",
                                                      "text": "민지: 우리 고양이 이름은 보리야, 다음 주에 병원 가"}]}
                started = time.perf_counter()
                answer = client.post("/v1/conversations/messages", json=body,
                                     headers={"Authorization": f"Bearer {keys[i]}"})
                walls.append((time.perf_counter() - started) * 1000)
                if not 200 <= answer.status_code < 300:
                    raise RuntimeError(f"tenant {i}: HTTP {answer.status_code}: {answer.text[:300]}")

            first_message(0)  # the models load here
            walls.clear()
            rss, cpu = rss_mb(), time.process_time()
            for i in range(1, tenants + 1):
                first_message(i)
            added_mb, cpu_s = rss_mb() - rss, time.process_time() - cpu
        state.close()
    return {"tenants": tenants, "rss_mb_per_tenant": round(added_mb / tenants, 2),
            "cpu_ms_per_tenant": round(1000 * cpu_s / tenants, 1), "first_message_ms_p50": round(median(walls), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_tenants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=20, help="tenants measured after the first (default 20)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)

    def show(report: dict[str, Any]) -> None:
        table = results_table(f"Each agent's tenant ({report['tenants']} measured)",
                              ["measure", "value"], left=["measure"])
        table.add_row("resident memory per tenant", f"{report['rss_mb_per_tenant']:.1f} MB")
        table.add_row("CPU per tenant (its first message)", f"{report['cpu_ms_per_tenant']:.0f} ms")
        table.add_row("first message p50", f"{report['first_message_ms_p50']:.0f} ms")
        table_console().print(table)

    print_and_write(measure_agent_tenants(args.tenants), show, args.json)


if __name__ == "__main__":
    main()

"""`python -m benchmarks.agent_tenants --tenants 20`: what each agent's tenant costs a server.

A server that records agents' conversations opens a conversation pipeline for every tenant that
writes one (the guard, the gatekeeper, L1–L3). This opens a `ServerState` (the server's tenant
registry, SQLite in a temporary folder, no language model), gives `--tenants` + 2 tenants a write
key each, and sends each tenant's first message through the real app (`POST
/v1/conversations/messages`, one Korean message): two tenants first, unmeasured (the first loads
the models), then `--tenants` more, measured. What each tenant adds is the median of the resident
memory each one's first message added (a process still loads some things once along the way — a
second embedding engine when passages queue, ~60 MB — which the median leaves out and the total
keeps), and the CPU time per tenant. A table and, with `--json`, `{"tenants", "rss_mb_per_tenant",
"rss_mb_added", "cpu_ms_per_tenant", "first_message_ms_p50"}`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks.report import median, print_and_write, results_table, rss_mb, table_console

__all__ = ["measure_agent_tenants", "main"]

WARM_UP = 2  # tenants served before the measured ones: the first loads the models


def measure_agent_tenants(tenants: int = 20) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from gieok.server import ServerState, create_app
    from gieok.server.settings import ServerSettings

    if not 1 <= tenants <= 1000:
        raise SystemExit(f"--tenants must be 1–1000, got {tenants}")
    with tempfile.TemporaryDirectory(prefix="gieok-agent-tenants-") as folder:
        settings = ServerSettings.load(db=str(Path(folder) / "home.db"), server_open_tenants=WARM_UP + tenants,
                                       llm_chain=())
        state = ServerState.open(settings)
        keys = [state.keys.create(f"agent{i}", "write", "bench agent tenants")[0] for i in range(WARM_UP + tenants)]
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

            for warm in range(WARM_UP):
                first_message(warm)
            walls.clear()
            before = rss_mb()
            resident, cpu = [before], time.process_time()
            for i in range(WARM_UP, WARM_UP + tenants):
                first_message(i)
                resident.append(rss_mb())
            cpu_s = time.process_time() - cpu
        state.close()
    added = [after - previous for previous, after in pairwise(resident)]
    return {"tenants": tenants, "rss_mb_per_tenant": round(median(added), 2),
            "rss_mb_added": round(resident[-1] - before, 1), "cpu_ms_per_tenant": round(1000 * cpu_s / tenants, 1),
            "first_message_ms_p50": round(median(walls), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agent_tenants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=20,
                        help=f"tenants measured after the first {WARM_UP} (default 20)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)

    def show(report: dict[str, Any]) -> None:
        table = results_table(f"Each agent's tenant ({report['tenants']} measured)",
                              ["measure", "value"], left=["measure"])
        table.add_row("resident memory per tenant (median)", f"{report['rss_mb_per_tenant']:.1f} MB")
        table.add_row(f"resident memory added by the {report['tenants']}", f"{report['rss_mb_added']:.0f} MB")
        table.add_row("CPU per tenant (its first message)", f"{report['cpu_ms_per_tenant']:.0f} ms")
        table.add_row("first message p50", f"{report['first_message_ms_p50']:.0f} ms")
        table_console().print(table)

    print_and_write(measure_agent_tenants(args.tenants), show, args.json)


if __name__ == "__main__":
    main()

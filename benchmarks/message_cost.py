"""One message, end to end: `POST /v1/conversations/messages` against a real `gieok serve` (the
packaged model), one user message a call, Korean and English in turn, each after its neighbour
(the call before it). Reports the client's wall time and the server's `timings_ms` per stage,
p50/p95 (docs/benchmarks.md, "One message, end to end").

    .venv/bin/python -m benchmarks.message_cost [--calls 80] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import p50_p95
from benchmarks.server import ServeProcess, create_key

TEXTS = ["다음 주 화요일에 부산으로 이사 가요", "I'm moving to Busan next Tuesday, finally",
         "고양이 이름은 보리예요, 세 살이에요", "My cat is called Bori and she is three",
         "요즘 퇴근하고 기타를 배우고 있어요", "These days I'm learning the guitar after work"]


def measure(calls: int, warmup: int = 5) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    with tempfile.TemporaryDirectory(prefix="gieok-message-cost-") as tmp:
        db = Path(tmp) / "chat.db"
        key = create_key(db)
        server = ServeProcess(db, Path(tmp) / "serve.log", env=env)  # returns once /readyz answers 200
        try:
            walls: list[float] = []
            stages: dict[str, list[float]] = {}
            with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
                for number in range(warmup + calls):
                    body = {"channel": "c1", "guild": "g1", "messages": [
                        {"id": f"m-{uuid.uuid4().hex}", "role": "user", "user": f"u{number % 3}", "name": "Mina",
                         "text": f"{TEXTS[number % len(TEXTS)]} ({number})"}]}  # fresh text: no cache has it
                    started = time.perf_counter()
                    response = http.post(f"{server.url}/v1/conversations/messages", json=body)
                    wall = (time.perf_counter() - started) * 1000
                    response.raise_for_status()
                    if number < warmup:
                        continue
                    walls.append(wall)
                    for stage, ms in response.json()["timings_ms"].items():
                        stages.setdefault(stage, []).append(ms)
        finally:
            server.stop()
    return {"calls": calls, "wall_ms": p50_p95(walls),
            "stages_ms": {stage: p50_p95(values) for stage, values in stages.items()},
            "per_call_ms": {"wall": [round(v, 3) for v in walls], **stages}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=80)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = measure(args.calls)
    print(f"{'stage':<20}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'client wall':<20}{result['wall_ms']['p50']:>10.2f}{result['wall_ms']['p95']:>10.2f}")
    for stage, p in result["stages_ms"].items():
        print(f"{stage:<20}{p['p50']:>10.2f}{p['p95']:>10.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

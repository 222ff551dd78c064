"""`gieok bench users`: a user's data over a real `gieok serve` — everything held about one user
with many messages (`GET /v1/users/{user}`, streamed), the list of users, and that user's erasure.

The run: a fresh memory in the work directory holding `--messages` turns of one user spread over
seven conversations, with her names, facts (each with a history) and a summary item, beside a few
hundred turns of two other users (vectors given, so the setup embeds nothing: what is measured is
reading, writing and erasing, not the model). Then `gieok serve` on 127.0.0.1 with an admin key, and:

1. `GET /v1/users/{user}` `--repeat` times, each read to its end: the wall time until the last
   byte (p50 and worst), the bytes, and the server's resident memory sampled every 5 ms from /proc
   while it answers — its rise above what it held just before (the target: under 100 MB for 10,000
   messages, answered in ≤ 2 s);
2. `GET /v1/users` (a page of 100);
3. `DELETE /v1/users/{user}`: the erasure's wall time and its receipt, then the same export again,
   which must hold none of her messages.

Targets (never adjusted): the export of 10,000 messages in ≤ 2 s (p50), its memory rise < 100 MB."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.fill import bench_workdir
from benchmarks.report import median, print_and_write, results_table, table_console
from benchmarks.server import ServeProcess

__all__ = ["measure_users", "print_users"]

TARGET_SECONDS = 2.0
TARGET_MB = 100.0
USER = "u-minji"
T0 = 1_790_000_000.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _sample(pid: int, peak: list[float], done: threading.Event) -> None:
    """The server's resident memory every 5 ms until `done`: its highest in `peak[0]`."""
    while not done.is_set():
        peak[0] = max(peak[0], _rss_mb(pid))
        time.sleep(0.005)


def _fill(db: Path, messages: int) -> None:
    from gieok import Memory
    from gieok.chat.conversation.facts import FactType, Statement
    from gieok.chat.conversation.memory import ConversationMemory
    from gieok.chat.conversation.recent import conversation_of
    from gieok.types import scope_key

    rng = np.random.default_rng(39)
    with Memory(db) as memory:
        dim = memory.embedder.dimension
        others = [{"text": f"다른 사람의 메시지 {i}", "speaker": f"u-other{i % 2}",
                   "scope": {"guild": "g1", "channel": f"c{i % 7}", "user": f"u-other{i % 2}"}, "event_time": T0 + i}
                  for i in range(300)]
        for start in range(0, messages, 2000):
            batch = [{"text": f"민지의 메시지 {i}: 오늘 있었던 일을 조금 길게 적어 본다 " + "가나다" * 10,
                      "speaker": USER, "scope": {"guild": "g1", "channel": f"c{i % 7}", "user": USER},
                      "event_time": T0 + 300 + i,
                      "metadata": {"external_id": f"m{i}", "role": "user", "speaker_name": "민지"}}
                     for i in range(start, min(messages, start + 2000))]
            batch += others if start == 0 else []
            vectors = rng.normal(size=(len(batch), dim)).astype(np.float32)
            memory.add_many(batch, vectors=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        conversation = ConversationMemory(memory)
        for day, city in enumerate(("부산", "서울", "대전")):
            conversation.facts.add(f"<user:{USER}>는 {city}에 산다.", fact_type=FactType.USER, guild="g1", user_id=USER,
                                   statement=Statement(T0 + day * 86_400, author="bench"))
        cafe = conversation_of("g1", "c0")
        conversation.tables.l1_append(scope_key(cafe), "user", "민지의 최근 메시지", USER, "민지", T0 + 10**6, False,
                                      False, None, 50)
        conversation.summaries.update(cafe, {"topic": "민지의 하루", "new_point": "민지가 이사했다"}, users=[USER])


def measure_users(messages: int = 10_000, repeat: int = 5, *, workdir: Path | None = None) -> dict[str, Any]:
    import httpx

    from benchmarks.server import create_key

    work = bench_workdir("users", workdir)
    db = work / "users.db"
    started = time.perf_counter()
    _fill(db, messages)
    fill_seconds = time.perf_counter() - started
    key = create_key(db)
    _promote(db, key)
    headers = {"Authorization": f"Bearer {key}"}
    server = ServeProcess(db, work / "serve.log")
    try:
        pid = server.process.pid
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as client:
            client.get("/v1/users", params={"limit": 1}).raise_for_status()  # the tenant opened, not timed
            runs = []
            for _ in range(repeat):
                before = _rss_mb(pid)
                peak = [before]
                done = threading.Event()
                sampler = threading.Thread(target=_sample, args=(pid, peak, done), daemon=True)
                sampler.start()
                t = time.perf_counter()
                size = 0
                with client.stream("GET", f"/v1/users/{USER}") as response:
                    response.raise_for_status()
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                seconds = time.perf_counter() - t
                done.set()
                sampler.join()
                runs.append({"seconds": seconds, "bytes": size, "rss_before_mb": before, "rss_peak_mb": peak[0],
                             "rss_rise_mb": peak[0] - before})
            body = client.get(f"/v1/users/{USER}").json()
            held = len(body["messages"])
            t = time.perf_counter()
            listed = client.get("/v1/users", params={"limit": 100})
            list_ms = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            receipt = client.delete(f"/v1/users/{USER}").json()
            erase_seconds = time.perf_counter() - t
            after = client.get(f"/v1/users/{USER}").json()
            verified = client.get("/v1/verify").json()["ok"]
    finally:
        server.stop()
    export_p50 = median([r["seconds"] for r in runs])
    rise = max(r["rss_rise_mb"] for r in runs)
    return {
        "messages": messages, "held_in_export": held, "repeat": repeat, "fill_seconds": round(fill_seconds, 2),
        "export_seconds_p50": round(export_p50, 3), "export_seconds_max": round(max(r["seconds"] for r in runs), 3),
        "export_bytes": runs[0]["bytes"], "export_rss_rise_mb_max": round(rise, 1),
        "server_rss_mb_before": round(runs[0]["rss_before_mb"], 1), "runs": runs,
        "list_users_ms": round(list_ms, 2), "users_listed": len(listed.json()["users"]),
        "erase_seconds": round(erase_seconds, 2), "erased": receipt.get("erased"),
        "messages_after_erasure": len(after["messages"]), "verify_ok": verified,
        "targets": {"export_seconds": {"measured": round(export_p50, 3), "limit": TARGET_SECONDS,
                                       "pass": export_p50 <= TARGET_SECONDS},
                    "export_memory_mb": {"measured": round(rise, 1), "limit": TARGET_MB, "pass": rise < TARGET_MB}},
    }


def _promote(db: Path, key: str) -> None:
    """The bench's key becomes an admin's (an access request is an admin's)."""
    from gieok.store.factory import open_store

    store = open_store(str(db))
    try:
        prefix = key.split("_")[1]
        with store.transaction() as conn:  # type: ignore[attr-defined]
            conn.execute("UPDATE api_keys SET role = 'admin' WHERE prefix = ?", (prefix,))
    finally:
        store.close()


def print_users(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or table_console()
    table = results_table(f"a user's data over HTTP — {report['messages']:,} messages of one user",
                          ("measure", "value"), left=("measure",))
    rows = [
        ("GET /v1/users/{user}: time to the last byte, p50 / max",
         f"{report['export_seconds_p50']:.3f} s / {report['export_seconds_max']:.3f} s"),
        ("… bytes / messages in it", f"{report['export_bytes']:,} / {report['held_in_export']:,}"),
        ("… server memory rise while answering (max)", f"{report['export_rss_rise_mb_max']:.1f} MB "
                                                         f"(held {report['server_rss_mb_before']:.0f} MB before)"),
        ("GET /v1/users (100)", f"{report['list_users_ms']:.1f} ms, {report['users_listed']} users"),
        ("DELETE /v1/users/{user}", f"{report['erase_seconds']:.2f} s: {report['erased']}"),
        ("messages held after the erasure / chain verifies",
         f"{report['messages_after_erasure']} / {report['verify_ok']}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    targets = results_table("targets", ("target", "measured", "needed", "result"), left=("target",))
    for name, target in report["targets"].items():
        unit = "s" if "seconds" in name else "MB"
        targets.add_row(name, f"{target['measured']} {unit}", f"{'≤' if unit == 's' else '<'} {target['limit']} {unit}",
                        "pass" if target["pass"] else "MISS")
    console.print(targets)


def run_users_bench(messages: int, repeat: int, json_out: Path | None, workdir: Path | None) -> dict[str, Any]:
    return print_and_write(measure_users(messages, repeat, workdir=workdir), print_users, json_out)

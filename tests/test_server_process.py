"""A real `gieok serve` process on loopback: the event stream over SSE with resume, requests
served while others are in flight, graceful shutdown that loses nothing, several workers, and
the refusals at start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_runner import gieok
from gieok import Memory
from live_server import GIEOK, create_key
from live_server import LiveServer as Server

pytestmark = pytest.mark.slow  # every test starts a real `gieok serve` process


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """One server for the tests that only talk to it (a start costs ~11 s, most of it kiwi's load);
    the first of them watches its warm-up, so it comes first in this file."""
    db = tmp_path_factory.mktemp("served") / "home.db"
    headers = {"Authorization": f"Bearer {create_key(db)}"}
    running = Server(db)
    try:
        yield running, headers
    finally:
        running.stop()


def sse_events(response: httpx.Response, count: int) -> list[dict[str, str]]:
    """The next `count` events of an SSE response (comments skipped)."""
    events: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if current:
                events.append(current)
                current = {}
                if len(events) == count:
                    return events
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(": ")
        current[name] = value
    return events


def test_a_starting_server_answers_at_once_from_its_first_answer_on(server: tuple[Server, dict[str, str]]) -> None:
    """kiwi holds the interpreter lock for seconds while it loads; loaded beside the first requests it
    left /healthz unanswered 5.8 s here. The server loads it before it opens its port, so from the
    first answer on (the fixture's first /healthz) none waits, warming or not."""
    srv, headers = server
    log = srv.log
    assert "the Korean analyser loaded in" in log and "Uvicorn running on" in log, log
    assert log.index("the Korean analyser loaded in") < log.index("Uvicorn running on"), log
    with httpx.Client(base_url=srv.url, timeout=2.0) as client:  # a wait of 2 s raises ReadTimeout
        statuses = [(client.get("/healthz").status_code, client.get("/readyz").status_code, time.sleep(0.05))[:2]
                    for _ in range(20)]
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get("/v1/stats", headers=headers).status_code == 200
    assert all(health == 200 and ready in (200, 503) for health, ready in statuses), statuses


def test_sse_streams_events_and_resumes_with_last_event_id(server: tuple[Server, dict[str, str]]) -> None:
    srv, headers = server
    with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as client:
        with client.stream("GET", "/v1/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            client.post("/v1/memories", json={"text": "민지는 고양이를 키워", "scope": {"channel": "cafe"}})
            [added] = sse_events(stream, 1)
        assert added["event"] == "memory.added"
        assert json.loads(added["data"])["data"]["blocks"][0]["text"] == "민지는 고양이를 키워"
        client.post("/v1/search", json={"query": "민지 고양이"})  # while nobody listens
        with client.stream("GET", "/v1/events", headers={"Last-Event-ID": added["id"]}) as stream:
            [missed] = sse_events(stream, 1)
        assert missed["event"] == "search.answered" and int(missed["id"]) == int(added["id"]) + 1
        with client.stream("GET", f"/v1/events?since={int(added['id']) - 1}") as stream:
            replay = sse_events(stream, 2)
        assert [e["id"] for e in replay] == [added["id"], missed["id"]]
        assert client.get("/v1/events", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_requests_are_served_while_a_long_one_runs(server: tuple[Server, dict[str, str]]) -> None:
    srv, headers = server
    long_done = threading.Event()
    items = [{"text": f"배치 메시지 {i}: 오늘 점심은 김치찌개였다 number {i}"} for i in range(200)]

    def long_request() -> None:
        response = httpx.post(f"{srv.url}/v1/memories:batch", json={"items": items}, headers=headers, timeout=300)
        assert response.status_code == 201
        long_done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    time.sleep(0.3)
    answered_during = []
    for _ in range(5):
        assert httpx.get(f"{srv.url}/v1/health", headers=headers, timeout=30).status_code == 200
        answered_during.append(not long_done.is_set())
    worker.join(timeout=300)
    assert long_done.is_set() and any(answered_during), "health waited for the batch: the loop was blocked"


def test_graceful_shutdown_finishes_in_flight_requests_and_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    headers = {"Authorization": f"Bearer {create_key(db)}"}
    srv = Server(db)
    result: dict[str, object] = {}
    items = [{"text": f"종료 직전 메시지 {i}", "scope": {"channel": "late"}} for i in range(120)]

    def in_flight() -> None:
        response = httpx.post(f"{srv.url}/v1/memories:batch", json={"items": items}, headers=headers, timeout=300)
        result["status"] = response.status_code

    worker = threading.Thread(target=in_flight)
    worker.start()
    time.sleep(2.0)  # the batch is being embedded when the signal comes (120 texts take several seconds)
    code = srv.stop()
    worker.join(timeout=300)
    assert code in (0, -signal.SIGTERM) and result.get("status") == 201
    assert "Application shutdown complete" in srv.log
    with Memory(db) as memory:
        assert len(memory) == 120 and memory.verify().ok
        assert memory.search("종료 직전 메시지", 3, scope={"channel": "late"}).hits


class OpenStream:
    """An SSE stream held open on `srv` in a thread, for a stop to end: an SSE stream never finishes
    on its own, and uvicorn's graceful stop waited its whole 30 s for it."""

    def __init__(self, srv: Server, headers: dict[str, str]) -> None:
        self.events: list[dict[str, str]] = []
        self.thread = threading.Thread(target=self._listen, args=(srv, headers), daemon=True)
        self.thread.start()

    def _listen(self, srv: Server, headers: dict[str, str]) -> None:
        with httpx.stream("GET", f"{srv.url}/v1/events", headers=headers, timeout=httpx.Timeout(60, read=60)) as stream:
            self.events = sse_events(stream, 2)

    def stop_server(self, srv: Server) -> float:
        """Stop `srv` and check the stream's end; the seconds the stop took."""
        started = time.monotonic()
        assert srv.stop() in (0, -signal.SIGTERM)
        stopped_s = time.monotonic() - started
        self.thread.join(timeout=10)
        first, last = self.events
        assert first["event"] == "memory.added" and last["event"] == "stream.closed"
        assert json.loads(last["data"])["reason"] == "stopping"
        return stopped_s


def test_a_stop_ends_the_open_event_streams_at_once(tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    headers = {"Authorization": f"Bearer {create_key(db)}"}
    srv = Server(db)
    try:
        stream = OpenStream(srv, headers)
        time.sleep(1.0)
        added = httpx.post(f"{srv.url}/v1/memories", json={"text": "멈추기 전"}, headers=headers, timeout=60)
        assert added.status_code == 201
        time.sleep(0.5)
        stopped_s = stream.stop_server(srv)
        assert stopped_s < 10, f"the stop took {stopped_s:.1f} s"
    finally:
        srv.stop()


def test_several_workers_share_one_memory(tmp_path: Path) -> None:
    db = tmp_path / "home.db"
    headers = {"Authorization": f"Bearer {create_key(db)}"}
    srv = Server(db, "--workers", "2")
    try:
        with httpx.Client(base_url=srv.url, headers=headers, timeout=60) as client:
            for i in range(6):  # spread over both workers by the kernel
                assert client.post("/v1/memories", json={"text": f"worker message {i} 워커"}).status_code == 201
            counts = {client.get("/v1/stats").json()["blocks"] for _ in range(6)}
            assert counts == {6}
            # A worker killed while the supervisor awaits its health-check answer (stopped first, so
            # the ping is surely pending) is replaced within seconds, not after the 60 s health check.
            workers = _workers(srv)
            assert len(workers) == 2, workers
            victim = workers[0]
            os.kill(victim, signal.SIGSTOP)
            time.sleep(1.5)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            while not [pid for pid in _workers(srv) if pid not in workers]:  # a new worker started
                assert time.monotonic() - killed < 20, srv.log
                time.sleep(0.1)
            assert "died" in srv.log
            assert client.get("/v1/stats").json()["blocks"] == 6  # the other worker serves meanwhile
            stream = OpenStream(srv, headers)  # …and a stop of several workers ends open streams at once
            time.sleep(1.0)
            assert client.post("/v1/memories", json={"text": "멈추기 전"}).status_code == 201
            time.sleep(0.5)
        stopped_s = stream.stop_server(srv)
        assert stopped_s < 10, f"the stop took {stopped_s:.1f} s"
    finally:
        srv.stop()


def _workers(srv: Server) -> list[int]:
    """The pids of `gieok serve --workers N`'s worker processes (not multiprocessing's tracker)."""
    import psutil

    found = []
    for child in psutil.Process(srv.process.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return sorted(found)


def test_no_auth_is_refused_off_loopback_and_bad_options_exit_1(tmp_path: Path) -> None:
    refused = subprocess.run([*GIEOK, "serve", "--db", str(tmp_path / "x.db"), "--host", "0.0.0.0", "--no-auth"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "--no-auth is refused" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2
    bad = gieok("keys", "create", "--tenant", "../etc", "--db", str(tmp_path / "x.db"))
    assert bad.returncode == 1 and "tenant" in bad.stderr


def test_no_auth_on_loopback_serves_the_default_tenant(tmp_path: Path) -> None:
    srv = Server(tmp_path / "open.db", "--no-auth")
    try:
        response = httpx.post(f"{srv.url}/v1/memories", json={"text": "열린 서버"}, timeout=60)
        assert response.status_code == 201
    finally:
        srv.stop()

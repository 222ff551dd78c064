"""A process whose clock runs 30 s ahead or behind (Debian's `faketime`, which `.ci/run` installs):
Redis leases and fencing, the store's leases, the order of events, the event relay and STM expiry
stay correct. Each skewed party is a real process under `faketime`; the others run on the true clock.
docs/scale-out.md ("What depends on clocks") states what is clock-dependent and how much skew it
tolerates; these tests are that table's evidence."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gieok import Memory
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.coordination.connection import RedisConnection
from gieok.coordination.events import SharedEventLog
from gieok.errors import LeaseLostError
from gieok.server.events import EventBus
from gieok.server.relay import RelayPump
from gieok.store.factory import open_store

REPO = Path(__file__).resolve().parent.parent
SKEWS = (30, -30)
LEASE = 0.5  # seconds: short, so a lapse is seen quickly; the skew is 60 times that
CHANNEL = "g1:cafe"


def _faketime() -> str:
    found = shutil.which("faketime")
    if found is None:
        pytest.skip("libfaketime is not installed: apt-get install faketime (.ci/run installs it)")
    return found


def _skewed(skew: int, script: str, *args: str) -> subprocess.Popen[str]:
    """`script` in a Python process whose clock (wall and monotonic) runs `skew` seconds off."""
    return subprocess.Popen([_faketime(), "-f", f"{skew:+d}s", sys.executable, "-c", script, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _finish(process: subprocess.Popen[str], timeout: float = 30.0) -> list[dict[str, Any]]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _check_skew(reported: float, skew: int) -> None:
    """The child's clock really was off by `skew` (so a pass is not a faketime that did nothing)."""
    assert abs(reported - time.time() - skew) < 5, (reported, time.time(), skew)


# -- Redis leases and fencing -----------------------------------------------------------------------
_LEASE_CHILD = """
import asyncio, json, sys, time
from gieok import Memory
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.coordination.connection import RedisConnection

url, namespace, db, key, lease = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])

async def main():
    connection = RedisConnection(url, namespace)
    shared = SharedChannels(connection, lease_seconds=lease)
    print(json.dumps({"clock": time.time()}), flush=True)
    refused = 0
    fence = await shared.try_lease(key)
    while not fence:
        refused += 1
        await asyncio.sleep(0.02)
        fence = await shared.try_lease(key)
    seconds, micros = connection.client.time()
    got = seconds + micros / 1e6
    memory = Memory(db)
    memory.store.conversation.fence_advance(key, fence)  # what a turn written under it checks
    for _ in range(6):  # hold it a while: the other process must not get it meanwhile
        await asyncio.sleep(lease / 4)
        assert not await shared.renew([key])
    memory.close()
    await shared.aclose()
    print(json.dumps({"fence": fence, "got": got, "refused": refused}), flush=True)

asyncio.run(main())
"""


def _redis_time(connection: RedisConnection) -> float:
    seconds, micros = connection.client.time()
    return float(seconds) + micros / 1e6


@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_process_shares_a_channel_lease_one_holder_at_a_time(skew: int, redis_url: str, redis_namespace: str,
                                                                     tmp_path: Path) -> None:
    db = tmp_path / "fence.db"
    memory = Memory(db)
    connection = RedisConnection(redis_url, redis_namespace)
    shared = SharedChannels(connection, lease_seconds=LEASE)

    async def run() -> None:
        first = await shared.try_lease(CHANNEL)
        assert first > 0
        memory.store.conversation.fence_advance(CHANNEL, first)
        renewed_at = [0.0]
        keep = asyncio.Event()

        async def keep_renewing() -> None:
            while not keep.is_set():
                renewed_at[0] = _redis_time(connection)  # the renewal took effect at this Redis time or later
                assert not await shared.renew([CHANNEL])
                await asyncio.sleep(0.1)

        renewing = asyncio.create_task(keep_renewing())
        child = _skewed(skew, _LEASE_CHILD, redis_url, redis_namespace, str(db), CHANNEL, str(LEASE))
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        _check_skew(json.loads(line)["clock"], skew)
        await asyncio.sleep(0.8)  # the child asks for the lease every 20 ms while this process keeps it
        keep.set()
        await renewing
        # Renewals stop: the lease lapses LEASE after the last one, on Redis' clock, and only then the
        # child gets it. While it holds it, this process is refused.
        while await shared.lease_holder(CHANNEL) in (connection.owner, None):
            await asyncio.sleep(0.02)
        refused_here = [await shared.try_lease(CHANNEL) for _ in range(3)]
        result = (await asyncio.to_thread(_finish, child))[-1]
        assert refused_here == [0, 0, 0]
        assert result["refused"] > 10  # it kept asking while the lease was held
        assert result["got"] >= renewed_at[0] + LEASE - 0.005, (result, renewed_at)  # never before it lapsed
        assert result["got"] <= renewed_at[0] + LEASE + 1.5  # and soon after
        assert result["fence"] > first
        # A late write under the first holder's token is refused; the next holder's token is newer still.
        with pytest.raises(LeaseLostError):
            memory.store.conversation.fence_advance(CHANNEL, first)
        again = 0
        while not again:  # the child exited without releasing: its lease lapses on Redis' clock
            again = await shared.try_lease(CHANNEL)
            await asyncio.sleep(0.05)
        assert again > result["fence"]
        memory.store.conversation.fence_advance(CHANNEL, again)
        await shared.aclose()

    try:
        asyncio.run(run())
    finally:
        memory.close()


# -- the store's leases (a tenant's duties, the extraction): PostgreSQL's clock ---------------------
_STORE_LEASE_CHILD = """
import json, sys, time
from gieok.store.factory import open_store
store = open_store(sys.argv[1])
took = {name: store.leases.acquire(name, "skewed", 5.0) for name in sys.argv[2:]}  # as duties.py asks
print(json.dumps({"clock": time.time(), "took": took}))
store.close()
"""


@pytest.mark.parametrize("skew", SKEWS)
def test_a_skewed_process_neither_takes_a_live_store_lease_nor_keeps_a_lapsed_one(skew: int, pg_server: Any) -> None:
    location = pg_server.new_database()
    store = open_store(location)
    try:
        assert store.leases.acquire("duties:live", "steady", 10.0)
        assert store.leases.acquire("duties:lapsed", "steady", 0.2)
        time.sleep(0.3)
        found = _finish(_skewed(skew, _STORE_LEASE_CHILD, location, "duties:live", "duties:lapsed"))[-1]
        _check_skew(found["clock"], skew)
        # Ahead by 30 s, its own clock said the live lease (10 s left) had run out; behind by 30 s, that the
        # lapsed one had 30 s to go. On the database's clock neither is so.
        assert found["took"] == {"duties:live": False, "duties:lapsed": True}
        assert not store.leases.acquire("duties:lapsed", "steady", 10.0)
    finally:
        store.close()


# -- events, the relay and STM entries written by skewed processes ---------------------------------
_WRITER = """
import json, sys, time
from gieok import Memory
from gieok.coordination.connection import RedisConnection
from gieok.coordination.events import SharedEventLog
from gieok.types import Scope

url, namespace, db, label = sys.argv[1:5]
log = SharedEventLog(RedisConnection(url, namespace))
for n in (1, 2):
    log.append("default", "test.said", time.time(), {"by": label, "n": n})
memory = Memory(db)
scope = Scope.of({"guild": "g1", "channel": "cafe"})
memory.stm.add(scope, f"{label}: 민지는 다음 주에 부산으로 이사 가", importance=0.9, ttl_seconds=60)
memory.stm.add(scope, f"{label}: ok, see you", importance=0.2, ttl_seconds=60)
memory.store.event_relay.append("default", "test.relayed", time.time(), {"by": label})
print(json.dumps({"clock": time.time()}))
memory.close()
"""


def test_skewed_writers_events_relay_rows_and_stm_entries(redis_url: str, redis_namespace: str, tmp_path: Path) -> None:
    db = tmp_path / "skew.db"
    memory = Memory(db)
    try:
        log = SharedEventLog(RedisConnection(redis_url, redis_namespace))
        pump = RelayPump(memory.store.event_relay, EventBus())
        pump.begin()
        log.append("default", "test.said", time.time(), {"by": "steady", "n": 1})
        for skew in SKEWS:
            label = f"{skew:+d}s"
            found = _finish(_skewed(skew, _WRITER, redis_url, redis_namespace, str(db), label))[-1]
            _check_skew(found["clock"], skew)
            log.append("default", "test.said", time.time(), {"by": "steady", "n": 2 if skew > 0 else 3})
        started = time.time()

        # Events: in the order they were appended, by sequence number, whatever their writers' clocks.
        events = log.after("default", 0)
        assert [(e.data["by"], e.data["n"]) for e in events] == [
            ("steady", 1), ("+30s", 1), ("+30s", 2), ("steady", 2), ("-30s", 1), ("-30s", 2), ("steady", 3)]
        assert [e.seq for e in events] == sorted(e.seq for e in events) and len({e.seq for e in events}) == 7
        times = [e.time for e in events]
        assert times != sorted(times)  # the writers' clocks disagree: the order does not come from them

        # The relay: each skewed writer's row reaches the stream once, also after the look-back has passed
        # (a row stamped 30 s ahead was taken up again by a look-back by time), and in the order written.
        published = [pump.step(now=started + offset) for offset in (0.0, 11.0, 40.0)]
        assert published == [2, 0, 0]
        assert [e.data["by"] for e in pump.bus.recent("default")] == ["+30s", "-30s"]

        # STM: an entry lives its TTL on its writer's clock, so on this one it ends `skew` later or earlier
        # — and is applied exactly once (promoted if important, else dropped) whoever expires it.
        entries = memory.stm.entries(limit=10)
        assert len(entries) == 4
        for entry in entries:
            skew = 30 if entry["text"].startswith("+30s") else -30
            assert entry["expires_at"] - entry["created_at"] == pytest.approx(60.0)
            assert entry["expires_at"] - started == pytest.approx(60.0 + skew, abs=5.0)
        memory.stm.clock = lambda: time.time() + 45.0  # past the -30 s writer's entries, before the others
        assert memory.stm.expire() == {"promoted": 1, "dropped": 1}
        memory.stm.clock = lambda: time.time() + 100.0
        assert memory.stm.expire() == {"promoted": 1, "dropped": 1}
        assert memory.stm.expire() == {"promoted": 0, "dropped": 0}
        promoted = [b for b in memory.list_blocks(limit=50) if "promoted_from" in (b.metadata or {})]
        assert sorted(b.text.split(":")[0] for b in promoted) == ["+30s", "-30s"]
    finally:
        memory.close()

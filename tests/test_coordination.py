"""What several processes share in Redis, against a real redis-server: claims, inboxes, leases,
wake-ups, active channels, rate-limit windows and the per-tenant event streams. Two
`RedisConnection`s stand for two processes (each has its own owner identity)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gieok.chat.runtime.shared_channels import WAKE_ACTIVE, WAKE_INBOX, SharedChannels
from gieok.coordination import RedisConnection, SharedEventLog
from gieok.errors import ConfigError, CoordinationUnavailableError, InvalidInputError


@pytest.fixture
def pair(redis_url: str, redis_namespace: str) -> Iterator[tuple[SharedChannels, SharedChannels]]:
    first, second = RedisConnection(redis_url, redis_namespace), RedisConnection(redis_url, redis_namespace)
    try:
        yield (SharedChannels(first, lease_seconds=1.0), SharedChannels(second, lease_seconds=1.0))
    finally:
        first.close()
        second.close()


def run(coro):
    return asyncio.run(coro)


def test_two_processes_have_different_owner_identities(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair
    assert a.owner != b.owner


def test_a_message_is_claimed_once_per_channel(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair

    async def scenario() -> None:
        order = await a.claim_message("g1/cafe", "m1")
        assert order > 0
        assert await b.claim_message("g1/cafe", "m1") == -1, "the replica that comes second waits: not queued yet"
        assert await a.claim_message("g1/cafe", "m1") == order, "its claimant again: a retry whose answer was lost"
        await a.enqueue("g1/cafe", {"order": order}, "m1")
        assert await b.claim_message("g1/cafe", "m1") == 0, "queued by its claimant: nothing for the other"
        assert await a.claim_message("g1/cafe", "m1") == order, "…and its claimant's retry still gets its place"
        assert await b.claim_message("g1/lounge", "m1") > 0, "ids are per channel"
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_a_message_claimed_later_waits_for_one_claimed_earlier_that_is_still_being_stored(
        redis_url: str, redis_namespace: str) -> None:
    """Found by `gieok bench chaos`: a process claimed c03-m009, then waited for PostgreSQL (a
    restart) to store it; the other process claimed, queued and answered m010 and m011 first."""
    first, second = RedisConnection(redis_url, redis_namespace), RedisConnection(redis_url, redis_namespace)
    a, b = SharedChannels(first, lease_seconds=5.0, hold_seconds=0.6), SharedChannels(second, lease_seconds=5.0)

    def payload(n: int, order: int) -> dict[str, Any]:
        return {"n": n, "order": order}

    async def scenario() -> None:
        m9 = await a.claim_message("k", "m9")  # a is slow to store it
        m10, m11 = await b.claim_message("k", "m10"), await b.claim_message("k", "m11")
        assert 0 < m9 < m10 < m11 and await a.claim_message("k", "m9") == m9
        await b.enqueue("k", payload(10, m10), "m10")
        await b.enqueue("k", payload(11, m11), "m11")
        assert await b.try_lease("k")
        assert await b.drain("k") == [], "m10 and m11 wait for m9"
        assert await b.waiting() == {"k"}, "and the channel stays on the sweep's list"
        await a.enqueue("k", payload(9, m9), "m9")
        drained = await b.drain("k")
        assert drained is not None and [p["n"] for p in drained] == [9, 10, 11], "in the order claimed"
        # a claim whose process died before it queued the message holds the others back no longer
        # than hold_seconds
        m12 = await a.claim_message("k", "m12")
        m13 = await b.claim_message("k", "m13")
        await b.enqueue("k", payload(13, m13), "m13")
        assert await b.drain("k") == []
        await asyncio.sleep(0.8)
        late = await b.drain("k")
        assert late is not None and [p["n"] for p in late] == [13] and m12 < m13
        # …and no longer than its process is present: one whose presence (renewed with its leases
        # every third of a lease) lapsed holds nothing back, however long the hold
        m14 = await c.claim_message("k", "m14")
        m15 = await b.claim_message("k", "m15")
        await b.enqueue("k", payload(15, m15), "m15")
        assert await b.drain("k") == [] and m14 < m15
        await asyncio.sleep(0.5)  # c's lease time (0.3 s) without a renewal: c is gone
        assert [p["n"] for p in await b.drain("k") or []] == [15]
        await a.aclose()
        await b.aclose()
        await c.aclose()

    third = RedisConnection(redis_url, redis_namespace)
    c = SharedChannels(third, lease_seconds=0.3)
    try:
        run(scenario())
    finally:
        first.close()
        second.close()
        third.close()


def test_the_claim_of_a_process_that_died_before_queueing_is_taken_over_in_its_place(
        redis_url: str, redis_namespace: str) -> None:
    """Found by `gieok bench chaos`: a bot killed between its claim of a message and its `enqueue`
    lost the message — the other replica had dropped it on losing the claim."""
    doomed_connection, other_connection = RedisConnection(redis_url, redis_namespace), RedisConnection(
        redis_url, redis_namespace)
    doomed, other = SharedChannels(doomed_connection, lease_seconds=0.3), SharedChannels(other_connection)

    async def scenario() -> None:
        m1 = await doomed.claim_message("k", "m1")
        m2 = await other.claim_message("k", "m2")
        assert await other.claim_message("k", "m1") == -1, "its claimant is alive: not yet"
        await other.enqueue("k", {"n": 2, "order": m2}, "m2")
        await asyncio.sleep(0.5)  # a lease without a renewal: the claimant is gone
        assert await other.claim_message("k", "m1") == m1, "taken over, in the claimant's place"
        assert await doomed.claim_message("k", "m1") == -1, "the claim is the other's now"
        assert not await doomed.enqueue("k", {"n": 1, "order": m1}, "m1"), "a claimant stopped, not dead, "\
            "that wakes up after the takeover queues nothing: the message is not answered twice"
        await other.enqueue("k", {"n": 1, "order": m1}, "m1")
        assert await other.try_lease("k")
        drained = await other.drain("k")
        assert drained is not None and [p["n"] for p in drained] == [1, 2], "in the order first claimed"
        assert await doomed.claim_message("k", "m1") == 0, "queued: settled for everyone else"
        await doomed.aclose()
        await other.aclose()

    try:
        run(scenario())
    finally:
        doomed_connection.close()
        other_connection.close()


def test_inbox_keeps_order_across_processes_and_drains_once(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair

    async def scenario() -> None:
        await a.enqueue("k", {"n": 1, "text": "첫 번째"})
        await b.enqueue("k", {"n": 2, "text": "second"})
        await a.enqueue("k", {"n": 3})
        assert await b.queued("k") == 3
        assert await a.waiting() == {"k"}
        assert await b.drain("k") is None, "only the lease holder drains"
        assert await b.try_lease("k")
        assert await a.drain("k") is None
        drained = await b.drain("k")
        assert drained is not None and [item["n"] for item in drained] == [1, 2, 3]
        assert drained[0]["text"] == "첫 번째"
        assert await b.drain("k") == [], "drained items are gone"
        assert await a.waiting() == {"k"}, "drained but no turn took them yet: in flight, still waiting"
        await b.done("k", drained)
        assert await a.waiting() == set(), "an empty inbox with nothing in flight is not waiting"
        await a.requeue_front("k", drained[1:])
        await a.enqueue("k", {"n": 4})
        again = await b.drain("k")
        assert again is not None and [item["n"] for item in again] == [2, 3, 4], "handed-back messages go first"
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_what_a_dead_holder_drained_goes_to_the_next_holder(pair: tuple[SharedChannels, SharedChannels],
                                                              redis_namespace: str) -> None:
    a, b = pair

    async def scenario() -> None:
        for n in (1, 2, 3):
            await a.enqueue("k", {"n": n})
        first = await b.try_lease("k")
        drained = await b.drain("k")
        assert drained is not None and len(drained) == 3
        await b.done("k", drained[:1])  # a turn took the first; then b dies
        b.connection.client.delete(f"{redis_namespace}:lease:k")  # its lease lapses
        await a.enqueue("k", {"n": 4})
        assert await a.waiting() == {"k"}, "the sweep finds the channel"
        second = await a.try_lease("k")
        assert second > first > 0, "each take counts the fencing token up"
        again = await a.drain("k")
        assert again is not None and [item["n"] for item in again] == [2, 3, 4], "in flight first, in order"
        await a.done("k", again)
        await a.release("k")
        assert await a.waiting() == set()
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_a_lease_is_exclusive_renewable_and_released_only_by_its_holder(
        pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair

    async def scenario() -> None:
        assert await a.try_lease("k")
        assert await a.try_lease("k"), "the holder may take it again (extends it)"
        assert not await b.try_lease("k")
        await b.release("k")  # not b's: nothing happens
        assert await a.lease_holder("k") == a.owner
        assert await a.renew(["k"]) == set()
        assert await b.renew(["k"]) == {"k"}, "b does not hold it"
        await a.release("k")
        assert await a.lease_holder("k") is None
        assert await b.try_lease("k")
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_a_lease_that_is_not_renewed_expires(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair  # leases of 1 s

    async def scenario() -> None:
        assert await a.try_lease("k")
        await asyncio.sleep(0.6)
        assert await a.renew(["k"]) == set()
        await asyncio.sleep(0.6)
        assert not await b.try_lease("k"), "renewed 0.6 s ago: still a's"
        await asyncio.sleep(1.1)
        assert await b.try_lease("k"), "a stopped renewing (its process died): b takes over"
        assert await a.renew(["k"]) == {"k"}, "a learns it lost the channel"
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_wake_ups_reach_every_listener(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair

    async def scenario() -> None:
        got: list[tuple[str, str]] = []
        ready = asyncio.Event()
        listener = asyncio.create_task(b.listen(lambda kind, key: got.append((kind, key)), ready))
        await asyncio.wait_for(ready.wait(), 5)
        await a.notify(WAKE_INBOX, "g1/cafe")
        a.set_active("g1/lounge", True)
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        assert got == [(WAKE_INBOX, "g1/cafe"), (WAKE_ACTIVE, "g1/lounge")]
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_active_channels_are_seeded_once_from_the_store_then_shared(
        pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair
    assert a.seed_active(["g1/cafe"]) == {"g1/cafe"}
    assert b.seed_active(["g9/stale"]) == {"g1/cafe"}, "the second process reads what is shared"
    b.set_active("g1/lounge", True)
    a.set_active("g1/cafe", False)

    async def scenario() -> None:
        assert await a.active_keys() == {"g1/lounge"}
        await a.aclose()

    run(scenario())


def test_rate_limit_windows_are_taken_by_one_process(pair: tuple[SharedChannels, SharedChannels]) -> None:
    a, b = pair

    async def scenario() -> None:
        assert await a.reserve_reply("g1/cafe", 5.0, 0.3)
        assert not await b.reserve_reply("g1/cafe", 5.0, 0.3), "the channel's window is taken"
        assert not await b.reserve_reply("g1/lounge", 5.0, 0.3), "the global window is taken too"
        await asyncio.sleep(0.4)
        assert await b.reserve_reply("g1/lounge", 5.0, 0.3), "the global window passed; lounge is free"
        assert not await a.reserve_reply("g1/cafe", 5.0, 0.0), "cafe's own window still runs"
        await asyncio.sleep(0.4)  # past the global window b took
        await b.note_reply("g1/dm", 0.0, 0.0)  # no windows configured: nothing to mark
        assert await a.reserve_reply("g1/dm", 0.0, 0.0)
        assert await b.reserve_reply("g1/dm", 0.0, 0.0), "without windows every reply is allowed"
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_event_streams_number_each_tenant_on_its_own_and_cap_their_length(redis_url: str,
                                                                          redis_namespace: str) -> None:
    one, two = RedisConnection(redis_url, redis_namespace), RedisConnection(redis_url, redis_namespace)
    try:
        log_a, log_b = SharedEventLog(one, buffer=100), SharedEventLog(two, buffer=100)
        assert log_a.last_seq("acme") == 0 and log_a.oldest_seq("acme") is None
        seqs = [(log_a if i % 2 else log_b).append("acme", "memory.added", 1.0 + i, {"i": i, "말": "기억"})
                for i in range(5)]
        assert seqs == [1, 2, 3, 4, 5], "two processes append to one sequence"
        assert log_b.append("globex", "search.answered", 9.0, {}) == 1, "each tenant counts from 1"
        events = log_b.after("acme", 2)
        assert [e.seq for e in events] == [3, 4, 5]
        assert events[0].data == {"i": 2, "말": "기억"} and events[0].type == "memory.added"
        assert [e.seq for e in log_a.latest("acme", 2)] == [5, 4]
        for i in range(400):
            log_a.append("acme", "memory.added", 10.0 + i, {"i": i})
        assert log_a.last_seq("acme") == 405
        oldest = log_a.oldest_seq("acme")
        assert oldest is not None and 1 < oldest <= 405 - 100 + 1, "trimmed to about the buffer, never below it"
        assert [e.seq for e in log_a.after("acme", 0)][-1] == 405

        async def blocking_read() -> None:
            client = one.async_client(blocking_seconds=2)
            waiting = asyncio.create_task(log_a.read_after(client, "acme", 405, block_ms=2000))
            await asyncio.sleep(0.2)
            log_b.append("acme", "fact.added", 11.0, {"fact": "보리"})
            got = await waiting
            assert [(e.seq, e.type) for e in got] == [(406, "fact.added")]
            await client.aclose()

        run(blocking_read())
    finally:
        one.close()
        two.close()


def test_unreachable_redis_and_bad_urls_are_clear_errors() -> None:
    with pytest.raises(CoordinationUnavailableError, match=r"cannot reach Redis at redis://:\*\*\*@127.0.0.1:9/0"):
        RedisConnection("redis://:secret@127.0.0.1:9/0", timeout_seconds=0.5)
    with pytest.raises(InvalidInputError, match="redis://"):
        RedisConnection("http://127.0.0.1:6379")
    with pytest.raises(InvalidInputError, match="namespace"):
        RedisConnection("redis://127.0.0.1:9/0", "has space")


def test_settings_check_the_redis_url() -> None:
    from gieok.config import Settings

    assert Settings(redis="redis://cache:6379/1").redis == "redis://cache:6379/1"
    with pytest.raises(ConfigError, match="redis"):
        Settings(redis="cache:6379")


def test_clients_reconnect_after_a_redis_restart_and_leases_survive_it(tmp_path: Any) -> None:
    """A Redis restarted on its port (append-only file, as `gieok bench chaos` runs it): while it
    is down every call is one clear CoordinationUnavailableError; after, the same clients work
    again without being made anew, and the lease, its fencing token and the inbox are still there."""
    from benchmarks.redis_server import RedisServer, redis_server_binary

    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(persistent=True)
    connection = RedisConnection(server.url, "restart")
    shared = SharedChannels(connection, lease_seconds=30.0)

    async def scenario() -> None:
        token = await shared.try_lease("k")
        await shared.enqueue("k", {"n": 1})
        server.stop()
        with pytest.raises(CoordinationUnavailableError):
            await shared.queued("k")
        server.start()
        assert await shared.queued("k") == 1, "the asyncio client reconnected; the inbox survived"
        assert await shared.renew(["k"]) == set(), "the lease survived: still ours"
        assert await shared.try_lease("k") > token, "the fencing counter survived"
        assert connection.client.ping()
        await shared.aclose()

    try:
        run(scenario())
    finally:
        connection.close()
        server.close()

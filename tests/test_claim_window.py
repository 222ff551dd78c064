"""The claim-to-queue window, closed under a real fault (issue 43): a bot process that claims a
channel message in Redis and is killed before it queues it loses nothing — a replica that lost the
claim watches it, takes it over in its place once the dead claimant's presence lapses, and the
messages claimed after it wait for it, so every message is answered once and in order.

The fault is a real process death: for each doomed message a subprocess runs the bot's claim
(`SharedChannels.claim_message`, the call `BotCore.submit` makes) and ends with `os._exit(137)` the
moment it returns, as a SIGKILL between claim and enqueue would. The survivors are two BotCores on
one SQLite file and the suite's real redis-server, with real time and short debounces."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

from gieok import Memory
from gieok.chat.agent.pipeline import ConversationPipeline
from gieok.chat.conversation.recent import conversation_key
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection
from runtime_helpers import ChatModel, RecordingOutbox, tally_tags, until

LEASE_S = 1.0  # a process's presence lapses this long after its last claim or renewal
WATCH_S = 0.5  # how often a replica that lost a claim asks again
CHANNELS = 4
ROUNDS = 5  # per channel: a message whose claimant is killed, then one answered normally
FAST = {"debounce_seconds": 0.1, "debounce_finished_seconds": 0.05, "debounce_max_seconds": 2.0,
        "rate_limit_channel_seconds": 0.0, "rate_limit_global_seconds": 0.0, "redis_lease_seconds": LEASE_S}
TAG = re.compile(r"\[c\d-m\d\d\]")

# Doomed bots: for each message it is sent (a JSON line: channel key, message id), this process
# forks a bot process of its own (its own pid, Redis connection and identity) that claims the
# message, says so, and dies before it can queue it; then it says how the bot ended. (Forked, not
# started afresh: the runtime's import would cost a third of a second of CPU per kill.)
CLAIM_AND_DIE = """
import asyncio, json, os, sys, time
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.coordination import RedisConnection
url, namespace, lease = sys.argv[1:4]
sys.stdout.write("ready\\n")
sys.stdout.flush()
for line in sys.stdin:
    channel, message_id = json.loads(line)
    pid = os.fork()
    if pid == 0:
        shared = SharedChannels(RedisConnection(url, namespace), lease_seconds=float(lease))
        order = asyncio.run(shared.claim_message(channel, message_id))
        os.write(1, (json.dumps({"order": order, "claimed": time.time(), "pid": os.getpid()}) + "\\n").encode())
        os._exit(137)
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\\n")
    sys.stdout.flush()
"""


class DoomedBots:
    """The launcher of doomed bot processes (CLAIM_AND_DIE), one per channel."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, redis_url: str, namespace: str) -> DoomedBots:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLAIM_AND_DIE, redis_url, namespace, str(LEASE_S),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        assert await process.stdout.readline() == b"ready\n"
        return cls(process)

    async def claim_and_die(self, channel_key: str, message_id: str) -> tuple[int, float]:
        """The dead bot's place for the message in the channel's order, and when it claimed it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps([channel_key, message_id]) + "\n").encode())
        await self.process.stdin.drain()
        said = json.loads(await self.process.stdout.readline())
        ended = json.loads(await self.process.stdout.readline())
        assert ended["exit"] == 137 and said["pid"] != self.process.pid, "a bot of its own died after its claim"
        return int(said["order"]), float(said["claimed"])

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


def _survivor(location: str, redis_url: str, namespace: str) -> tuple[BotCore, RecordingOutbox, Memory,
                                                                       RedisConnection]:
    memory = Memory(settings=ChatSettings(db=location, redis=redis_url, redis_namespace=namespace))
    settings = memory.settings.with_overrides(**FAST)
    model, outbox = ChatModel(), RecordingOutbox()
    connection = RedisConnection(redis_url, namespace)
    pipeline = ConversationPipeline(memory, settings=settings, llm=model, recover=False)
    core = BotCore(pipeline, model, outbox=outbox, settings=settings, bot_user_id="999",
                   shared=SharedChannels(connection, lease_seconds=LEASE_S, watch_seconds=WATCH_S))
    return core, outbox, memory, connection


def test_a_bot_killed_between_claim_and_enqueue_loses_no_message(tmp_path: Path, redis_url: str,
                                                                  redis_namespace: str) -> None:
    location = str(tmp_path / "claim-window.db")
    survivors = [_survivor(location, redis_url, redis_namespace) for _ in range(2)]
    cores = [s[0] for s in survivors]
    sent: dict[str, list[str]] = {}  # channel → tags in the order the channel saw them
    killed: dict[str, tuple[str, float]] = {}  # doomed id → (seen key, when its claimant claimed it, then died)
    queued_at: dict[str, float] = {}
    watched: list[bool] = []  # per doomed message: its claimant still present when the survivors got it

    def message(ref: ChannelRef, c: int, n: int) -> InboundMessage:
        tag = f"[c{c}-m{n:02d}]"
        text = f"누리야 {tag} 지금 몇 시야?" if n % 2 else f"누리야 {tag} what's the weather like?"
        return InboundMessage(ref, f"u{c}{n}", text, display_name=f"user{c}", message_id=f"c{c}-m{n:02d}",
                              timestamp=time.time())

    async def channel(c: int) -> None:
        doomed = await DoomedBots.start(redis_url, redis_namespace)
        try:
            await deliver(c, doomed)
        finally:
            await doomed.close()

    async def deliver(c: int, doomed: DoomedBots) -> None:
        ref = ChannelRef(f"room{c}", "g1")
        key = conversation_key(ref.guild, ref.channel)
        tags = sent.setdefault(ref.channel, [])
        for n in range(2 * ROUNDS):
            inbound = message(ref, c, n)
            assert inbound.message_id is not None
            tags.extend(TAG.findall(inbound.content))
            if n % 2 == 0:  # this one's claimant is killed before it queues it
                order, died = await doomed.claim_and_die(key, inbound.message_id)
                assert order > 0
                killed[inbound.message_id] = (survivors[0][3].key("seen", key, inbound.message_id), died)
            taken = [await core.submit(inbound) for core in cores]  # the gateway hands it to every replica
            if n % 2 == 0:  # both watch it; or, its claimant's presence lapsed already, one takes it over at once
                assert sum(t is not None for t in taken) <= 1, "a doomed message is taken over once"
                watched.append(all(t is None for t in taken))
            else:
                assert sum(t is not None for t in taken) == 1, "a live message is taken in once"

    async def watch_queueing() -> None:
        """When each doomed message got into its channel's inbox (its seen value marked queued)."""
        client = survivors[0][3].client
        while len(queued_at) < CHANNELS * ROUNDS:
            for message_id, (seen, _) in list(killed.items()):
                if message_id not in queued_at and str(client.get(seen) or "").endswith("|q"):
                    queued_at[message_id] = time.time()
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        for core in cores:  # as the adapter does when it connects
            await core.start()
        watcher = asyncio.create_task(watch_queueing())
        try:
            await asyncio.gather(*(channel(c) for c in range(CHANNELS)))
            await asyncio.wait_for(watcher, 15)
            expected = CHANNELS * 2 * ROUNDS

            def answered() -> int:
                return sum(len(TAG.findall(s.text)) for _, outbox, _, _ in survivors for s in outbox.sent)

            await until(lambda: answered() >= expected and all(core.idle() for core in cores), 15)
            await asyncio.sleep(0.5)  # a second answer, had there been one, would be out by now
        finally:
            watcher.cancel()
            for core in cores:
                await core.close()

    asyncio.run(scenario())
    try:
        replies = [s for _, outbox, _, _ in survivors for s in outbox.sent]
        lost, twice = tally_tags(replies, sent, TAG)
        messages = sum(len(tags) for tags in sent.values())
        assert not lost and not twice, f"lost {lost}, answered twice {twice}"
        for room, tags in sent.items():  # one process answers a channel at a time: its replies are in order
            said = [tag for reply in replies if reply.ref.channel == room for tag in TAG.findall(reply.text)]
            assert said == tags, f"{room}: answered out of order or misrouted: {said}"
        assert len(killed) == len(queued_at) == CHANNELS * ROUNDS >= 20, "every doomed message queued by a survivor"
        assert sum(core.health.claims_taken_over for core in cores) == sum(watched) > 0, "watched, then taken over"
        takeover = [queued_at[m] - died for m, (_, died) in killed.items()]
        bound = LEASE_S + WATCH_S
        print(f"\nclaim window: {len(killed)} claimants killed between claim and enqueue, {len(lost)} messages lost, "
              f"{messages} answered once in order ({sum(watched)} taken over by a watching replica, the others at "
              f"first sight); takeover (claim and death → queued by a survivor) "
              f"max {max(takeover):.2f} s, mean {sum(takeover) / len(takeover):.2f} s "
              f"(presence {LEASE_S} s + watch {WATCH_S} s = {bound} s)")
        assert max(takeover) <= bound + 2.0, f"takeover took {max(takeover):.2f} s (presence + watch: {bound} s)"
    finally:
        for _, _, memory, connection in survivors:
            connection.close()
            memory.close()

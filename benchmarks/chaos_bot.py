"""One bot process of `gieok bench chaos`: a BotCore on the shared database and Redis, answering
through the loopback provider, that may be killed at any moment — so it says everything as it
happens, one JSON line on stdout per event, flushed at once (a report at the end, as
`bench.scale_worker` gives, would die with the process):

    {"ev": "ready"}
    {"ev": "accepted" | "duplicate", "id": <message id>, "t": <unix time>}
    {"ev": "refused", "id": …, "error": "…", "t": …}        the message could not be taken in
    {"ev": "send" | "edit", "mid": <reply id>, "channel": …, "text": …, "t": …}
    {"ev": "claimed", "channel": …, "ids": [message ids], "pid": …, "t": …}   a turn took them
    {"ev": "turn", "channel": …, "messages": n, "responded": bool, "t": …}
    {"ev": "died_in_claim", "id": …, "order": n, "pid": …, "t": …}   then os._exit(137)

A line {"history": [messages]} (sent by the harness each time the process says it is ready: what
Discord's channel history would show, the last 100 messages of each channel) is read back as
`gieok bot` does after a connect (`BotCore.catch_up`), then {"ev": "caught_up", "ids": [...]} says
which of them this process took in — messages nobody had (every receiver died before queueing
them, or none was connected when they were said).

A line {"control": "die_in_claim"} on stdin (the `kill_bot_in_claim` fault) arms the process: the
next time it wins the Redis claim of a message (`SharedChannels.claim_message`) it dies right
there, before it stores or queues the message — the window a replica's takeover must close.

Messages come as JSON lines on stdin, as a Discord gateway delivers them to every replica of a
shard: each message goes to both processes, and the runtime's claims take it in once. Messages of
one channel are submitted in arrival order, channels in parallel. At the end of stdin the core
shuts down gracefully. Logs go to stderr. Run by `bench.chaos`, never by hand:

    python -m benchmarks.chaos_bot --db D --redis R --namespace N --llm-url U --lease-seconds S
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.bot_process import bot_settings, shared_bot
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage

__all__ = ["main", "READY"]

READY = "ready"
DEBOUNCE_S = 1.0  # a chat of short questions: the recovery after a fault is timed by the next answer


def say(event: str, **fields: Any) -> None:
    """One event, on its own line, out now (the process may be killed right after)."""
    sys.stdout.write(json.dumps({"ev": event, **fields, "t": time.time()}, ensure_ascii=False) + "\n")
    sys.stdout.flush()


class StreamingOutbox:
    """Every message the bot sends or edits, said the moment it happens."""

    def __init__(self) -> None:
        self._n = 0
        self._prefix = f"p{os.getpid()}"

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        self._n += 1
        mid = f"{self._prefix}-r{self._n}"
        say("send", mid=mid, channel=ref.channel, text=text)
        return mid

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None:
        say("edit", mid=message_id, channel=ref.channel, text=text)

    async def typing(self, ref: ChannelRef) -> None:
        return None


def _inbound(item: dict[str, Any], timestamp: float) -> InboundMessage:
    return InboundMessage(ChannelRef(item["channel"], item["guild"]), item["user"], item["text"],
                          display_name=item["user"], message_id=item["id"], timestamp=timestamp)


async def _submit_in_order(core: BotCore, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
    """One channel's messages, one after another (L1 and the inbox keep their order); a channel's
    history read back after the process started (`{"catch_up": [...]}`) goes through
    `BotCore.catch_up`, as the Discord adapter's read-back does."""
    while (item := await queue.get()) is not None:
        if "catch_up" in item:
            said = item["catch_up"]
            try:
                caught = await core.catch_up(ChannelRef(said[0]["channel"], said[0]["guild"]),
                                             [_inbound(m, float(m["t"])) for m in said])
            except Exception as exc:
                say("refused", id="catch-up", error=f"{type(exc).__name__}: {exc}"[:300])
            else:
                say("caught_up", ids=caught)
            continue
        message = _inbound(item, time.time())
        try:
            taken = await core.submit(message)
        except Exception as exc:  # what a Discord adapter does: log it and go on with the next message
            say("refused", id=item["id"], error=f"{type(exc).__name__}: {exc}"[:300])
        else:
            say("accepted" if taken is not None else "duplicate", id=item["id"])


def _die_in_claim_when_armed(core: BotCore) -> Callable[[], None]:
    """Wrap this process's claim so that, once armed, the next claim it wins is its last act
    (module docstring); returns the arming switch. The harness's own wrapper: the runtime has no
    such hook."""
    shared = core.shared
    assert shared is not None
    real_claim = shared.claim_message
    armed = [False]

    async def claim_then_maybe_die(channel_key: str, message_id: str) -> int:
        order = await real_claim(channel_key, message_id)
        if order > 0 and armed[0]:
            say("died_in_claim", id=message_id, order=order, pid=os.getpid())
            os._exit(137)
        return order

    shared.claim_message = claim_then_maybe_die  # type: ignore[method-assign]
    return lambda: armed.__setitem__(0, True)


async def _serve(core: BotCore, llm: Any) -> None:
    arm = _die_in_claim_when_armed(core)
    await core.start()
    say(READY)
    loop = asyncio.get_running_loop()
    queues: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
    workers: list[asyncio.Task[None]] = []

    def channel_queue(channel: str) -> asyncio.Queue[dict[str, Any] | None]:
        """The channel's queue, and its worker submitting in order, made at its first message."""
        queue = queues.get(channel)
        if queue is None:
            queue = queues[channel] = asyncio.Queue()
            workers.append(asyncio.create_task(_submit_in_order(core, queue)))
        return queue

    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        item = json.loads(line)
        if item.get("control") == "die_in_claim":
            arm()
            continue
        if "history" in item:  # each channel's recent messages, as the adapter reads them back after a connect
            by_channel: dict[str, list[dict[str, Any]]] = {}
            for said in item["history"]:
                by_channel.setdefault(said["channel"], []).append(said)
            for channel, said_here in by_channel.items():
                channel_queue(channel).put_nowait({"catch_up": said_here})
            continue
        channel_queue(item["channel"]).put_nowait(item)
    for queue in queues.values():
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    await core.close()
    aclose = getattr(llm, "aclose", None)
    if aclose is not None:
        await aclose()


def main(argv: list[str] | None = None) -> None:
    settings = bot_settings(argv, __doc__, debounce_seconds=DEBOUNCE_S, debounce_finished_seconds=DEBOUNCE_S / 2)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s bot[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    with shared_bot(settings, StreamingOutbox()) as (bot, memory):

        def turns(kind: str, data: dict[str, Any]) -> None:
            if kind == "turn.claimed":  # a crash from here until the reply is out misses these
                say("claimed", channel=data.get("channel"), ids=data.get("messages"), pid=os.getpid())
            elif kind == "turn.timings":
                say("turn", channel=data.get("channel"), messages=data.get("messages"),
                    responded=data.get("responded"))

        memory.listener = turns
        asyncio.run(_serve(bot.core, bot.llm))

if __name__ == "__main__":
    main()

"""One bot process of `gieok bench scale`'s runtime part: a BotCore on the shared database and
the shared Redis, answering through the loopback provider. Messages come as JSON lines on stdin
(as a Discord gateway would deliver them to this shard or replica); at the end of stdin the core
shuts down gracefully and one JSON line on stdout reports what this process sent. Logs go to
stderr. Run by `bench.scale_runtime`, never by hand:

    python -m benchmarks.scale_worker --db D --redis R --namespace N --llm-url U
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from benchmarks.runtime import BenchOutbox
from gieok.chat.compose import build_bot
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection
from gieok.memory import Memory

__all__ = ["main"]

READY = "ready"


async def _serve(core: BotCore, llm: Any) -> None:
    await core.start()
    print(READY, flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        item = json.loads(line)
        await core.submit(InboundMessage(ChannelRef(item["channel"], item["guild"]), item["user"], item["text"],
                                         display_name=item["user"], message_id=item["id"], timestamp=time.time()))
    await core.close()
    aclose = getattr(llm, "aclose", None)
    if aclose is not None:
        await aclose()


def _report(core: BotCore, outbox: BenchOutbox) -> dict[str, Any]:
    return {
        "replies": [{"channel": ref.channel, "text": outbox.texts[message_id]} for ref, message_id in outbox.sent],
        "turn_overhead_ms": [t.turn_overhead_ms for t in core.turn_log if t.responded and t.to_first_token_ms > 0],
        "batches": [t.messages for t in core.turn_log],
        "health": {k: v for k, v in core.health.as_dict().items() if k != "stages"},
        "shared_failures": core.health.stages["shared"].failures,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--llm-url", required=True)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    settings = ChatSettings.load(db=args.db, redis=args.redis, redis_namespace=args.namespace,
                             redis_lease_seconds=args.lease_seconds, llm_chain="openai:bench-model",
                             openai_base_url=args.llm_url, rate_limit_channel_seconds=0.0,
                             rate_limit_global_seconds=0.0)
    memory = Memory(settings=settings)
    connection = RedisConnection(settings.redis, settings.redis_namespace)
    try:
        outbox = BenchOutbox()
        bot = build_bot(settings, memory, outbox=outbox,
                        shared=SharedChannels(connection, lease_seconds=settings.redis_lease_seconds))
        memory.embedder.embed_queries(["워밍업 warm-up"])
        asyncio.run(_serve(bot.core, bot.llm))
        print(json.dumps(_report(bot.core, outbox), ensure_ascii=False), flush=True)
    finally:
        connection.close()
        memory.close()


if __name__ == "__main__":
    main()

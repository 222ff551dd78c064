"""One bot process of `gieok bench scale`'s runtime part: a BotCore on the shared database and
the shared Redis, answering through the loopback provider. Messages come as JSON lines on stdin
(as a Discord gateway would deliver them to this shard or replica); at the end of stdin the core
shuts down gracefully and one JSON line on stdout reports what this process sent. Logs go to
stderr. Run by `bench.scale_runtime`, never by hand:

    python -m benchmarks.scale_worker --db D --redis R --namespace N --llm-url U
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from benchmarks.bot_process import bot_settings, shared_bot
from benchmarks.runtime import BenchOutbox
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage

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
    outbox = BenchOutbox()
    with shared_bot(bot_settings(argv, __doc__), outbox) as (bot, _):
        asyncio.run(_serve(bot.core, bot.llm))
        print(json.dumps(_report(bot.core, outbox), ensure_ascii=False), flush=True)

if __name__ == "__main__":
    main()

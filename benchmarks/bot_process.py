"""What the benchmarks' bot processes (`scale_worker`, `chaos_bot`) share: their five options and
a BotCore on the shared database and Redis that answers through the loopback provider."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gieok.chat.compose import Bot, build_bot
from gieok.chat.runtime.core import Outbox
from gieok.chat.runtime.shared_channels import SharedChannels
from gieok.chat.settings import ChatSettings
from gieok.coordination import RedisConnection
from gieok.memory import Memory
from gieok.store.wait import ServiceWait

__all__ = ["NO_CALL_LIMITS", "bot_settings", "shared_bot"]

# A benchmark's load is calls from one user per channel, faster than a community's call limits
# allow: the runtime is measured, not the limits (tests/test_runtime_community.py tests those).
NO_CALL_LIMITS: dict[str, Any] = {"user_limit_calls": 0, "channel_limit_calls": 0}


def bot_settings(argv: Sequence[str] | None, description: str | None, **overrides: Any) -> ChatSettings:
    """`--db --redis --namespace --llm-url [--lease-seconds]` as the chat settings of a bot that
    answers every message at once (no rate limits) through the loopback model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--db", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--llm-url", required=True)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    return ChatSettings.load(db=args.db, redis=args.redis, redis_namespace=args.namespace,
                             redis_lease_seconds=args.lease_seconds, llm_chain="openai:bench-model",
                             openai_base_url=args.llm_url, rate_limit_channel_seconds=0.0,
                             rate_limit_global_seconds=0.0, **{**NO_CALL_LIMITS, **overrides})


def _open_bot(settings: ChatSettings, outbox: Outbox) -> tuple[Bot, Memory, RedisConnection]:
    """One try at the bot of `settings`: what it opened is closed again when a step fails."""
    memory = Memory(settings=settings)
    connection: RedisConnection | None = None
    try:
        connection = RedisConnection(settings.redis, settings.redis_namespace)
        bot = build_bot(settings, memory, outbox=outbox,
                        shared=SharedChannels(connection, lease_seconds=settings.redis_lease_seconds))
        return bot, memory, connection
    except BaseException:
        if connection is not None:
            connection.close()
        memory.close()
        raise


@contextmanager
def shared_bot(settings: ChatSettings, outbox: Outbox) -> Iterator[tuple[Bot, Memory]]:
    """The bot of `settings` on its shared Redis, its embedder warm; closed on the way out.
    Started while the database or Redis is away — or a connection dropped half-way through
    opening it (`gieok bench chaos`'s network faults) — it waits for them (`ServiceWait`, a log
    line each try, up to `startup_wait_seconds`), as `gieok bot` does, instead of exiting."""
    bot, memory, connection = ServiceWait("bench bot", settings.startup_wait_seconds)(_open_bot, settings, outbox)
    try:
        memory.embedder.embed_queries(["워밍업 warm-up"])
        yield bot, memory
    finally:
        connection.close()
        memory.close()

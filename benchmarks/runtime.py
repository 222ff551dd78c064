"""`gieok bench runtime`: the chat runtime under load, end to end over real HTTP.

A store is filled with N blocks of other channels' chat; a loopback OpenAI-compatible server
(bench.loopback_llm) answers at once over real HTTP (the real client, router and SSE parser
run). `channels` channels each send `rate` messages per second (real time) for `duration`
seconds, every message an explicit call carrying a tag "[cNN-mMMM]". Arrivals are either
`random` (each channel's messages at independent uniformly random times: a Poisson process
given the count, as independent people type) or `even` (every channel on the same one-second
beat, offset by c/channels: all channels fill their batches in the same second, a synchronised
burst of turns every max_batch seconds — a worst case). The runtime debounces,
batches, plans, streams and records as in production. Measured per turn: the overhead from
"debounce over" to the first token out, minus the stage-2 call and the provider's wait for its
first token. Checked after shutdown: every sent message is in memory (none lost), every reply
carries only its own channel's tags (none misrouted).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.bot_process import NO_CALL_LIMITS
from benchmarks.fill import filled_memory
from benchmarks.loopback_llm import TAG, loopback_llm
from benchmarks.report import median, p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.chat.compose import build_bot
from gieok.chat.runtime.core import BotCore, ChannelRef, InboundMessage
from gieok.chat.settings import ChatSettings
from gieok.memory import Memory

__all__ = ["BenchOutbox", "arrival_schedule", "measure_runtime", "print_runtime", "run_runtime_bench"]

ARRIVALS = ("random", "even")
QUESTIONS = ("오늘 뭐 해?", "점심 추천해줘", "what's up?", "내일 날씨 어때?", "any game tonight?", "주말 계획 있어?")


class BenchOutbox:
    """Replies as the channel would show them: what was sent where, and each message's final text."""

    def __init__(self) -> None:
        self.sent: list[tuple[ChannelRef, str]] = []
        self.texts: dict[str, str] = {}
        self._n = 0

    async def send(self, ref: ChannelRef, text: str, *, reply_to: str | None = None) -> str:
        self._n += 1
        message_id = f"r{self._n}"
        self.sent.append((ref, message_id))
        self.texts[message_id] = text
        return message_id

    async def edit(self, ref: ChannelRef, message_id: str, text: str) -> None:
        self.texts[message_id] = text

    async def typing(self, ref: ChannelRef) -> None:
        return None


def arrival_schedule(channels: int, duration: float, rate: float, arrivals: str,
                     seed: int = 7) -> list[tuple[float, int, int]]:
    """(seconds from the start, channel, message number) for every message, in time order;
    each channel sends int(duration × rate) messages."""
    count = int(duration * rate)
    rng = random.Random(seed)
    schedule: list[tuple[float, int, int]] = []
    for c in range(channels):
        if arrivals == "even":
            times = [(m + c / channels) / rate for m in range(count)]
        else:
            times = sorted(rng.uniform(0.0, duration) for _ in range(count))
        schedule.extend((t, c, m) for m, t in enumerate(times))
    schedule.sort()
    return schedule


def measure_runtime(blocks: int = 100_000, *, channels: int = 50, duration: float = 60.0, rate: float = 1.0,
                    arrivals: str = "random", seed: int = 7, workdir: Path | None = None,
                    cache_dir: Path | None = None) -> dict[str, Any]:
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, not {arrivals!r}")
    schedule = arrival_schedule(channels, duration, rate, arrivals, seed)
    memory = filled_memory("runtime", blocks, workdir, cache_dir)
    try:
        with loopback_llm() as url:
            report = asyncio.run(_play(memory, url, channels, schedule, f"{channels} channels × {rate:g} msg/s "
                                                                          f"× {duration:g} s ({arrivals})"))
    finally:
        memory.close()
    report["arrivals"] = arrivals
    return {**report, "_blocks": blocks, "_channels": channels, "_duration": duration, "_rate": rate}


async def _send(core: BotCore, channels: int, schedule: list[tuple[float, int, int]], title: str,
                engine: Any) -> tuple[dict[str, str], float, float]:
    """Submit every message at its time in the schedule, then shut the runtime down. Returns
    (tag -> channel of every message sent, seconds the last send was behind schedule, share
    of the run the embedding engine was busy)."""
    refs = [ChannelRef(f"bench-{c:02d}", "bench-guild") for c in range(channels)]
    busy_before = getattr(engine, "busy_seconds", 0.0)
    sent: dict[str, str] = {}  # tag -> channel
    started = time.monotonic()
    with progress_bar(title, len(schedule)) as advance:
        for at, c, number in schedule:
            delay = started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            ref = refs[c]
            tag = f"[c{c:02d}-m{number:03d}]"
            sent[tag] = ref.channel
            await core.submit(InboundMessage(ref, f"u{c:02d}", f"누리야 {tag} {QUESTIONS[number % len(QUESTIONS)]}",
                                             display_name=f"user{c:02d}", message_id=f"{c}-{number}"))
            advance()
        behind = time.monotonic() - started - (schedule[-1][0] if schedule else 0.0)
        # How much of the run the one embedding engine was busy: above ~0.9 the load is more
        # than two cores can embed, and turns queue however they are scheduled.
        engine_share = (getattr(engine, "busy_seconds", 0.0) - busy_before) / max(time.monotonic() - started, 1e-9)
        await core.close()
    return sent, behind, engine_share


def _delivery(memory: Memory, core: BotCore, sent: dict[str, str], bot_name: str) -> dict[str, int]:
    """Messages lost (not stored), replies misrouted (a tag from another channel), messages answered."""
    found = {tag for block in memory.iter_blocks() if block.kind == "turn" for tag in TAG.findall(block.text)
             if block.speaker != bot_name}
    misrouted = 0
    answered: set[str] = set()
    for reply in core.replies:
        tags = set(TAG.findall(reply.text))
        answered |= tags
        if any(sent.get(tag) != reply.ref.channel for tag in tags):
            misrouted += 1
    return {"lost": len(set(sent) - found), "misrouted": misrouted, "answered": len(answered & set(sent))}


async def _play(memory: Memory, url: str, channels: int, schedule: list[tuple[float, int, int]],
                title: str) -> dict[str, Any]:
    settings = ChatSettings.over(memory.settings, llm_chain="openai:bench-model", openai_base_url=url,
                                 rate_limit_channel_seconds=0.0, rate_limit_global_seconds=0.0, **NO_CALL_LIMITS)
    bot = build_bot(settings, memory, outbox=BenchOutbox())
    core = bot.core
    memory.embedder.embed_queries(["워밍업 warm-up"])
    sent, behind, engine_share = await _send(core, channels, schedule, title, getattr(memory.embedder, "inner", None))
    aclose = getattr(bot.llm, "aclose", None)
    if aclose is not None:
        await aclose()
    turns = list(core.turn_log)
    overheads = [t.turn_overhead_ms for t in turns if t.responded and t.to_first_token_ms > 0]
    delivery = _delivery(memory, core, sent, settings.bot_name)
    calls = dict(core.health.model_calls)
    return {
        "model_calls": calls,  # by purpose: reply, decide, extract
        "model_calls_per_reply": round(sum(calls.values()) / max(1, len(core.replies)), 3),
        "model_calls_per_message": round(sum(calls.values()) / max(1, len(sent)), 3),
        "turn_overhead_ms": p50_p95(overheads),
        "messages_sent": len(sent),
        "messages_lost": delivery["lost"],
        "misrouted_replies": delivery["misrouted"],
        "replies": len(core.replies),
        "messages_answered": delivery["answered"],
        "turns_measured": len(overheads),
        "stages_p50_ms": {name: round(median([getattr(t, name) for t in turns if t.responded]), 3)
                          for name in ("overhead_ms", "stage2_ms", "recall_ms", "first_token_ms",
                                       "provider_first_token_ms", "to_first_token_ms", "debounce_ms", "send_ms")},
        "batch_p50": median([t.messages for t in turns]),
        "seconds_behind_schedule": round(max(0.0, behind), 2),
        "embedder_busy_share": round(engine_share, 3),
        "health": {k: v for k, v in core.health.as_dict().items() if k != "stages"},
    }


def print_runtime(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table(f"runtime: {report['_channels']} channels × {report['_rate']:g} msg/s × "
                          f"{report['_duration']:g} s ({report['arrivals']} arrivals) "
                          f"over {report['_blocks']:,} blocks (loopback provider, medians of one run)",
                          ("turn overhead p50", "p95", "sent", "lost", "misrouted", "replies", "answered",
                           "model calls / reply", "/ message"))
    table.add_row(f"{report['turn_overhead_ms']['p50']:.2f} ms", f"{report['turn_overhead_ms']['p95']:.2f} ms",
                  str(report["messages_sent"]), str(report["messages_lost"]), str(report["misrouted_replies"]),
                  str(report["replies"]), str(report["messages_answered"]),
                  f"{report['model_calls_per_reply']:.2f}", f"{report['model_calls_per_message']:.2f}")
    console.print(table)
    console.print("stage medians (ms): " + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}"
                                                     for k, v in report["stages_p50_ms"].items()))
    console.print("model calls: " + ", ".join(f"{k} {v}" for k, v in sorted(report["model_calls"].items())))


def run_runtime_bench(blocks: int = 100_000, json_out: str | Path | None = None, *, channels: int = 50,
                      duration: float = 60.0, rate: float = 1.0, arrivals: str = "random", seed: int = 7,
                      workdir: Path | None = None, cache_dir: Path | None = None) -> dict[str, Any]:
    report = measure_runtime(blocks, channels=channels, duration=duration, rate=rate, arrivals=arrivals, seed=seed,
                             workdir=workdir, cache_dir=cache_dir)
    return print_and_write(report, print_runtime, json_out)

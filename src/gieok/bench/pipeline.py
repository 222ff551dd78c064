"""`gieok bench pipeline`: the conversation pipeline's own overhead, LLM calls excluded.

A store is filled with N blocks of other channels' chat (bench.fill), then the bundled
300-turn Korean/English conversation is played into one channel through the real pipeline:
every message planned and recorded, every 3rd one an explicit call, the stage-2 model a
scripted `LLM` that answers after `llm_ms` (its time is subtracted). With 0 nothing can hide
behind the model call (the worst case); with a realistic delay the message's embedding and
classifiers overlap the stage-2 call on explicit calls, as they do in production. Reported per message:
`plan` overhead (message in → prompt ready, without the stage-2 call), and `record` (reply
into L1, turn blocks, working memory — after the reply, off the critical path).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..agent.pipeline import ConversationPipeline, IncomingMessage
from ..demo import load_sample_conversation
from ..llm.scripted import Request, ScriptedLLM
from .fill import filled_memory
from .report import median, percentile, progress_bar, write_json

__all__ = ["run_pipeline_bench"]

STAGES = ("embed_ms", "guard_ms", "l1_ms", "stage1_ms", "recall_ms", "context_ms")


class _SlowLLM(ScriptedLLM):
    """The scripted model, answering after `delay_s` (an LLM's round trip; awaited, not slept
    on a thread, so the pipeline's own work can overlap it as in production)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(_brain)
        self.delay_s = delay_s

    async def chat(self, messages, **kwargs):  # type: ignore[override]
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().chat(messages, **kwargs)


def _brain(request: Request) -> dict[str, Any]:
    text = request.messages[0].content
    if "user_facts" in text:
        return {"guild_facts": [], "user_facts": [], "summary_updates": {"stage": "ongoing"}}
    message = text.split("<<<")[-1].split(">>>")[0].strip()
    # A rewritten query, as a model would write one: it is embedded again, as in production.
    return {"response_needed": True, "retrieval_needed": True, "search_query": f"{message[:120]} (기억)",
            "suspicious": False}


def run_pipeline_bench(blocks: int = 100_000, json_out: str | Path | None = None, *, turns: int = 300,
                       workdir: Path | None = None, cache_dir: Path | None = None,
                       classifier: bool = True, llm_ms: float = 0.0) -> dict[str, Any]:
    memory = filled_memory("pipeline", blocks, workdir, cache_dir)
    try:
        stage1 = None
        if classifier:
            from ..agent.response_classifier import ResponseClassifier

            stage1 = ResponseClassifier.load(memory.embedder, memory.embedder.name)
        pipeline = ConversationPipeline(memory, llm=_SlowLLM(llm_ms / 1000), classifier=stage1)
        data = load_sample_conversation()
        script = [(t["speaker"], t["text"]) for s in data["sessions"] for t in s["turns"]][:turns]
        ids = {name: str(1000 + i) for i, name in enumerate(sorted({s for s, _ in script}))}
        memory.embedder.embed_queries(["워밍업 warm-up"])
        plan_ms: list[float] = []
        explicit_ms: list[float] = []
        record_ms: list[float] = []
        stages: dict[str, list[float]] = {name: [] for name in STAGES}
        responded = 0

        async def play(advance) -> None:
            nonlocal responded
            for i, (speaker, text) in enumerate(script):
                message = IncomingMessage(text[:2000], user_id=ids[speaker], channel="bench", guild="bench-guild",
                                          display_name=speaker, explicit=i % 3 == 0)
                plan = await pipeline.plan(message)
                if i >= 10:  # the first turns warm caches and load models
                    plan_ms.append(plan.timings_ms["overhead_ms"])
                    if message.explicit:
                        explicit_ms.append(plan.timings_ms["overhead_ms"])
                    for name in STAGES:
                        if name in plan.timings_ms:
                            stages[name].append(plan.timings_ms[name])
                responded += plan.respond
                t0 = time.perf_counter()
                await pipeline.record(plan, "응 그렇구나!" if plan.respond else None)
                if i >= 10:
                    record_ms.append((time.perf_counter() - t0) * 1000)
                advance()
            await pipeline.drain()

        with progress_bar(f"play {len(script)} messages into a {blocks:,}-block store", len(script)) as advance:
            asyncio.run(play(advance))
        total_blocks = memory.stats().blocks
    finally:
        memory.close()
    report = {
        "blocks": total_blocks,
        "messages": len(script),
        "responded": responded,
        "overhead_ms": {"p50": round(median(plan_ms), 3), "p95": round(percentile(plan_ms, 95), 3)},
        "explicit_overhead_ms": {"p50": round(median(explicit_ms), 3), "p95": round(percentile(explicit_ms, 95), 3)},
        "record_ms": {"p50": round(median(record_ms), 3), "p95": round(percentile(record_ms, 95), 3)},
        "stages_p50_ms": {name: round(median(v), 3) for name, v in stages.items() if v},
        "stage1": classifier,
        "llm_ms": llm_ms,
    }
    table = Table(title=f"pipeline overhead without LLM calls, {total_blocks:,} blocks in the store "
                        f"({len(script)} messages, stage-2 model answering in {llm_ms:g} ms, medians of one run)")
    for column in ("what", "p50 ms", "p95 ms"):
        table.add_column(column, justify="right")
    table.add_row("plan (message in → prompt ready)", f"{report['overhead_ms']['p50']:.2f}",
                  f"{report['overhead_ms']['p95']:.2f}")
    table.add_row("plan, explicit calls (recall every time)", f"{report['explicit_overhead_ms']['p50']:.2f}",
                  f"{report['explicit_overhead_ms']['p95']:.2f}")
    table.add_row("record (after the reply)", f"{report['record_ms']['p50']:.2f}", f"{report['record_ms']['p95']:.2f}")
    for name, value in report["stages_p50_ms"].items():
        table.add_row(f"  stage {name.removesuffix('_ms')}", f"{value:.2f}", "")
    Console(width=160).print(table)
    write_json(json_out, report)
    return report

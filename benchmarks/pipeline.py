"""`gieok bench pipeline`: the conversation pipeline's own overhead, LLM calls excluded.

A store is filled with N blocks of other channels' chat (bench.fill), then the bundled
300-turn Korean/English conversation is played into one channel through the real pipeline:
every message planned and recorded, every 3rd one an explicit call, the stage-2 model a
scripted `LLM` that answers after `llm_ms` (its time is subtracted). Stage times are medians
over the plans that ran the stage (`query_embed` only on plans that searched). With 0 nothing
can hide
behind the model call (the worst case); with a realistic delay the message's embedding and
classifiers overlap the stage-2 call on explicit calls, as they do in production. Reported per message:
`plan` overhead (message in → prompt ready, without the stage-2 call), and `record` (reply
into L1, turn blocks, working memory — after the reply, off the critical path).
With `debounce_ms`, each message is observed, then planned that much later, as the runtime
does after its debounce: what `observe` starts (classifier vectors, the likely search query's
e5 vector) has had time to finish, and `plan` is the runtime's turn overhead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.fill import filled_memory
from benchmarks.report import median, p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.chat.agent.classifier import classifier_encoder
from gieok.chat.agent.pipeline import ConversationPipeline, IncomingMessage
from gieok.chat.compose import build_pipeline
from gieok.chat.demo import load_sample_conversation
from gieok.chat.llm.scripted import Request, ScriptedLLM

__all__ = ["measure_pipeline", "print_pipeline", "run_pipeline_bench"]

# embed: the message through the classifier encoder (USE); query_embed: the search query through
# the memory's embedder (e5), the one e5 embedding of a reply.
STAGES = ("embed_ms", "guard_ms", "l1_ms", "stage1_ms", "query_embed_ms", "recall_ms", "context_ms")


class _SlowLLM(ScriptedLLM):
    """The scripted model, answering after `delay_s` (an LLM's round trip; awaited, not slept
    on a thread, so the pipeline's own work can overlap it as in production)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(_brain)
        self.delay_s = delay_s

    async def chat(self, messages, **kwargs):
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


WARM_TURNS = 10  # the first turns warm caches and load models: not measured


@dataclass
class _Timings:
    """Per measured message: plan overhead (all, explicit calls), record time, each stage."""

    plan_ms: list[float] = field(default_factory=list)
    explicit_ms: list[float] = field(default_factory=list)
    searched_ms: list[float] = field(default_factory=list)  # plans that embedded a search query and recalled
    record_ms: list[float] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in STAGES})
    responded: int = 0

    def add_plan(self, timings_ms: dict[str, float], explicit: bool) -> None:
        self.plan_ms.append(timings_ms["overhead_ms"])
        if explicit:
            self.explicit_ms.append(timings_ms["overhead_ms"])
        if "query_embed_ms" in timings_ms:
            self.searched_ms.append(timings_ms["overhead_ms"])
        for name in STAGES:
            if name in timings_ms:
                self.stages[name].append(timings_ms[name])


def _script(turns: int) -> list[tuple[str, str]]:
    """(speaker, text) of the first `turns` messages of the bundled conversation."""
    data = load_sample_conversation()
    return [(t["speaker"], t["text"]) for s in data["sessions"] for t in s["turns"]][:turns]


async def _play(pipeline: ConversationPipeline, script: list[tuple[str, str]], timings: _Timings, advance,
                debounce_ms: float = 0.0) -> None:
    """Every message planned and recorded in one channel, every 3rd an explicit call."""
    ids = {name: str(1000 + i) for i, name in enumerate(sorted({s for s, _ in script}))}
    for i, (speaker, text) in enumerate(script):
        message = IncomingMessage(text[:2000], user_id=ids[speaker], channel="bench", guild="bench-guild",
                                  display_name=speaker, explicit=i % 3 == 0)
        if debounce_ms > 0:
            observed = [pipeline.observe(message)]
            await asyncio.sleep(debounce_ms / 1000)
            plan = await pipeline.plan(message, observed=observed)
        else:
            plan = await pipeline.plan(message)
        if i >= WARM_TURNS:
            timings.add_plan(plan.timings_ms, message.explicit)
        timings.responded += plan.respond
        t0 = time.perf_counter()
        await pipeline.record(plan, "응 그렇구나!" if plan.respond else None)
        if i >= WARM_TURNS:
            timings.record_ms.append((time.perf_counter() - t0) * 1000)
        advance()
    await pipeline.drain()


def measure_pipeline(blocks: int = 100_000, *, turns: int = 300, workdir: Path | None = None,
                     cache_dir: Path | None = None, classifier: bool = True, llm_ms: float = 0.0,
                     debounce_ms: float = 0.0) -> dict[str, Any]:
    memory = filled_memory("pipeline", blocks, workdir, cache_dir)
    try:
        stage1 = None
        if classifier:
            from gieok.chat.agent.response_classifier import ResponseClassifier

            stage1 = ResponseClassifier.load(classifier_encoder(memory.settings))
        pipeline = build_pipeline(None, memory, llm=_SlowLLM(llm_ms / 1000), classifier=stage1)
        script = _script(turns)
        memory.embedder.embed_queries(["워밍업 warm-up"])
        timings = _Timings()
        with progress_bar(f"play {len(script)} messages into a {blocks:,}-block store", len(script)) as advance:
            asyncio.run(_play(pipeline, script, timings, advance, debounce_ms))
        total_blocks = memory.stats().blocks
    finally:
        memory.close()
    return {
        "blocks": total_blocks,
        "messages": len(script),
        "measured": len(timings.plan_ms),
        "responded": timings.responded,
        "overhead_ms": p50_p95(timings.plan_ms),
        "explicit_overhead_ms": p50_p95(timings.explicit_ms),
        "searched_overhead_ms": p50_p95(timings.searched_ms),
        "searched": len(timings.searched_ms),
        "record_ms": p50_p95(timings.record_ms),
        "stages_p50_ms": {name: round(median(v), 3) for name, v in timings.stages.items() if v},
        "stage1": classifier,
        "llm_ms": llm_ms,
        "debounce_ms": debounce_ms,
    }


def print_pipeline(report: dict[str, Any], console: Console | None = None) -> None:
    table = results_table(f"pipeline overhead without LLM calls, {report['blocks']:,} blocks in the store "
                          f"({report['messages']} messages, stage-2 model answering in {report['llm_ms']:g} ms, "
                          f"{_debounce(report)}medians of one run)", ("what", "p50 ms", "p95 ms"))
    start = "debounce over" if report.get("debounce_ms") else "message in"
    for what, key in ((f"plan ({start} → prompt ready)", "overhead_ms"),
                      ("plan, explicit calls (recall every time)", "explicit_overhead_ms"),
                      (f"plan, replies that searched ({report['searched']} of {report['measured']})",
                       "searched_overhead_ms"),
                      ("record (after the reply)", "record_ms")):
        table.add_row(what, f"{report[key]['p50']:.2f}", f"{report[key]['p95']:.2f}")
    for name, value in report["stages_p50_ms"].items():
        table.add_row(f"  stage {name.removesuffix('_ms')}", f"{value:.2f}", "")
    table_console(console).print(table)


def _debounce(report: dict[str, Any]) -> str:
    waited = report.get("debounce_ms", 0.0)
    return f"each planned {waited:g} ms after it arrived, " if waited else ""


def run_pipeline_bench(blocks: int = 100_000, json_out: str | Path | None = None, *, turns: int = 300,
                       workdir: Path | None = None, cache_dir: Path | None = None,
                       classifier: bool = True, llm_ms: float = 0.0, debounce_ms: float = 0.0) -> dict[str, Any]:
    report = measure_pipeline(blocks, turns=turns, workdir=workdir, cache_dir=cache_dir, classifier=classifier,
                              llm_ms=llm_ms, debounce_ms=debounce_ms)
    return print_and_write(report, print_pipeline, json_out)

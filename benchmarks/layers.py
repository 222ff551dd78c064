"""`gieok bench layers`: the layered search replayed the way a bot lives it.

Each LoCoMo conversation is replayed turn by turn through `Memory.remember` (long-term
block + working memory + STM); its questions are then asked through the coordinator,
with working memory as the conversation left it. Every question is also answered by the
full hybrid search alone and by the checkpoint-localized search alone, so the checkpoint
layer's recall and speed are compared with full search on the same questions. A second
pass repeats every question to exercise the cache. Larger sizes add synthetic chat from
other channels (the latency corpus) before the replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.fill import bench_workdir, filled_memory
from benchmarks.locomo import LocomoData, Question, _score, load_locomo
from benchmarks.report import median, percentile, print_and_write, progress_bar, results_table, table_console
from gieok.memory import Memory
from gieok.store.base import BM25Filter
from gieok.types import Scope

__all__ = ["measure_layers", "print_layers", "run_layers"]

LAYER_NAMES = ("working_memory", "cache", "checkpoint", "full")


@dataclass
class _Tally:
    """What the replay measured: per layer, how often it answered and how fast; recall@10 of
    the layered search, of full search alone and of the checkpoint-localized search alone."""

    dia_of: dict[int, str] = field(default_factory=dict)  # block index -> LoCoMo turn id
    latencies: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in LAYER_NAMES})
    answers: dict[str, int] = field(default_factory=lambda: {name: 0 for name in LAYER_NAMES})
    overall_recall: list[float] = field(default_factory=list)
    repeat_recall: list[float] = field(default_factory=list)
    full_recall: list[float] = field(default_factory=list)
    local_recall: list[tuple[float, float]] = field(default_factory=list)  # (localized, full) where it answered
    overall_ms: list[float] = field(default_factory=list)
    full_ms: list[float] = field(default_factory=list)
    local_ms: list[float] = field(default_factory=list)

    def recall(self, q: Question, block_indices: list[int]) -> float:
        ranked = [self.dia_of[i] for i in block_indices if i in self.dia_of]
        return _score(q, ranked, [], 10)[0]


def _ask_layered(memory: Memory, q: Question, scope: dict[str, str], tally: _Tally) -> float:
    """Ask through the coordinator, as the bot does; count the layer that answered. Returns recall@10."""
    result = memory.search(q.question, 10, scope=scope)
    tally.answers[result.source] += 1
    tally.latencies[result.source].append(result.search_time_ms)
    tally.overall_ms.append(result.search_time_ms)
    return tally.recall(q, [h.block.block_index for h in result.hits])


def _ask_full_and_localized(memory: Memory, q: Question, conv: str, scope: dict[str, str], tally: _Tally) -> None:
    """The same question by full hybrid search alone and by checkpoint-localized search alone."""
    qv = memory.embedder.embed_query(q.question)  # warm LRU: no model time below
    tally.overall_recall.append(_ask_layered(memory, q, scope, tally))

    t0 = time.perf_counter()
    full = memory.search(q.question, 10, scope=scope, layers=False, query_vector=qv)
    tally.full_ms.append((time.perf_counter() - t0) * 1000)
    tally.full_recall.append(tally.recall(q, [h.block.block_index for h in full.hits]))

    t0 = time.perf_counter()
    local = memory.localized.search(memory.working.slots(Scope(channel=conv)), qv, 10, memory.indexes,
                                    BM25Filter(Scope(channel=conv)), memory.settings.checkpoint_radius)
    tally.local_ms.append((time.perf_counter() - t0) * 1000)
    if local:
        tally.local_recall.append((tally.recall(q, [h.block_index for h in local]), tally.full_recall[-1]))


def _replay(memory: Memory, data: LocomoData, tally: _Tally) -> None:
    """Each conversation turn by turn, then its questions, then its questions again (the cache)."""
    by_conversation: dict[str, list] = {}
    for turn in data.turns:
        by_conversation.setdefault(turn.conversation, []).append(turn)
    questions_by_conv: dict[str, list] = {}
    for q in data.questions:
        questions_by_conv.setdefault(q.conversation, []).append(q)
    with progress_bar("replay conversations and ask", len(data.turns) + len(data.questions)) as advance:
        for conv, turns in by_conversation.items():
            scope = {"channel": conv}
            for turn in turns:
                block = memory.remember(turn.text, scope=scope, speaker=turn.speaker, event_time=turn.event_time,
                                        metadata={"dia_id": turn.dia_id})
                tally.dia_of[block.block_index] = turn.dia_id
                advance()
            for q in questions_by_conv.get(conv, []):
                _ask_full_and_localized(memory, q, conv, scope, tally)
                advance()
            # users re-ask: repeat this conversation's questions while it is still fresh
            for q in questions_by_conv.get(conv, []):
                tally.repeat_recall.append(_ask_layered(memory, q, scope, tally))


def _layer_report(tally: _Tally, first_pass: int) -> dict[str, Any]:
    """Per layer: hit rate over both passes and latency; the checkpoint and full layers also
    alone, against each other."""
    total = first_pass * 2
    layers: dict[str, Any] = {}
    for name in LAYER_NAMES:
        layers[name] = {"hit_rate": round(tally.answers[name] / total, 4),
                        "p50_ms": round(median(tally.latencies[name]), 4),
                        "p95_ms": round(percentile(tally.latencies[name], 95), 4)}
    checkpoint_hits = tally.local_recall
    full_ms, local_ms = tally.full_ms, tally.local_ms
    layers["checkpoint"].update({
        "speedup_vs_full": round(median(full_ms) / median(local_ms), 2) if median(local_ms) else None,
        "recall_delta_vs_full": (round(float(np.mean([a - b for a, b in checkpoint_hits])), 4)
                                 if checkpoint_hits else None),
        "localized_p50_ms": round(median(local_ms), 4),
        "answerable_share": round(len(checkpoint_hits) / first_pass, 4),
    })
    layers["full"].update({"turn_recall_at_10": round(float(np.mean(tally.full_recall)), 4),
                           "full_search_p50_ms": round(median(full_ms), 4)})
    return layers


def _one_size(data: LocomoData, target: int, workdir: Path, cache_dir: Path | None,
              overrides: dict[str, Any]) -> dict[str, Any]:
    memory = filled_memory("layers", target - len(data.turns), workdir, cache_dir, db_name=f"layers-{target}.db",
                           **overrides)
    try:
        with progress_bar("embed questions", len(data.questions)) as advance:
            for q in data.questions:  # warm the embedder's LRU: latencies below exclude embedding
                memory.embedder.embed_query(q.question)
                advance()
        tally = _Tally()
        _replay(memory, data, tally)
        stats = memory.layer_stats()
        return {
            "n": len(memory.catalog),
            "layers": _layer_report(tally, len(data.questions)),
            "overall": {"p50_ms": round(median(tally.overall_ms), 4),
                        "turn_recall_at_10": round(float(np.mean(tally.overall_recall)), 4),
                        "turn_recall_at_10_repeat_pass": round(float(np.mean(tally.repeat_recall)), 4)},
            "working_memory": stats["hybrid_stm"]["working_memory"],
            "checkpoints": stats["checkpoints"],
        }
    finally:
        memory.close()


def measure_layers(data_path: str | Path, sizes: list[int] | None = None, *, workdir: Path | None = None,
                   cache_dir: Path | None = None, settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_locomo(data_path)
    workdir = bench_workdir("layers", workdir)
    targets = sorted({max(len(data.turns), s) for s in (sizes or [0])})
    runs = [_one_size(data, target, workdir, cache_dir, dict(settings_overrides or {})) for target in targets]
    return {"layers": runs[0]["layers"], "overall": runs[0]["overall"], "sizes": runs,
            "_questions": len(data.questions)}


def print_layers(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    for run in report["sizes"]:
        table = results_table(f"layered search at {run['n']:,} blocks — {report['_questions']} LoCoMo questions "
                              f"asked twice (each conversation's questions repeated right after: the cache); "
                              f"latencies exclude query embedding",
                              ("layer", "answered", "p50 ms", "p95 ms", "notes"), left=("notes",))
        for name in LAYER_NAMES:
            layer = run["layers"][name]
            notes = ""
            if name == "checkpoint":
                notes = (f"localized alone: p50 {layer['localized_p50_ms']:.3f} ms, "
                         f"{layer['speedup_vs_full']}× faster than full, recall@10 Δ {layer['recall_delta_vs_full']} "
                         f"(on the {layer['answerable_share']:.0%} of questions it returns anything for)")
            if name == "full":
                notes = (f"full search alone: recall@10 {layer['turn_recall_at_10']:.3f}, "
                         f"p50 {layer['full_search_p50_ms']:.2f} ms")
            table.add_row(name, f"{layer['hit_rate']:.1%}", f"{layer['p50_ms']:.3f}", f"{layer['p95_ms']:.3f}", notes)
        console.print(table)
        o = run["overall"]
        console.print(f"overall: p50 {o['p50_ms']:.3f} ms · recall@10 {o['turn_recall_at_10']:.3f} (first pass) "
                      f"vs full search alone {run['layers']['full']['turn_recall_at_10']:.3f}")


def run_layers(data_path: str | Path, sizes: list[int] | None = None, json_out: str | Path | None = None, *,
               workdir: Path | None = None, cache_dir: Path | None = None,
               settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    report = measure_layers(data_path, sizes, workdir=workdir, cache_dir=cache_dir,
                            settings_overrides=settings_overrides)
    return print_and_write(report, print_layers, json_out)

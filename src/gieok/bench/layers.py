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

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..memory import Memory, remove_memory_files
from ..store.base import BM25Filter
from ..types import Scope
from .fill import fill_background
from .locomo import _score, load_locomo
from .report import median, percentile, progress_bar, write_json

__all__ = ["run_layers"]

LAYER_NAMES = ("working_memory", "cache", "checkpoint", "full")


def _one_size(data, target: int, workdir: Path, cache_dir: Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    db = workdir / f"layers-{target}.db"
    remove_memory_files(db)
    memory = Memory(db, **overrides)
    try:
        fill_background(memory, target - len(data.turns), cache_dir)
        dia_of: dict[int, str] = {}
        by_conversation: dict[str, list] = {}
        for turn in data.turns:
            by_conversation.setdefault(turn.conversation, []).append(turn)
        questions_by_conv: dict[str, list] = {}
        for q in data.questions:
            questions_by_conv.setdefault(q.conversation, []).append(q)
        with progress_bar("embed questions", len(data.questions)) as advance:
            for q in data.questions:  # warm the embedder's LRU: latencies below exclude embedding
                memory.embedder.embed_query(q.question)
                advance()

        latencies: dict[str, list[float]] = {name: [] for name in LAYER_NAMES}
        answers = {name: 0 for name in LAYER_NAMES}
        overall_recall, full_recall, local_recall, repeat_recall = [], [], [], []
        full_ms, local_ms, overall_ms = [], [], []
        with progress_bar("replay conversations and ask", len(data.turns) + len(data.questions)) as advance:
            for conv, turns in by_conversation.items():
                scope = {"channel": conv}
                for turn in turns:
                    block = memory.remember(turn.text, scope=scope, speaker=turn.speaker, event_time=turn.event_time,
                                            metadata={"dia_id": turn.dia_id})
                    dia_of[block.block_index] = turn.dia_id
                    advance()
                for q in questions_by_conv.get(conv, []):
                    qv = memory.embedder.embed_query(q.question)  # warm LRU: no model time below
                    result = memory.search(q.question, 10, scope=scope)
                    answers[result.source] += 1
                    latencies[result.source].append(result.search_time_ms)
                    overall_ms.append(result.search_time_ms)
                    overall_recall.append(_recall(q, result.hits, dia_of))

                    t0 = time.perf_counter()
                    full = memory.search(q.question, 10, scope=scope, layers=False, query_vector=qv)
                    full_ms.append((time.perf_counter() - t0) * 1000)
                    full_recall.append(_recall(q, full.hits, dia_of))

                    t0 = time.perf_counter()
                    local = memory.localized.search(memory.working.slots(Scope(channel=conv)), qv, 10, memory.catalog,
                                                    memory.vectors, BM25Filter(Scope(channel=conv)),
                                                    memory.settings.checkpoint_radius)
                    local_ms.append((time.perf_counter() - t0) * 1000)
                    if local:
                        local_recall.append((_recall_ids(q, [h.block_index for h in local], dia_of),
                                             full_recall[-1]))
                    advance()
                # users re-ask: repeat this conversation's questions while it is still fresh
                for q in questions_by_conv.get(conv, []):
                    result = memory.search(q.question, 10, scope=scope)
                    answers[result.source] += 1
                    latencies[result.source].append(result.search_time_ms)
                    overall_ms.append(result.search_time_ms)
                    repeat_recall.append(_recall(q, result.hits, dia_of))
        first_pass = len(data.questions)
        total = first_pass * 2
        layers: dict[str, Any] = {}
        for name in LAYER_NAMES:
            layers[name] = {"hit_rate": round(answers[name] / total, 4), "p50_ms": round(median(latencies[name]), 4),
                            "p95_ms": round(percentile(latencies[name], 95), 4)}
        checkpoint_hits = [r for r in local_recall]
        layers["checkpoint"].update({
            "speedup_vs_full": round(median(full_ms) / median(local_ms), 2) if median(local_ms) else None,
            "recall_delta_vs_full": round(float(np.mean([a - b for a, b in checkpoint_hits])), 4) if checkpoint_hits else None,
            "localized_p50_ms": round(median(local_ms), 4),
            "answerable_share": round(len(checkpoint_hits) / first_pass, 4),
        })
        layers["full"].update({"turn_recall_at_10": round(float(np.mean(full_recall)), 4),
                               "full_search_p50_ms": round(median(full_ms), 4)})
        stats = memory.layer_stats()
        return {
            "n": len(memory.catalog),
            "layers": layers,
            "overall": {"p50_ms": round(median(overall_ms), 4),
                        "turn_recall_at_10": round(float(np.mean(overall_recall)), 4),
                        "turn_recall_at_10_repeat_pass": round(float(np.mean(repeat_recall)), 4)},
            "working_memory": stats["hybrid_stm"]["working_memory"],
            "checkpoints": stats["checkpoints"],
        }
    finally:
        memory.close()


def _recall_ids(q, block_indices: list[int], dia_of: dict[int, str]) -> float:
    ranked = [dia_of[i] for i in block_indices if i in dia_of]
    return _score(q, ranked, [], 10)[0]


def _recall(q, hits, dia_of: dict[int, str]) -> float:
    return _recall_ids(q, [h.block.block_index for h in hits], dia_of)


def run_layers(data_path: str | Path, sizes: list[int] | None = None, json_out: str | Path | None = None, *,
               workdir: Path | None = None, cache_dir: Path | None = None,
               settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_locomo(data_path)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gieok-layers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    targets = sorted({max(len(data.turns), s) for s in (sizes or [0])})
    runs = [_one_size(data, target, workdir, cache_dir, dict(settings_overrides or {})) for target in targets]
    report = {"layers": runs[0]["layers"], "overall": runs[0]["overall"], "sizes": runs}
    _print(runs, len(data.questions))
    write_json(json_out, report)
    return report


def _print(runs: list[dict[str, Any]], questions: int) -> None:
    console = Console(width=160)
    for run in runs:
        table = Table(title=f"layered search at {run['n']:,} blocks — {questions} LoCoMo questions asked twice "
                            f"(each conversation's questions repeated right after: the cache); latencies exclude query embedding")
        for column in ("layer", "answered", "p50 ms", "p95 ms", "notes"):
            table.add_column(column, justify="right" if column != "notes" else "left")
        for name in LAYER_NAMES:
            layer = run["layers"][name]
            notes = ""
            if name == "checkpoint":
                notes = (f"localized alone: p50 {layer['localized_p50_ms']:.3f} ms, "
                         f"{layer['speedup_vs_full']}× faster than full, recall@10 Δ {layer['recall_delta_vs_full']} "
                         f"(on the {layer['answerable_share']:.0%} of questions it returns anything for)")
            if name == "full":
                notes = f"full search alone: recall@10 {layer['turn_recall_at_10']:.3f}, p50 {layer['full_search_p50_ms']:.2f} ms"
            table.add_row(name, f"{layer['hit_rate']:.1%}", f"{layer['p50_ms']:.3f}", f"{layer['p95_ms']:.3f}", notes)
        console.print(table)
        o = run["overall"]
        console.print(f"overall: p50 {o['p50_ms']:.3f} ms · recall@10 {o['turn_recall_at_10']:.3f} (first pass) "
                      f"vs full search alone {run['layers']['full']['turn_recall_at_10']:.3f}")

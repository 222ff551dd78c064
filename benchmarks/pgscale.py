"""`gieok bench scale --measure data`: stateless PostgreSQL workers (`pg_index = "database"`) at a
million blocks per tenant and a thousand tenants — issue 25's report in one run.

**Sizes.** The 100k subset and the full size are `bench pgstateless`'s schemas (generated bilingual
chat; vectors mixed from `base` real e5 passage vectors, `mixed_vectors`; a kept `--db` schema that
holds the size already is searched as it is). At each size a database-mode worker process opens
the memory cold and searches every query unscoped and in the largest channel (hybrid, k 10,
query vectors given: no embedding in the time); the in-process engine (`pg_index = "memory"`)
runs beside it up to `memory_up_to` blocks (loading a million rows into every worker is what the
database mode removes).

**Adds at size.** `adds` new blocks (vectors given, so no embedding) go into the full-size memory
as a server receives them — `add_many` calls of `ADD_BATCH` — with its HNSW graph in place, then
are forgotten again (their indices stay taken; the schema stays reusable: `ADDS_CHANNEL`).

**Agreement.** LoCoMo dev's conversations (real e5 vectors of every turn, cached) in a schema
beside `agreement_background` corpus blocks; every question searched by both modes, unscoped (the
background competes) and in its conversation's channel: turn recall@10 of each, their difference,
and how often the first hit is the same block.

**Tenants.** `bench pgstateless --tenants`'s round-robin of small tenants by two workers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.corpus import generate_messages
from benchmarks.embed_cache import EmbeddingCache, corpus_vectors, default_cache_dir
from benchmarks.fill import add_corpus, corpus_items
from benchmarks.locomo import _DIA, LocomoData, _score, _turn_item, bench_settings, load_locomo
from benchmarks.pgindex import mixed_vectors
from benchmarks.pgstateless import MODES, PreEmbedded, measure_pgstateless, print_pgstateless
from benchmarks.report import p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok import Memory
from gieok.errors import InvalidInputError
from gieok.store.urls import with_schema

__all__ = ["measure_data_scale", "run_data_scale", "SUBSET"]

SUBSET = 100_000  # blocks of the subset both modes are compared on
ADD_BATCH = 100  # items per add_many of the adds-at-size measurement
ADDS_CHANNEL = "bench-adds"


def measure_adds(location: str, n: int, base: int, cache_dir: Path | None) -> dict[str, Any]:
    """`n` adds into the memory at `location` (graph in place), then forgotten: adds per second."""
    messages = generate_messages(n, seed=25)
    with Memory(location, pg_index="database") as probe:
        real = corpus_vectors(probe.embedder, [m.text for m in generate_messages(base)], cache_dir)
        embedder = PreEmbedded(probe.embedder.name, probe.embedder.dimension)
    vectors, _ = mixed_vectors(real, base + n)
    vectors = vectors[base:]
    batch_ms: list[float] = []
    written: list[int] = []
    with Memory(location, pg_index="database", embedder=embedder) as memory:
        held = len(memory)
        with progress_bar(f"add {n:,} blocks into {held:,}", n) as advance:
            for start in range(0, n, ADD_BATCH):
                part = messages[start : start + ADD_BATCH]
                items = [{**item, "scope": {"channel": ADDS_CHANNEL}} for item in corpus_items(part)]
                t = time.perf_counter()
                blocks = memory.add_many(items, vectors=vectors[start : start + len(part)])
                batch_ms.append((time.perf_counter() - t) * 1000)
                written.extend(b.block_index for b in blocks)
                advance(len(part))
        t = time.perf_counter()
        memory.forget(written)
        forget_s = time.perf_counter() - t
    return {"adds": n, "into_blocks": held, "batch": ADD_BATCH, "adds_per_s": round(n / (sum(batch_ms) / 1000), 1),
            "batch_ms": p50_p95(batch_ms), "forget_s": round(forget_s, 3)}


def _agreement_memory(url: str, data: LocomoData, background: int, base: int,
                      cache_dir: Path | None) -> tuple[str, int]:
    """The schema of LoCoMo's turns after `background` corpus blocks: (its location, the block
    index of the first turn). A schema holding exactly that already is reused."""
    location = with_schema(url, f"bench_scale_agreement_{background}")
    total = background + len(data.turns)
    with Memory(location, pg_index="database", **bench_settings()) as memory:
        held = len(memory)
        if held not in (0, total):
            raise InvalidInputError(f"schema bench_scale_agreement_{background} holds {held:,} blocks, not "
                                    f"{total:,}: drop it (DROP SCHEMA … CASCADE) or give another --db")
        if held == 0:
            messages = generate_messages(background)
            real = corpus_vectors(memory.embedder, [m.text for m in messages[:base]], cache_dir)
            vectors, _ = mixed_vectors(real, background)
            items = [_turn_item(t) for t in data.turns]
            cache = EmbeddingCache(cache_dir or default_cache_dir(), memory.embedder.name)
            with progress_bar("LoCoMo turn vectors (cached per model)", len(items)) as advance:
                turn_vectors, _ = cache.get_or_embed(memory.passage_texts(items), memory.embedder, progress=advance)
            with memory.store.vector_index_deferred(), progress_bar(
                    f"fill {background:,} background blocks + {len(items):,} LoCoMo turns", total) as advance:
                add_corpus(memory, messages, vectors, advance, "fill-")
                memory.add_many(items, vectors=turn_vectors)
                advance(len(items))
        first = memory.get(background + 1)
        if (first.metadata or {}).get("dia_id") != data.turns[0].dia_id:
            raise InvalidInputError(f"schema bench_scale_agreement_{background} does not hold LoCoMo's turns "
                                    "where this benchmark put them: drop it")
    return location, background + 1


def measure_agreement(url: str, data_path: Path, background: int, base: int,
                      cache_dir: Path | None) -> dict[str, Any]:
    """Both modes on LoCoMo dev beside `background` corpus blocks (module docstring)."""
    data = load_locomo(data_path)
    location, first = _agreement_memory(url, data, background, base, cache_dir)
    dia_of = {first + i: t.dia_id for i, t in enumerate(data.turns)}
    with Memory(location, pg_index="database", **bench_settings()) as memory:
        cache = EmbeddingCache(cache_dir or default_cache_dir(), memory.embedder.name)
        questions = [q.question for q in data.questions]
        with progress_bar("question vectors (cached per model)", len(questions)) as advance:
            query_vectors, _ = cache.get_or_compute(
                questions, "query", lambda texts: np.stack([memory.embedder.embed_query(t) for t in texts]),
                progress=advance)
    ranked: dict[str, dict[str, list[list[int]]]] = {}
    for mode in MODES:
        with Memory(location, pg_index=mode, **bench_settings()) as memory:
            ranked[mode] = {"all": [], "channel": []}
            with progress_bar(f"LoCoMo questions, pg_index = {mode}", len(questions)) as advance:
                for q, vector in zip(data.questions, query_vectors):
                    for where, scope in (("all", None), ("channel", {"channel": q.conversation})):
                        result = memory.search(q.question, 10, scope=scope, layers=False, query_vector=vector)
                        ranked[mode][where].append([h.block.block_index for h in result.hits])
                    advance()
    out: dict[str, Any] = {"questions": len(questions), "background_blocks": background, "turns": len(data.turns)}
    for where in ("all", "channel"):
        recall = {}
        for mode in MODES:
            scores = []
            for q, hits in zip(data.questions, ranked[mode][where]):
                dias = [dia_of[i] for i in hits if i in dia_of]
                sessions = [int(_DIA.match(d).group(1)) for d in dias]  # type: ignore[union-attr]
                scores.append(_score(q, dias, sessions, 10)[0])
            recall[mode] = round(float(np.mean(scores)), 4)
        pairs = list(zip(ranked["memory"][where], ranked["database"][where]))
        out[where] = {
            "turn_recall_10": recall,
            "turn_recall_10_delta": round(recall["database"] - recall["memory"], 4),
            "top1_same": round(float(np.mean([bool(a and b and a[0] == b[0]) for a, b in pairs])), 4),
            "top10_overlap": round(float(np.mean([len(set(a) & set(b)) / max(1, len(a)) for a, b in pairs])), 4),
        }
    return out


def measure_data_scale(url: str, *, blocks: int, tenants: int, tenant_blocks: int = 20, base: int = 1000,
                       queries: int = 40, adds: int = 2000, memory_up_to: int = SUBSET,
                       locomo: Path | None = None, cache_dir: Path | None = None) -> dict[str, Any]:
    """Issue 25's report (module docstring); the subset, the in-process comparison and LoCoMo's
    background are `SUBSET` blocks, or all of them when `blocks` is smaller."""
    subset = min(SUBSET, blocks)
    sizes = sorted({subset, blocks})
    report = measure_pgstateless(url, sizes, base=base, queries=queries, cache_dir=cache_dir, tenants=tenants,
                                 tenant_blocks=tenant_blocks, memory_up_to=memory_up_to)
    report["fill_adds_per_s"] = report["sizes"][-1]["adds_per_s"]  # the bulk fill, graph built after (None: reused)
    if adds:
        report["adds"] = measure_adds(with_schema(url, f"bench_stateless_{blocks}"), adds, base, cache_dir)
        report["adds_per_s"] = report["adds"]["adds_per_s"]  # the key: adds into the full-size memory
    if locomo is not None:
        agreement = measure_agreement(url, locomo, subset, base, cache_dir)
        report["agreement"] = {
            "turn_recall_10_delta": agreement["all"]["turn_recall_10_delta"],
            "top1_same": agreement["all"]["top1_same"], "locomo": agreement,
            "corpus": report.get("agreement", {}),  # the corpus queries' top-1 agreement (bench pgstateless)
        }
    return report


def print_data_scale(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    print_pgstateless(report, console)
    if "adds" in report:
        a = report["adds"]
        console.print(f"adds into {a['into_blocks']:,} blocks: {a['adds_per_s']:.1f}/s "
                      f"({a['batch']} per add_many, p50 {a['batch_ms']['p50']:.0f} ms); forgotten again in "
                      f"{a['forget_s']:.1f} s")
    locomo = report.get("agreement", {}).get("locomo")
    if locomo:
        table = results_table(f"LoCoMo dev ({locomo['questions']} questions) beside {locomo['background_blocks']:,} "
                              "blocks: in-process vs database", ("searched", "recall@10 memory", "recall@10 database",
                                                                 "delta", "top-1 same", "top-10 overlap"),
                              left=("searched",))
        for where, label in (("all", "unscoped"), ("channel", "in its channel")):
            r = locomo[where]
            table.add_row(label, f"{r['turn_recall_10']['memory']:.4f}", f"{r['turn_recall_10']['database']:.4f}",
                          f"{r['turn_recall_10_delta']:+.4f}", f"{r['top1_same']:.3f}", f"{r['top10_overlap']:.3f}")
        console.print(table)


def run_data_scale(url: str, json_out: Path | None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_data_scale(url, **options), print_data_scale, json_out)


"""`gieok bench locomo`: evidence recall on LoCoMo-format conversations, no LLM involved.

Every conversation goes into one store as its own channel, one block per turn. For each
question with evidence naming a turn, search within its conversation and count how many
of its evidence turns (and their sessions) appear in the top k.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.embed_cache import EmbeddingCache
from benchmarks.fill import bench_location, bench_target, bench_workdir, fresh_memory
from benchmarks.report import median, print_and_write, progress_bar, results_table, table_console
from gieok.errors import InvalidInputError
from gieok.memory import Memory
from gieok.retrieval.passages import SPEAKER_NAME_KEY
from gieok.text.tokenize import Tokenizer, TokenizerOptions

__all__ = ["LocomoData", "ingest_as_bot", "load_locomo", "measure_locomo", "print_locomo", "run_locomo",
           "search_stage_shares"]

_DIA = re.compile(r"^D(\d+):(\d+)$")
ADD_BATCH = 4096  # turns per add_many: its embedding runs ahead of its commits, on every engine


@dataclass
class Turn:
    conversation: str
    dia_id: str
    session: int
    text: str
    speaker: str
    event_time: float


@dataclass
class Question:
    conversation: str
    question: str
    category: str
    evidence: list[str]  # dia ids that name a turn
    sessions: set[int] = field(default_factory=set)
    paraphrase: bool = False  # worded apart from its evidence turn (the Korean dev set marks these)


@dataclass
class LocomoData:
    turns: list[Turn]
    questions: list[Question]
    skipped_questions: int


def _parse_session_time(value: str | None) -> float:
    if not value:
        return 0.0
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return 0.0


def load_locomo(path: str | Path) -> LocomoData:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"LoCoMo file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{path} is not JSON: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, list):
        raise InvalidInputError(f"{path}: expected a list of conversations")
    try:
        return _parse_locomo(raw)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        if isinstance(exc, InvalidInputError):
            raise
        raise InvalidInputError(f"{path} is not LoCoMo JSON ({type(exc).__name__}: {exc}): expected a list of "
                                '{"sample_id", "conversation": {"session_N": [turns], "session_N_date_time"}, '
                                '"qa": [...]}') from None


def _parse_locomo(raw: list[Any]) -> LocomoData:
    turns: list[Turn] = []
    questions: list[Question] = []
    skipped = 0
    for sample in raw:
        conv_id = str(sample.get("sample_id"))
        conv = sample["conversation"]
        known: dict[str, int] = {}
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        for n in numbers:
            base = _parse_session_time(conv.get(f"session_{n}_date_time"))
            for offset, turn in enumerate(conv[f"session_{n}"]):
                text = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [image: {turn['blip_caption']}]"
                turns.append(Turn(conv_id, turn["dia_id"], n, text, turn["speaker"], base + offset))
                known[turn["dia_id"]] = n
        for qa in sample.get("qa", []):
            evidence = [e for e in qa.get("evidence", []) if isinstance(e, str) and _DIA.match(e) and e in known]
            if not evidence:
                skipped += 1
                continue
            questions.append(Question(conv_id, str(qa["question"]), str(qa.get("category")), evidence,
                                      {known[e] for e in evidence}, qa.get("paraphrase") is True))
    return LocomoData(turns, questions, skipped)


def _score(question: Question, ranked_dia: list[str], ranked_sessions: list[int], k: int) -> tuple[float, float]:
    top = set(ranked_dia[:k])
    turn = sum(1 for e in question.evidence if e in top) / len(question.evidence)
    sessions = set(ranked_sessions[:k])
    session = sum(1 for s in question.sessions if s in sessions) / len(question.sessions)
    return turn, session


def bench_settings(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Settings of a LoCoMo-format run: session times are read as UTC (the files give local
    times without a zone), so dates named in questions are resolved in UTC too."""
    return {"timezone": "UTC", **dict(overrides or {})}


def _system_report(per_question: list[tuple[Question, dict[int, tuple[float, float]]]],
                   ks: list[int]) -> dict[str, Any]:
    turn_recall = {str(k): float(np.mean([r[k][0] for _, r in per_question])) for k in ks}
    session_recall = {str(k): float(np.mean([r[k][1] for _, r in per_question])) for k in ks}
    by_category: dict[str, dict[str, float]] = {}
    for cat in sorted({q.category for q, _ in per_question}):
        rows = [r for q, r in per_question if q.category == cat]
        by_category[cat] = {str(k): float(np.mean([r[k][0] for r in rows])) for k in ks}
    report: dict[str, Any] = {"turn_recall": turn_recall, "session_recall": session_recall,
                              "by_category": by_category}
    paraphrased = [r for q, r in per_question if q.paraphrase]
    if paraphrased:  # turn recall of the questions that share few words with their evidence
        report["paraphrase"] = {str(k): float(np.mean([r[k][0] for r in paraphrased])) for k in ks}
    return report


def _add_turns(memory: Memory, turns: list[Turn], vectors: np.ndarray | None, batch: int,
               item: Callable[[Turn], dict[str, Any]], advance: Callable[[int], None] | None = None) -> dict[int, str]:
    """Store the turns `batch` at a time, one block each; returns block index -> turn id."""
    dia_of: dict[int, str] = {}
    for start in range(0, len(turns), batch):
        part = turns[start : start + batch]
        written = memory.add_many([item(t) for t in part],
                                  vectors=vectors[start : start + batch] if vectors is not None else None,
                                  progress=advance)
        for turn, block in zip(part, written):
            dia_of[block.block_index] = turn.dia_id
    return dia_of


def _turn_item(turn: Turn) -> dict[str, Any]:
    return {"text": turn.text, "scope": {"channel": turn.conversation}, "speaker": turn.speaker,
            "event_time": turn.event_time, "metadata": {"dia_id": turn.dia_id}}


def _ingest(memory: Memory, data: LocomoData,
            embed_cache: Path | None) -> tuple[dict[int, str], np.ndarray | None, float]:
    """Every turn into the store (passage vectors from `embed_cache` if given):
    (block index -> turn id, the vectors read from the cache, seconds taken)."""
    texts = memory.passage_texts([_turn_item(t) for t in data.turns])  # what add_many would embed
    started = time.perf_counter()
    with progress_bar("ingest turns", len(texts)) as advance:
        if embed_cache is not None:
            cache = EmbeddingCache(embed_cache, memory.embedder.name)
            vectors, _ = cache.get_or_embed(texts, memory.embedder)
        else:
            vectors = None
        dia_of = _add_turns(memory, data.turns, vectors, ADD_BATCH, _turn_item, advance)
    return dia_of, vectors, time.perf_counter() - started


def _embed_questions(memory: Memory, questions: list[Question],
                     embed_cache: Path | None = None) -> tuple[list[np.ndarray], list[float]]:
    """Query vectors of the questions (each embedded alone, as a search does), and the ms each
    took to embed; with `embed_cache`, vectors computed by an earlier run are read back and no
    time is reported for them."""
    embed_ms: list[float] = []

    def embed(texts: Sequence[str]) -> np.ndarray:
        out = []
        for text in texts:
            t0 = time.perf_counter()
            out.append(memory.embedder.embed_query(text))
            embed_ms.append((time.perf_counter() - t0) * 1000)
            advance()
        return np.stack(out)

    texts = [q.question for q in questions]
    with progress_bar("embed questions", len(texts)) as advance:
        if embed_cache is None:
            vectors = embed(texts)
        else:
            cache = EmbeddingCache(embed_cache, memory.embedder.name)
            vectors, cached = cache.get_or_compute(texts, "query", embed, batch=len(texts) or 1)
            if cached:
                advance(len(texts))
    return list(vectors), embed_ms


def _recall_by_system(memory: Memory, data: LocomoData, query_vectors: list[np.ndarray], ks: list[int],
                      dia_of: dict[int, str], modes: tuple[tuple[str, str], ...] = (
                          ("gieok", "hybrid"), ("bm25", "bm25"), ("vector", "vector")),
                      speaker_names: Mapping[str, str] | None = None,
                      stage_ms: dict[str, list[float]] | None = None,
                      ) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """Turn and session recall@k of hybrid search (gieok), BM25 alone and vectors alone; and
    the hybrid search's ms per question (query vectors ready). `speaker_names` goes to every
    search (see Memory.search); `stage_ms`, when given, collects each stage's ms of every
    hybrid search (its `timings_ms`)."""
    kmax = max(ks)
    systems: dict[str, dict[str, Any]] = {}
    search_ms: list[float] = []
    for system, mode in modes:
        per_question = []
        with progress_bar(f"search {system}", len(data.questions)) as advance:
            for q, qv in zip(data.questions, query_vectors):
                result = memory.search(q.question, kmax, scope={"channel": q.conversation}, mode=mode,
                                       neighbours=(mode == "hybrid"), layers=False,
                                       query_vector=qv if mode != "bm25" else None, speaker_names=speaker_names)
                if system == "gieok":
                    search_ms.append(result.search_time_ms)
                    for stage, ms in result.timings_ms.items():
                        if stage_ms is not None:
                            stage_ms.setdefault(stage, []).append(ms)
                ranked = [dia_of[h.block.block_index] for h in result.hits]
                sessions = [int(_DIA.match(d).group(1)) for d in ranked]  # type: ignore[union-attr]
                per_question.append((q, {k: _score(q, ranked, sessions, k) for k in ks}))
                advance()
        systems[system] = _system_report(per_question, ks)
    return systems, search_ms


def measure_locomo(data_path: str | Path, ks: list[int], *, db_dir: str | Path | None = None,
                   embed_cache: Path | None = None, ablation: bool = False,
                   settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_locomo(data_path)
    target = bench_target("locomo", None if db_dir is None else str(db_dir))  # a directory, or a PostgreSQL URL
    memory = fresh_memory(bench_location(target, "locomo.db"), **bench_settings(settings_overrides))
    workdir = target if isinstance(target, Path) else bench_workdir("locomo")  # the ablation's files
    try:
        dia_of, vectors, ingest_seconds = _ingest(memory, data, embed_cache)
        query_vectors, embed_ms = _embed_questions(memory, data.questions, embed_cache)
        stage_ms: dict[str, list[float]] = {}
        systems, search_ms = _recall_by_system(memory, data, query_vectors, ks, dia_of, stage_ms=stage_ms)
        report: dict[str, Any] = {
            "questions": len(data.questions),
            "systems": systems,
            "ingest_seconds": round(ingest_seconds, 3),
            "search_ms_p50": round(median(search_ms), 3),
            "search_stages": search_stage_shares(stage_ms, search_ms),
        }
        ablation_rows = _tokenizer_ablation(data, memory, ks, workdir, vectors) if ablation else None
        if ablation:
            report["ranking_ablation"] = _ranking_ablation(bench_location(target, "locomo.db"), data, query_vectors,
                                                           ks, dia_of, settings_overrides)
            for names_in_vectors in (True, False):
                report["ranking_ablation"].update(_bot_storage_ablation(
                    bench_location(target, f"locomo-bot{'-named' if names_in_vectors else ''}.db"), data,
                    query_vectors, ks, embed_cache, settings_overrides, names_in_vectors=names_in_vectors))
    finally:
        memory.close()
    return {**report, "_ks": list(ks), "_turns": len(data.turns), "_skipped_questions": data.skipped_questions,
            "_embed_p50_ms": median(embed_ms) if embed_ms else None, "_cached": embed_cache is not None,
            "_ablation": ablation_rows}


def search_stage_shares(stage_ms: Mapping[str, Sequence[float]], search_ms: Sequence[float]) -> dict[str, Any]:
    """Each stage's mean ms and its share of the whole search time (summed over the questions);
    "other" is what no stage timed (reading the hits from the store, dropping repeats, the lock).
    Stages that took no time (the query embedding, when the vectors were given) are left out."""
    total = float(sum(search_ms))
    shares: dict[str, Any] = {}
    for stage, values in sorted(stage_ms.items()):
        if sum(values) > 0:
            shares[stage.removesuffix("_ms")] = {"ms_mean": round(float(np.mean(values)), 4),
                                                 "share": round(sum(values) / total, 4) if total else 0.0}
    timed = sum(sum(v) for k, v in stage_ms.items() if k.removesuffix("_ms") in shares)
    if total:
        shares["other"] = {"ms_mean": round((total - timed) / len(search_ms), 4),
                           "share": round(max(0.0, total - timed) / total, 4)}
    return shares


# The ranking steps `--ablation` undoes, newest first: each row is the hybrid search with the
# settings of the step before (the learned ranker off; then the neighbour spreading it replaced).
RANKING_STEPS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fusion (ranker = fusion)", {"ranker": "fusion"}),
    ("fusion, 40 neighbour sources (before the learned ranker)", {"ranker": "fusion", "neighbour_sources": 40}),
)


def _ranking_ablation(location: Path | str, data: LocomoData, query_vectors: list[np.ndarray], ks: list[int],
                      dia_of: dict[int, str], overrides: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The same stored conversations ranked with earlier ranking settings (RANKING_STEPS)."""
    rows = {}
    for label, step in RANKING_STEPS:
        with Memory(location, **bench_settings({**dict(overrides or {}), **step})) as other:
            systems, _ = _recall_by_system(other, data, query_vectors, ks, dia_of, modes=((label, "hybrid"),))
        rows[label] = systems[label]
    return rows


BOT_STORAGE = "bot storage: names only in the metadata for the vectors, names passed (the bot now)"
BOT_STORAGE_NAME_FREE_VECTORS = "bot storage, vectors without names, names passed"
BOT_STORAGE_NO_NAMES = "bot storage, no names anywhere (the bot before)"


def ingest_as_bot(memory: Memory, data: LocomoData, embed_cache: Path | None,
                  names_in_vectors: bool = True) -> tuple[dict[int, str], dict[str, str]]:
    """The conversations stored as the chat bot stores them: a turn's text without its
    speaker's name and the speaker as a user id (display names are kept out of the text and the
    speaker field). `names_in_vectors`: the name in the metadata's `speaker_name`, which only
    the passage vector reads (the bot does this now). Returns block index -> turn id, and user
    id -> name (what the bot's recall passes as `speaker_names`)."""
    ids = {name: f"u{i}" for i, name in enumerate(sorted({t.speaker for t in data.turns}))}

    def item(turn: Turn) -> dict[str, Any]:
        prefix = f"{turn.speaker}: "
        text = turn.text[len(prefix):] if turn.text.startswith(prefix) else turn.text
        metadata: dict[str, Any] = {"dia_id": turn.dia_id}
        if names_in_vectors:
            metadata[SPEAKER_NAME_KEY] = turn.speaker
        return {"text": text, "scope": {"channel": turn.conversation}, "speaker": ids[turn.speaker],
                "event_time": turn.event_time, "metadata": metadata}

    vectors = None
    if embed_cache is not None:
        texts = memory.passage_texts([item(t) for t in data.turns])
        with progress_bar("embed turns as the bot stores them", len(texts)) as advance:
            vectors, _ = EmbeddingCache(embed_cache, memory.embedder.name).get_or_embed(
                texts, memory.embedder, progress=advance)
    with progress_bar("ingest turns as the bot stores them", len(data.turns)) as advance:
        dia_of = _add_turns(memory, data.turns, vectors, ADD_BATCH, item, advance)
    return dia_of, {uid: name for name, uid in ids.items()}


def _bot_storage_ablation(location: Path | str, data: LocomoData, query_vectors: list[np.ndarray], ks: list[int],
                          embed_cache: Path | None, overrides: dict[str, Any] | None,
                          names_in_vectors: bool) -> dict[str, dict[str, Any]]:
    """Recall with the conversations stored the bot's way (`ingest_as_bot`): with names in the
    vectors, searched with the names passed as `speaker_names`, as the bot's recall does;
    otherwise vectors without names, searched with and without the names passed."""
    rows: dict[str, dict[str, Any]] = {}
    with fresh_memory(location, **bench_settings(overrides)) as memory:
        dia_of, names = ingest_as_bot(memory, data, embed_cache, names_in_vectors)
        runs = ((BOT_STORAGE, names),) if names_in_vectors else (
            (BOT_STORAGE_NAME_FREE_VECTORS, names), (BOT_STORAGE_NO_NAMES, None))
        for label, known in runs:
            systems, _ = _recall_by_system(memory, data, query_vectors, ks, dia_of, modes=((label, "hybrid"),),
                                           speaker_names=known)
            rows[label] = systems[label]
    return rows


def _tokenizer_ablation(data: LocomoData, memory: Memory, ks: list[int], workdir: Path,
                        vectors: np.ndarray | None) -> list[tuple[str, dict[str, float]]]:
    """BM25 alone under each tokenizer variant: what each text step is worth."""
    if vectors is None:
        vectors = memory.store.load_index_rows(0, memory.embedder.dimension).vectors
    variants = [
        ("plain", TokenizerOptions(stem=False, stopwords=False)),
        ("+stopwords", TokenizerOptions(stem=False, stopwords=True)),
        ("+stem", TokenizerOptions(stem=True, stopwords=False)),
        ("+stem +stopwords", TokenizerOptions(stem=True, stopwords=True)),
    ]
    rows = []
    for label, options in variants:
        path = workdir / f"ablation-{label.strip('+').replace(' +', '-')}.db"
        with fresh_memory(path, tokenizer=Tokenizer(options)) as m:
            index_of = _add_turns(m, data.turns, vectors, 512,
                                  lambda t: {"text": t.text, "scope": {"channel": t.conversation}})
            scores: dict[int, list[float]] = {k: [] for k in ks}
            for q in data.questions:
                result = m.search(q.question, max(ks), scope={"channel": q.conversation}, mode="bm25", layers=False)
                ranked = [index_of[h.block.block_index] for h in result.hits]
                for k in ks:
                    scores[k].append(_score(q, ranked, [], k)[0])
        rows.append((label, {str(k): float(np.mean(v)) for k, v in scores.items()}))
    return rows


def _recall_table(title: str, first: str, ks: list[int]) -> Table:
    """A table with a left column `first`, then one right-aligned column per k."""
    return results_table(title, (first, *(f"@{k}" for k in ks)), left=(first,))


def print_locomo(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    ks = report["_ks"]
    table = results_table(f"LoCoMo evidence recall — {report['questions']} questions "
                          f"({report['_skipped_questions']} without a turn id skipped), {report['_turns']} turns",
                          ("system", *(f"turn@{k}" for k in ks), *(f"session@{k}" for k in ks)), left=("system",))
    for name, sysrep in report["systems"].items():
        table.add_row(name, *[f"{sysrep['turn_recall'][str(k)]:.3f}" for k in ks],
                      *[f"{sysrep['session_recall'][str(k)]:.3f}" for k in ks])
    out.print(table)
    cats = _recall_table("turn recall by category (gieok / bm25 / vector)", "category", ks)
    for cat in report["systems"]["gieok"]["by_category"]:
        cats.add_row(cat, *[
            " / ".join(f"{report['systems'][s]['by_category'][cat][str(k)]:.3f}" for s in ("gieok", "bm25", "vector"))
            for k in ks
        ])
    if "paraphrase" in report["systems"]["gieok"]:
        cats.add_row("paraphrased", *[
            " / ".join(f"{report['systems'][s]['paraphrase'][str(k)]:.3f}" for s in ("gieok", "bm25", "vector"))
            for k in ks
        ])
    out.print(cats)
    if report.get("ranking_ablation"):
        ranking = results_table("ranking ablation: the hybrid search with earlier ranking settings",
                                ("ranking", *(f"turn@{k}" for k in ks), *(f"session@{k}" for k in ks)),
                                left=("ranking",))
        rows = {"gieok (learned ranker)": report["systems"]["gieok"], **report["ranking_ablation"]}
        for label, sysrep in rows.items():
            ranking.add_row(label, *[f"{sysrep['turn_recall'][str(k)]:.3f}" for k in ks],
                            *[f"{sysrep['session_recall'][str(k)]:.3f}" for k in ks])
        out.print(ranking)
    if report["_ablation"]:
        ab = _recall_table("tokenizer ablation: BM25 alone, turn recall", "tokenizer", ks)
        for label, values in report["_ablation"]:
            ab.add_row(label, *[f"{values[str(k)]:.3f}" for k in ks])
        out.print(ab)
    if report.get("search_stages"):
        out.print("search time by stage (share of the hybrid search, mean ms): " + " · ".join(
            f"{stage} {row['share']:.0%} ({row['ms_mean']:.3f})" for stage, row in report["search_stages"].items()))
    out.print(f"ingest {report['ingest_seconds']:.1f} s{' (embeddings from cache)' if report['_cached'] else ''} · "
              f"search p50 {report['search_ms_p50']:.2f} ms without query embedding · "
              + (f"query embedding p50 {report['_embed_p50_ms']:.2f} ms" if report["_embed_p50_ms"] is not None
                 else "query embeddings from cache"))


def run_locomo(data_path: str | Path, ks: list[int], json_out: str | Path | None = None, *,
               db_dir: str | Path | None = None, embed_cache: Path | None = None, ablation: bool = False,
               settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    report = measure_locomo(data_path, ks, db_dir=db_dir, embed_cache=embed_cache, ablation=ablation,
                            settings_overrides=settings_overrides)
    return print_and_write(report, print_locomo, json_out)

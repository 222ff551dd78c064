"""`gieok bench locomo`: evidence recall on LoCoMo-format conversations, no LLM involved.

Every conversation goes into one store as its own channel, one block per turn. For each
question with evidence naming a turn, search within its conversation and count how many
of its evidence turns (and their sessions) appear in the top k.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from ..errors import InvalidInputError
from ..memory import Memory, remove_memory_files
from ..text.tokenize import Tokenizer, TokenizerOptions
from .embed_cache import EmbeddingCache
from .report import median, progress_bar, write_json

__all__ = ["LocomoData", "load_locomo", "run_locomo"]

_DIA = re.compile(r"^D(\d+):(\d+)$")


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
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=timezone.utc).timestamp()
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
    if not isinstance(raw, list):
        raise InvalidInputError(f"{path}: expected a list of conversations")
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
                                      {known[e] for e in evidence}))
    return LocomoData(turns, questions, skipped)


def _score(question: Question, ranked_dia: list[str], ranked_sessions: list[int], k: int) -> tuple[float, float]:
    top = set(ranked_dia[:k])
    turn = sum(1 for e in question.evidence if e in top) / len(question.evidence)
    sessions = set(ranked_sessions[:k])
    session = sum(1 for s in question.sessions if s in sessions) / len(question.sessions)
    return turn, session


def _system_report(per_question: list[tuple[Question, dict[int, tuple[float, float]]]], ks: list[int]) -> dict[str, Any]:
    turn_recall = {str(k): float(np.mean([r[k][0] for _, r in per_question])) for k in ks}
    session_recall = {str(k): float(np.mean([r[k][1] for _, r in per_question])) for k in ks}
    by_category: dict[str, dict[str, float]] = {}
    for cat in sorted({q.category for q, _ in per_question}):
        rows = [r for q, r in per_question if q.category == cat]
        by_category[cat] = {str(k): float(np.mean([r[k][0] for r in rows])) for k in ks}
    return {"turn_recall": turn_recall, "session_recall": session_recall, "by_category": by_category}


def run_locomo(data_path: str | Path, ks: list[int], json_out: str | Path | None = None, *,
               db_dir: str | Path | None = None, embed_cache: Path | None = None, ablation: bool = False,
               settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_locomo(data_path)
    kmax = max(ks)
    workdir = Path(db_dir) if db_dir else Path(tempfile.mkdtemp(prefix="gieok-locomo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db_path = workdir / "locomo.db"
    remove_memory_files(db_path)
    overrides = dict(settings_overrides or {})
    memory = Memory(db_path, **overrides)
    try:
        texts = [t.text for t in data.turns]
        started = time.perf_counter()
        with progress_bar("ingest turns", len(texts)) as advance:
            if embed_cache is not None:
                cache = EmbeddingCache(embed_cache, memory.embedder.name)
                vectors, _ = cache.get_or_compute(texts, "passage", memory.embedder.inner.embed_passages)
            else:
                vectors = None
            blocks_by_dia: dict[tuple[str, str], int] = {}
            chunk = 256
            for start in range(0, len(data.turns), chunk):
                part = data.turns[start : start + chunk]
                items = [dict(text=t.text, scope={"channel": t.conversation}, speaker=t.speaker,
                              event_time=t.event_time, metadata={"dia_id": t.dia_id}) for t in part]
                written = memory.add_many(items, vectors=vectors[start : start + chunk] if vectors is not None else None)
                for turn, block in zip(part, written):
                    blocks_by_dia[(turn.conversation, turn.dia_id)] = block.block_index
                advance(len(part))
        ingest_seconds = time.perf_counter() - started
        dia_of = {bi: dia for (_, dia), bi in blocks_by_dia.items()}

        query_vectors = []
        embed_ms = []
        with progress_bar("embed questions", len(data.questions)) as advance:
            for q in data.questions:
                t0 = time.perf_counter()
                query_vectors.append(memory.embedder.embed_query(q.question))
                embed_ms.append((time.perf_counter() - t0) * 1000)
                advance()

        systems: dict[str, dict[str, Any]] = {}
        search_ms: list[float] = []
        for system, mode in (("gieok", "hybrid"), ("bm25", "bm25"), ("vector", "vector")):
            per_question = []
            with progress_bar(f"search {system}", len(data.questions)) as advance:
                for q, qv in zip(data.questions, query_vectors):
                    result = memory.search(q.question, kmax, scope={"channel": q.conversation}, mode=mode,
                                           neighbours=(mode == "hybrid"), layers=False,
                                           query_vector=qv if mode != "bm25" else None)
                    if system == "gieok":
                        search_ms.append(result.search_time_ms)
                    ranked = [dia_of[h.block.block_index] for h in result.hits]
                    sessions = [int(_DIA.match(d).group(1)) for d in ranked]  # type: ignore[union-attr]
                    per_question.append((q, {k: _score(q, ranked, sessions, k) for k in ks}))
                    advance()
            systems[system] = _system_report(per_question, ks)
        report: dict[str, Any] = {
            "questions": len(data.questions),
            "systems": systems,
            "ingest_seconds": round(ingest_seconds, 3),
            "search_ms_p50": round(median(search_ms), 3),
        }
        ablation_rows = _tokenizer_ablation(data, memory, ks, workdir, vectors) if ablation else None
    finally:
        memory.close()
    _print(report, ks, data, median(embed_ms), embed_cache is not None, ablation_rows)
    write_json(json_out, report)
    return report


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
        remove_memory_files(path)
        with Memory(path, tokenizer=Tokenizer(options)) as m:
            index_of: dict[int, str] = {}
            for start in range(0, len(data.turns), 512):
                part = data.turns[start : start + 512]
                written = m.add_many([{"text": t.text, "scope": {"channel": t.conversation}} for t in part],
                                     vectors=vectors[start : start + 512])
                for turn, block in zip(part, written):
                    index_of[block.block_index] = turn.dia_id
            scores = {k: [] for k in ks}
            for q in data.questions:
                result = m.search(q.question, max(ks), scope={"channel": q.conversation}, mode="bm25", layers=False)
                ranked = [index_of[h.block.block_index] for h in result.hits]
                for k in ks:
                    scores[k].append(_score(q, ranked, [], k)[0])
        rows.append((label, {str(k): float(np.mean(v)) for k, v in scores.items()}))
    return rows


def _print(report: dict[str, Any], ks: list[int], data: LocomoData, embed_p50: float, cached: bool,
           ablation_rows: list[tuple[str, dict[str, float]]] | None) -> None:
    from rich.console import Console

    out = Console(width=160)
    table = Table(title=f"LoCoMo evidence recall — {report['questions']} questions "
                        f"({data.skipped_questions} without a turn id skipped), {len(data.turns)} turns")
    table.add_column("system")
    for k in ks:
        table.add_column(f"turn@{k}", justify="right")
    for k in ks:
        table.add_column(f"session@{k}", justify="right")
    for name, sysrep in report["systems"].items():
        table.add_row(name, *[f"{sysrep['turn_recall'][str(k)]:.3f}" for k in ks],
                      *[f"{sysrep['session_recall'][str(k)]:.3f}" for k in ks])
    out.print(table)
    cats = Table(title="turn recall by category (gieok / bm25 / vector)")
    cats.add_column("category")
    for k in ks:
        cats.add_column(f"@{k}", justify="right")
    for cat in report["systems"]["gieok"]["by_category"]:
        cats.add_row(cat, *[
            " / ".join(f"{report['systems'][s]['by_category'][cat][str(k)]:.3f}" for s in ("gieok", "bm25", "vector"))
            for k in ks
        ])
    out.print(cats)
    if ablation_rows:
        ab = Table(title="tokenizer ablation: BM25 alone, turn recall")
        ab.add_column("tokenizer")
        for k in ks:
            ab.add_column(f"@{k}", justify="right")
        for label, values in ablation_rows:
            ab.add_row(label, *[f"{values[str(k)]:.3f}" for k in ks])
        out.print(ab)
    out.print(f"ingest {report['ingest_seconds']:.1f} s{' (embeddings from cache)' if cached else ''} · "
              f"search p50 {report['search_ms_p50']:.2f} ms without query embedding · "
              f"query embedding p50 {embed_p50:.2f} ms")

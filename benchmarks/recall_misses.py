"""`python -m benchmarks.recall_misses`: why LoCoMo evidence turns miss the hybrid top 10.

The conversations are stored and the questions embedded exactly as `gieok bench locomo` does
(its loading and ingestion, imported). For every evidence turn of a question that is not in the
top 10 it records where the turn ranks in a deep list (hybrid, BM25 alone, vectors alone), whether
the top 10 found another evidence turn of the same question in another session, how many of the
top 10 are neighbours of a found evidence turn, and how many of the turn's words the question
shares; then it counts, per LoCoMo category, the causes those facts point to. Multi-hop evidence
is spread over sessions, so these numbers say which change could bring it back: a cap on one
session's share of the top 10, a second round with the first round's words, or neither.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fill import bench_location, bench_target, fresh_memory
from benchmarks.locomo import LocomoData, Question, _embed_questions, _ingest, bench_settings, load_locomo
from benchmarks.report import median, print_and_write, results_table, table_console
from gieok.errors import InvalidInputError
from gieok.memory import Memory
from gieok.text.tokenize import Tokenizer

__all__ = ["CAUSES", "Analysis", "MissedTurn", "classify_misses", "main", "measure_misses", "run_recall_misses"]

TOP = 10  # the cut whose misses are explained
DEEP = 200  # how deep each system's list is read to find a missed turn's rank
NEIGHBOUR_TURNS = 3  # a top-10 hit this close to a found evidence turn (same session) crowds it
CATEGORY_NAMES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}
CAUSES = ("wrong session", "crowded out by neighbours", "vocabulary mismatch", "ranked 11–50", "ranked 51–200",
          "not in top 200")
_CAUSE_COLUMNS = ("wrong session", "crowded", "no shared word", "11–50", "51–200", ">200")
_DIA = re.compile(r"^D(\d+):(\d+)$")


@dataclass(frozen=True)
class MissedTurn:
    """One evidence turn of a question that the hybrid top 10 did not hold, and why it may not."""

    conversation: str
    question: str
    category: str
    dia_id: str
    hybrid_rank: int | None  # 1-based in the hybrid search's top DEEP; None: deeper
    bm25_rank: int | None
    vector_rank: int | None
    other_evidence_found: bool  # the top 10 holds another evidence turn of the same question
    other_session: bool  # ...and this turn's session is none of those found turns' sessions
    crowding: int  # top-10 hits (not evidence) within NEIGHBOUR_TURNS of a found evidence turn, same session
    overlap: float  # share of the turn's content tokens (speaker name left out) that occur in the question

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes these facts point to; one turn can have several, or none (ranked 1–10 in the
        deep list: a deeper candidate pool reordered the top)."""
        found: list[str] = []
        if self.other_session:
            found.append("wrong session")
        # crowded out: had the found turn's neighbours not taken those places, it would be in the top 10
        if self.crowding and self.hybrid_rank is not None and self.hybrid_rank <= TOP + self.crowding:
            found.append("crowded out by neighbours")
        # no content word in common: true of 52 % of the missed evidence turns of LoCoMo dev5 and
        # 13 % of the found ones; any shared word is already a BM25 match, so no threshold above 0
        if self.overlap == 0.0:
            found.append("vocabulary mismatch")
        if self.hybrid_rank is None:
            found.append("not in top 200")
        elif 11 <= self.hybrid_rank <= 50:
            found.append("ranked 11–50")
        elif self.hybrid_rank > 50:
            found.append("ranked 51–200")
        return tuple(found)


def _position(dia_id: str) -> tuple[int, int]:
    """(session, turn) of a LoCoMo dia id such as "D3:12"."""
    match = _DIA.match(dia_id)
    if match is None:
        raise InvalidInputError(f"not a LoCoMo turn id: {dia_id!r}")
    return int(match.group(1)), int(match.group(2))


def _utterance(text: str, speaker: str) -> str:
    """A stored turn's words without the "Speaker: " prefix the benchmark writes (a question that
    names the speaker would otherwise always share a word with every turn of theirs)."""
    prefix = f"{speaker}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def word_overlap(tokenizer: Tokenizer, question: str, turn_text: str) -> float:
    """Share of the turn's distinct content tokens (the memory's tokenizer: stems, no stop words,
    Korean lemmas) that occur in the question; 0.0 for a turn without content tokens."""
    turn_tokens = set(tokenizer.tokens(turn_text))
    if not turn_tokens:
        return 0.0
    return len(turn_tokens & set(tokenizer.tokens(question))) / len(turn_tokens)


def classify_misses(question: Question, top: Sequence[str], deep: Mapping[str, Sequence[str]],
                    overlap_of: Mapping[str, float]) -> list[MissedTurn]:
    """The missed evidence turns of one question: `top` the hybrid top 10 (dia ids, best first),
    `deep` each system's ("hybrid", "bm25", "vector") top DEEP, `overlap_of` each evidence turn's
    word overlap with the question."""
    in_top = set(top)
    found = [e for e in question.evidence if e in in_top]
    found_at = [_position(e) for e in found]
    crowding = 0
    for hit in top:
        if hit in question.evidence:
            continue
        session, turn = _position(hit)
        if any(session == s and abs(turn - t) <= NEIGHBOUR_TURNS for s, t in found_at):
            crowding += 1
    found_sessions = {s for s, _ in found_at}

    def rank(system: str, dia_id: str) -> int | None:
        ranked = list(deep[system])
        return ranked.index(dia_id) + 1 if dia_id in ranked else None

    missed = []
    for dia_id in dict.fromkeys(question.evidence):  # an id listed twice is one turn
        if dia_id in in_top:
            continue
        missed.append(MissedTurn(
            conversation=question.conversation, question=question.question, category=question.category,
            dia_id=dia_id, hybrid_rank=rank("hybrid", dia_id), bm25_rank=rank("bm25", dia_id),
            vector_rank=rank("vector", dia_id), other_evidence_found=bool(found),
            other_session=bool(found) and _position(dia_id)[0] not in found_sessions,
            crowding=crowding, overlap=round(overlap_of[dia_id], 3)))
    return missed


def _ranked_dia(memory: Memory, question: Question, vector: np.ndarray, k: int, mode: str,
                dia_of: dict[int, str]) -> list[str]:
    """The question's top k in its conversation, searched as `gieok bench locomo` searches."""
    result = memory.search(question.question, k, scope={"channel": question.conversation}, mode=mode,
                           neighbours=(mode == "hybrid"), layers=False,
                           query_vector=vector if mode != "bm25" else None)
    return [dia_of[h.block.block_index] for h in result.hits]


@dataclass
class Analysis:
    """What `analyse` found: the missed turns; per category each question's turn recall@10, and
    for each found evidence turn whether it shares no word with its question (the comparison
    that says whether "vocabulary mismatch" tells the missed turns apart)."""

    missed: list[MissedTurn]
    recall: dict[str, list[float]]
    found_without_shared_word: dict[str, list[bool]]


def analyse(memory: Memory, data: LocomoData, query_vectors: Sequence[np.ndarray],
            dia_of: dict[int, str]) -> Analysis:
    by_conv = {(t.conversation, t.dia_id): _utterance(t.text, t.speaker) for t in data.turns}
    result = Analysis([], {}, {})
    for q, vector in zip(data.questions, query_vectors):
        top = _ranked_dia(memory, q, vector, TOP, "hybrid", dia_of)
        result.recall.setdefault(q.category, []).append(sum(e in top for e in q.evidence) / len(q.evidence))
        overlap = {e: word_overlap(memory.tokenizer, q.question, by_conv[(q.conversation, e)]) for e in q.evidence}
        result.found_without_shared_word.setdefault(q.category, []).extend(
            overlap[e] == 0.0 for e in dict.fromkeys(q.evidence) if e in top)
        if all(e in top for e in q.evidence):
            continue
        deep = {mode: _ranked_dia(memory, q, vector, DEEP, mode, dia_of) for mode in ("hybrid", "bm25", "vector")}
        result.missed.extend(classify_misses(q, top, deep, overlap))
    return result


def summarise(analysis: Analysis) -> dict[str, dict[str, Any]]:
    """Per category (and "all"): questions, recall@10, missed turns and each cause's share of them."""
    out: dict[str, dict[str, Any]] = {}
    for category in [*sorted(analysis.recall), "all"]:
        rows = [m for m in analysis.missed if category in ("all", m.category)]
        scores = [s for c, values in analysis.recall.items() if category in ("all", c) for s in values]
        found_no_word = [f for c, values in analysis.found_without_shared_word.items() if category in ("all", c)
                         for f in values]
        with_rank = [m.hybrid_rank for m in rows if m.hybrid_rank is not None]
        out[category] = {
            "name": CATEGORY_NAMES.get(category, category),
            "questions": len(scores),
            "turn_recall@10": round(float(np.mean(scores)), 4) if scores else 0.0,
            "questions_missing_evidence": len({(m.conversation, m.question) for m in rows}),
            "missed_turns": len(rows),
            "causes": {cause: round(sum(cause in m.causes for m in rows) / len(rows), 3) if rows else 0.0
                       for cause in CAUSES},
            "another_evidence_in_top10": round(sum(m.other_evidence_found for m in rows) / len(rows), 3)
            if rows else 0.0,
            "bm25_top10": round(sum((m.bm25_rank or DEEP + 1) <= TOP for m in rows) / len(rows), 3) if rows else 0.0,
            "vector_top10": round(sum((m.vector_rank or DEEP + 1) <= TOP for m in rows) / len(rows), 3)
            if rows else 0.0,
            "median_hybrid_rank": median([float(r) for r in with_rank]) if with_rank else None,
            "mean_crowding": round(float(np.mean([m.crowding for m in rows if m.other_evidence_found])), 2)
            if any(m.other_evidence_found for m in rows) else 0.0,
            "median_overlap": round(median([m.overlap for m in rows]), 3) if rows else 0.0,
            "found_without_shared_word": round(sum(found_no_word) / len(found_no_word), 3) if found_no_word else 0.0,
        }
    return out


def measure_misses(data_path: str | Path, *, db_dir: str | Path | None = None, embed_cache: Path | None = None,
                   settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    data = load_locomo(data_path)
    target = bench_target("recall-misses", None if db_dir is None else str(db_dir))
    memory = fresh_memory(bench_location(target, "locomo.db"), **bench_settings(settings_overrides))
    try:
        dia_of, _, _ = _ingest(memory, data, embed_cache)
        query_vectors, _ = _embed_questions(memory, data.questions, embed_cache)
        analysis = analyse(memory, data, query_vectors, dia_of)
    finally:
        memory.close()
    return {"questions": len(data.questions), "top": TOP, "deep": DEEP, "neighbour_turns": NEIGHBOUR_TURNS,
            "settings": dict(settings_overrides or {}), "by_category": summarise(analysis),
            "missed": [asdict(m) | {"causes": list(m.causes)} for m in analysis.missed]}


def print_misses(report: dict[str, Any]) -> None:
    columns = ("category", "n", "R@10", "q with miss", "turns missed", "other ev. found", *_CAUSE_COLUMNS,
               "bm25 ≤10", "vector ≤10", "median rank", "crowding", "found: no shared word")
    table = results_table(f"Where evidence is missed: share of the missed evidence turns (top {TOP}, ranks in a top "
                          f"{DEEP}, neighbours ±{NEIGHBOUR_TURNS} turns)", columns, left=("category",))
    table.columns[0].no_wrap = True
    for category, row in report["by_category"].items():
        table.add_row(f"{category} {row['name']}" if category != "all" else "all", str(row["questions"]),
                      f"{row['turn_recall@10']:.3f}", str(row["questions_missing_evidence"]), str(row["missed_turns"]),
                      f"{row['another_evidence_in_top10']:.2f}", *[f"{row['causes'][c]:.2f}" for c in CAUSES],
                      f"{row['bm25_top10']:.2f}", f"{row['vector_top10']:.2f}",
                      "–" if row["median_hybrid_rank"] is None else f"{row['median_hybrid_rank']:.0f}",
                      f"{row['mean_crowding']:.1f}", f"{row['found_without_shared_word']:.2f}")
    table_console(None).print(table)


def run_recall_misses(data_path: str | Path, json_out: str | Path | None = None, *, db_dir: str | Path | None = None,
                      embed_cache: Path | None = None,
                      settings_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    report = measure_misses(data_path, db_dir=db_dir, embed_cache=embed_cache, settings_overrides=settings_overrides)
    return print_and_write(report, print_misses, json_out)


def _setting(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    if not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        parsed: Any = int(value)
    except ValueError:
        try:
            parsed = float(value)
        except ValueError:
            parsed = value
    return name.strip(), parsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/locomo/locomo_dev5.json"),
                        help="a LoCoMo-format file (default: ../shared/data/locomo/locomo_dev5.json)")
    parser.add_argument("--json", type=Path, help="write the report (and every missed turn) here")
    parser.add_argument("--embed-cache", type=Path, help="reuse passage and question vectors from this directory")
    parser.add_argument("--db", help="directory for the benchmark database (recreated; default: a temp dir)")
    parser.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                        help="an engine setting for the searches (repeatable), e.g. --set ranker=fusion")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"skipped: no LoCoMo data at {args.data} (pass --data FILE)")
        return 0
    try:
        run_recall_misses(args.data, args.json, db_dir=args.db, embed_cache=args.embed_cache,
                          settings_overrides=dict(args.set))
    except InvalidInputError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

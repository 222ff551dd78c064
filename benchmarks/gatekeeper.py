"""`gieok bench gatekeeper`: how well stage 1 (`ResponseClassifier`) tells the messages the
bot should answer from the ones it should let pass, on the bundled Korean/English chat
dataset (trained on its train split, scored on the held-out test split) or on any labelled
JSONL file (`--data`, scored with the shipped model).

Labelling rules of `data/gatekeeper.jsonl` (the bot is 누리 / Nuri, a persona bot active in the
channel; `context` holds up to four earlier messages as "name: text"):

Reply (label true) when the message
  - asks something the bot could answer, of the bot or of the room: facts, how-tos, advice,
    opinions, polls ("다들 MBTI 뭐예요?", "what's everyone's comfort movie?"), also in the
    middle of a conversation between humans;
  - requests something: recommend, explain, translate, write, summarise, play a game;
  - greets or says goodbye to the whole room ("안녕하세요~", "morning all", "night everyone");
  - continues a conversation with the bot: the bot's message is the latest one and this is a
    follow-up question, an answer to the bot's question or a move in the bot's game, however
    short ("그럼 내일은?", "yes", "다람쥐").
Stay silent (label false) when the message
  - is talk between humans: news, feelings, statements, replies to someone else — also right
    after the bot spoke, when it addresses a person ("지현아 내 거 빌려줄게");
  - is addressed to a named human ("@민수 너 어제 뭐했어?", "jay which hotel did you book?") or
    asks the room for something only people can do (join a game, come to a meetup), and so
    are greetings to one person ("morning mia ☕", "@하은 생일 축하해!!");
  - is a reaction (ㅋㅋㅋ, ㅠㅠ, ㄹㅇ, lol, 😂), even to the bot's own message;
  - is an acknowledgement or thanks (ㅇㅋ, 넵, got it, thx) — also thanks to the bot right after
    it helped: a text reply to "thanks" adds nothing (an emoji reaction is the runtime's
    business), and one rule everywhere is one the classifier can learn;
  - is a rhetorical question or a complaint shaped as one ("how is it only tuesday",
    "월요일은 왜 이렇게 빨리 오는 걸까").
Explicit calls (`"explicit": true`: the message names the bot, "누리야 …", "Nuri …") are
labelled true and are never shown to stage 1 in production, so training leaves them out and the
benchmark skips them, reporting how many it skipped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from rich.console import Console

from benchmarks.datasets import gate_examples
from benchmarks.guard import wilson_interval
from benchmarks.report import median, percentile, print_and_write, progress_bar, results_table, table_console
from gieok.chat.agent.classifier import classifier_encoder, embed_messages, message_model_name
from gieok.chat.agent.response_classifier import ResponseClassifier, bot_spoke_last, embed_examples, strip_speaker
from gieok.chat.data.labeled import GATEKEEPER_DATA, GateExample, data_digest, gate_split
from gieok.errors import InvalidInputError

__all__ = ["measure_gatekeeper", "print_gatekeeper", "run_gatekeeper"]


def _metrics(labels: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    tp = int((labels & predicted).sum())
    fp = int((~labels & predicted).sum())
    fn = int((labels & ~predicted).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"accuracy": round(float((labels == predicted).mean()), 4), "precision": round(precision, 4),
            "recall": round(recall, 4), "f1": round(f1, 4)}


def _accuracy_by_language(rows: list[GateExample], labels: np.ndarray,
                          predicted: np.ndarray) -> dict[str, dict[str, Any]]:
    """Accuracy per language with its 95 % Wilson interval: a few hundred examples a language
    leave a few points of doubt, and a difference between two models inside it is not one."""
    out = {}
    for lang in sorted({e.lang or "-" for e in rows}):
        index = [i for i, e in enumerate(rows) if (e.lang or "-") == lang]
        correct = int((labels[index] == predicted[index]).sum())
        out[lang] = {"n": len(index), "accuracy": round(correct / len(index), 4),
                     "accuracy_ci95": list(wilson_interval(correct, len(index)))}
    return out


def _text_count(examples: list[GateExample]) -> int:
    """What `embed_examples` will embed (for the progress bar)."""
    return len({e.message for e in examples} | {strip_speaker(e.context[-1]) for e in examples if e.context})


class _Scoring(NamedTuple):
    """A model and the examples it is scored on, embedded (messages, contexts)."""

    model: ResponseClassifier
    rows: list[GateExample]
    messages: Any
    contexts: Any
    skipped_explicit: int
    source: str  # the table title's words for where the examples and the model came from


def _trained_on_bundled(embedder: Any, scored_rows: list[GateExample], threshold: float,
                        save_model: str | Path | None) -> _Scoring:
    """Train on the bundled train split (saved if asked) and embed the held-out test split."""
    examples = [e for e in scored_rows if not e.explicit]
    train = [e for e in examples if gate_split(e.message) == "train"]
    rows = [e for e in examples if gate_split(e.message) == "test"]
    skipped = sum(e.explicit and gate_split(e.message) == "test" for e in scored_rows)
    with progress_bar("embedding", _text_count(train) + _text_count(rows)) as advance:
        train_m, train_c = embed_examples(embedder, train, progress=advance)
        test_m, test_c = embed_examples(embedder, rows, progress=advance)
    t = time.perf_counter()
    model = ResponseClassifier.fit(train_m, train_c, [e.message for e in train], [e.label for e in train],
                                   embedder_name=message_model_name(embedder.name),
                                   dataset_sha256=data_digest(GATEKEEPER_DATA),
                                   previous_from_bot=[bot_spoke_last(e.context) for e in train], threshold=threshold,
                                   embedder=embedder)
    train_s = time.perf_counter() - t
    if save_model is not None:
        Path(save_model).parent.mkdir(parents=True, exist_ok=True)
        model.save(save_model)
    which = f"held-out test split of the bundled data, trained on {len(train)} train examples in {train_s:.1f} s"
    return _Scoring(model, rows, test_m, test_c, skipped, which)


def _shipped_on_file(embedder: Any, data: str | Path, scored_rows: list[GateExample], threshold: float) -> _Scoring:
    """The shipped model, and the file's examples (explicit calls left out) embedded."""
    rows = [e for e in scored_rows if not e.explicit]
    skipped = len(scored_rows) - len(rows)
    if not rows:
        raise InvalidInputError(f"{data}: every example is explicit; nothing for stage 1 to score")
    model = ResponseClassifier.load(embedder, threshold=threshold)
    with progress_bar("embedding", _text_count(rows)) as advance:
        test_m, test_c = embed_examples(embedder, rows, progress=advance)
    return _Scoring(model, rows, test_m, test_c, skipped, f"{data}, scored with the shipped model")


def _probabilities_and_latency(scoring: _Scoring, embedder: Any) -> tuple[list[float], list[float], list[float]]:
    """Latency per message, one call at a time as the bot makes them: the classifier on vectors
    the pipeline already has, and the same plus embedding the message (uncached). Who wrote the
    previous message is read from its "name: " prefix, as the pipeline knows it from the row."""
    model = scoring.model
    inner = getattr(embedder, "inner", embedder)
    classifier_ms, total_ms, probabilities = [], [], []
    for index, example in enumerate(scoring.rows):
        context = scoring.contexts[index] if example.context else None
        from_bot = bot_spoke_last(example.context) if example.context else None
        t = time.perf_counter()
        p = model.probability(scoring.messages[index], context, example.message, previous_from_bot=from_bot)
        classifier_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        vector = embed_messages(inner, [example.message])[0]
        model.probability(vector, context, example.message, previous_from_bot=from_bot)
        total_ms.append((time.perf_counter() - t) * 1000)
        probabilities.append(p)
    return probabilities, classifier_ms, total_ms


def _accuracy_by_kind(rows: list[GateExample], labels: np.ndarray,
                      predicted: np.ndarray) -> list[tuple[str, int, int, float]]:
    """(kind / lang, examples, labelled true, accuracy) per group, sorted."""
    groups: dict[str, list[int]] = defaultdict(list)
    for index, example in enumerate(rows):
        groups[f"{example.kind or '-'} / {example.lang or '-'}"].append(index)
    return [(key, len(groups[key]), int(labels[groups[key]].sum()),
             float((predicted[groups[key]] == labels[groups[key]]).mean())) for key in sorted(groups)]


def _misclassified(rows: list[GateExample], labels: np.ndarray, predicted: np.ndarray,
                   p: np.ndarray) -> list[tuple[float, GateExample]]:
    """(probability, example) of every wrong call, the most confident first."""
    wrong = [i for i in range(len(rows)) if predicted[i] != labels[i]]
    return [(float(p[i]), rows[i]) for i in sorted(wrong, key=lambda i: -abs(p[i] - 0.5))]


def measure_gatekeeper(data: str | Path | None = None, *, threshold: float = 0.7,
                       save_model: str | Path | None = None) -> dict[str, Any]:
    from gieok.config import load_settings

    if data is not None and save_model is not None:
        raise InvalidInputError("--save-model trains on the bundled train split; leave out --data")
    scored_rows = gate_examples(data)  # bad input fails before the model loads
    embedder = classifier_encoder(load_settings())
    if data is None:
        scoring = _trained_on_bundled(embedder, scored_rows, threshold, save_model)
    else:
        scoring = _shipped_on_file(embedder, data, scored_rows, threshold)
    probabilities, classifier_ms, total_ms = _probabilities_and_latency(scoring, embedder)
    rows = scoring.rows

    p = np.array(probabilities)
    labels = np.array([e.label for e in rows])
    predicted = p >= 0.5
    decided = (p >= threshold) | (p <= 1 - threshold)
    return {
        **_metrics(labels, predicted),
        "accuracy_ci95": list(wilson_interval(int((labels == predicted).sum()), len(rows))),
        "by_language": _accuracy_by_language(rows, labels, predicted),
        "p50_ms": round(median(total_ms), 3),  # with embedding the message
        "p50_ms_classifier": round(median(classifier_ms), 4),  # on ready vectors
        "p95_ms": round(percentile(total_ms, 95), 3),
        "n": len(rows), "skipped_explicit": int(scoring.skipped_explicit),
        "threshold": threshold, "unsure_share": round(float(1 - decided.mean()), 4),
        "accuracy_when_sure": round(float((predicted == labels)[decided].mean()), 4) if decided.any() else 0.0,
        "_source": scoring.source, "_by_kind": _accuracy_by_kind(rows, labels, predicted),
        "_misclassified": _misclassified(rows, labels, predicted, p),
    }


def print_gatekeeper(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    threshold = report["threshold"]
    table = results_table(f"gatekeeper stage 1 on {report['n']} examples ({report['_source']}); "
                          f"{report['skipped_explicit']} explicit calls skipped",
                          ("n", "accuracy", "95 % interval", "precision", "recall", "F1",
                           f"unsure (threshold {threshold})", "accuracy when sure", "p50 ms (vectors)",
                           "p50 ms (with embedding)"))
    low, high = report["accuracy_ci95"]
    table.add_row(str(report["n"]), f"{report['accuracy']:.3f}", f"{low:.3f}–{high:.3f}", f"{report['precision']:.3f}",
                  f"{report['recall']:.3f}", f"{report['f1']:.3f}", f"{report['unsure_share']:.3f}",
                  f"{report['accuracy_when_sure']:.3f}", f"{report['p50_ms_classifier']:.3f}",
                  f"{report['p50_ms']:.2f}")
    for lang, row in report["by_language"].items():
        low, high = row["accuracy_ci95"]
        table.add_row(f"{lang}: {row['n']}", f"{row['accuracy']:.3f}", f"{low:.3f}–{high:.3f}", *[""] * 7)
    console.print(table)
    if len(report["_by_kind"]) > 1:
        by_kind = results_table("accuracy by kind / language", ("kind / lang", "n", "label true", "accuracy"))
        for key, n, label_true, accuracy in report["_by_kind"]:
            by_kind.add_row(key, str(n), str(label_true), f"{accuracy:.3f}")
        console.print(by_kind)
    wrong = report["_misclassified"]
    for p, e in wrong[:15]:
        before = f"[{e.context[-1]}] " if e.context else ""
        console.print(f"  {'missed' if e.label else 'false reply'} (p={p:.2f}, {e.kind or '-'}): {before}{e.message}",
                      highlight=False, markup=False)
    if len(wrong) > 15:
        console.print(f"  … and {len(wrong) - 15} more misclassified", highlight=False)


def run_gatekeeper(data: str | Path | None = None, json_out: str | Path | None = None, *,
                   threshold: float = 0.7, save_model: str | Path | None = None) -> dict[str, Any]:
    report = measure_gatekeeper(data, threshold=threshold, save_model=save_model)
    return print_and_write(report, print_gatekeeper, json_out)

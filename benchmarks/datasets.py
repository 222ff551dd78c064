"""The evaluation data of the benchmarks, kept out of the wheel: the held-out halves of the guard
corpus and the gatekeeper set (their training halves ship with the chat, `gieok.chat.data`),
the labeled fact pairs with their recorded model answers, and the Korean LoCoMo-format dev set.

The loaders with no path join a set's two halves again, so a benchmark scores exactly what it
scored when both halves were one file; the hash splits (`guard_split`, `gate_split`,
`fact_split`) still say which half a row is on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gieok.chat.data.labeled import (
    GUARD_SPLIT,
    GateExample,
    load_gate_examples,
    load_guard_corpus,
    parse_object,
    read_labeled_jsonl,
    read_lines,
)
from gieok.errors import InvalidInputError

__all__ = ["DATA", "GUARD_HELDOUT", "GUARD_FRESH", "GATEKEEPER_HELDOUT", "GATEKEEPER_FRESH", "FACT_PAIRS",
           "FACT_PAIRS_FRESH", "FACT_ANSWERS", "LOCOMO_KO_DEV", "FACT_LABELS", "FACT_SPLIT", "fact_split",
           "guard_corpus", "gate_examples",
           "load_fact_pairs", "load_fact_answers"]

DATA = Path(__file__).resolve().parent / "data"
GUARD_HELDOUT = DATA / "guard_heldout.jsonl"
# A second held-out set, written apart from both halves of the corpus (issue 42): everyday chat and
# injections, scored whole with `gieok bench guard --data`. No loader joins it to the corpus, so no
# training or calibration reads it.
GUARD_FRESH = DATA / "guard_fresh.jsonl"
GATEKEEPER_HELDOUT = DATA / "gatekeeper_heldout.jsonl"
# Written apart from both halves above (issue 42) and never trained on: `gieok bench gatekeeper --data` it.
GATEKEEPER_FRESH = DATA / "gatekeeper_fresh.jsonl"
FACT_PAIRS = DATA / "fact_pairs.jsonl"
# Written apart from fact_pairs.jsonl and never tuned on: `gieok bench facts --data` scores it whole.
FACT_PAIRS_FRESH = DATA / "fact_pairs_fresh.jsonl"
FACT_ANSWERS = DATA / "fact_answers.jsonl"
LOCOMO_KO_DEV = DATA / "locomo_ko_dev.json"
FACT_LABELS = ("duplicate", "conflict", "distinct")
FACT_SPLIT = GUARD_SPLIT


def guard_corpus(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The whole guard corpus (the shipped dev half, then the held-out test half), or the file at `path`."""
    if path is not None:
        return load_guard_corpus(path)
    return load_guard_corpus() + load_guard_corpus(GUARD_HELDOUT)


def gate_examples(path: str | Path | None = None) -> list[GateExample]:
    """The whole gatekeeper set (the shipped train side, then the held-out test side), or the file at `path`."""
    if path is not None:
        return load_gate_examples(path)
    return load_gate_examples() + load_gate_examples(GATEKEEPER_HELDOUT)


def fact_split(row: dict[str, Any]) -> str:
    """`dev` or `test` half of a fact pair."""
    return FACT_SPLIT.of(row["old"] + "\n" + row["new"])


def load_fact_pairs(path: str | Path | None = None) -> list[dict[str, Any]]:
    """`{"old", "new", "label"}` rows of the project's fact pairs, or of the file at `path`."""
    return read_labeled_jsonl(path or FACT_PAIRS, FACT_PAIRS.name, "fact pairs",
                              shape='{"old": str, "new": str, "label": duplicate|conflict|distinct}',
                              valid=lambda r: isinstance(r.get("old"), str) and isinstance(r.get("new"), str)
                              and r.get("label") in FACT_LABELS)


def load_fact_answers(path: str | Path | None = None) -> dict[tuple[str, str], str]:
    """Recorded extraction-model answers for fact pairs, `{(old, new): answer text}`: each line
    `{"old", "new", "answer"}` where `answer` is the raw text the model returned (the wire format
    the extraction parser reads). Lines starting with `#` are the file's documentation."""
    lines, source = read_lines(path or FACT_ANSWERS, FACT_ANSWERS.name, "fact answers")
    answers: dict[tuple[str, str], str] = {}
    for number, line in lines:
        if line.lstrip().startswith("#"):
            continue
        row = parse_object(line, f"{source} line {number}")
        if not all(isinstance(row.get(k), str) for k in ("old", "new", "answer")):
            raise InvalidInputError(f'{source} line {number}: expected {{"old": str, "new": str, "answer": str}}')
        answers[(row["old"], row["new"])] = row["answer"]
    if not answers:
        raise InvalidInputError(f"{source} has no answers")
    return answers

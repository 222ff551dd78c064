"""The labeled sets the project ships, one loader each, and the stable splits the shipped
models were trained and the benchmarks are scored on.

- `guard_corpus.jsonl`: prompt-injection attacks and benign look-alikes (`{"text", "attack"}`),
  halves `dev` (patterns written, classifier trained) / `test` (held out).
- `fact_pairs.jsonl`: fact pairs labeled duplicate / conflict / distinct, halves `dev` / `test`.
- `gatekeeper.jsonl`: messages with their context and whether the bot should reply, 70 % `train`
  / 30 % `test`.

A split is decided by a hash of the example's text, so the same text never lands on both sides
and adding examples never moves old ones. The rules below are the ones the shipped weights and
the published numbers were made with: changing one would silently mix training and test data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

__all__ = [
    "GUARD_CORPUS", "ORDINARY_KIND", "FACT_PAIRS", "GATEKEEPER_DATA", "FACT_LABELS", "HashSplit", "GUARD_SPLIT",
    "FACT_SPLIT",
    "GATEKEEPER_SPLIT", "GateExample", "read_labeled_jsonl", "data_digest", "load_guard_corpus",
    "load_fact_pairs", "load_gate_examples", "guard_split", "fact_split", "gate_split", "FACT_ANSWERS",
    "load_fact_answers",
]

GUARD_CORPUS = "guard_corpus.jsonl"
# The `kind` of the guard corpus's everyday chat rows (benign, dev half only): messages from the
# project's own chat sets that teach the classifier what ordinary messages look like. The
# false-alarm budget is counted on the other benign rows, the look-alikes the held-out half has.
ORDINARY_KIND = "ordinary_chat"
FACT_PAIRS = "fact_pairs.jsonl"
FACT_ANSWERS = "fact_answers.jsonl"
GATEKEEPER_DATA = "gatekeeper.jsonl"
FACT_LABELS = ("duplicate", "conflict", "distinct")


@dataclass(frozen=True)
class HashSplit:
    """Two named parts chosen by the SHA-256 of a key: the first `digest_bytes` bytes, read as a
    big-endian number, modulo `buckets`; buckets below `first_buckets` are the first part."""

    first: str
    second: str
    digest_bytes: int
    buckets: int
    first_buckets: int

    def of(self, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        value = int.from_bytes(digest[: self.digest_bytes], "big")
        return self.first if value % self.buckets < self.first_buckets else self.second


GUARD_SPLIT = HashSplit("dev", "test", digest_bytes=1, buckets=2, first_buckets=1)  # halves by the first byte's parity
FACT_SPLIT = GUARD_SPLIT
GATEKEEPER_SPLIT = HashSplit("train", "test", digest_bytes=2, buckets=10, first_buckets=7)  # 70 / 30


def guard_split(row: dict[str, Any]) -> str:
    """`dev` or `test` half of a guard corpus row."""
    return GUARD_SPLIT.of(row["text"])


def fact_split(row: dict[str, Any]) -> str:
    """`dev` or `test` half of a fact pair."""
    return FACT_SPLIT.of(row["old"] + "\n" + row["new"])


def gate_split(message: str) -> str:
    """`train` (70 %) or `test` side of a gatekeeper message."""
    return GATEKEEPER_SPLIT.of(message)


def _read_bytes(path: str | Path | None, bundled: str, what: str) -> tuple[bytes, str]:
    if path is None:
        return resources.files("gieok.data").joinpath(bundled).read_bytes(), f"bundled {bundled}"
    try:
        return Path(path).read_bytes(), str(path)
    except FileNotFoundError:
        raise InvalidInputError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{what} is a directory, not a file: {path}") from None


def data_digest(bundled: str, path: str | Path | None = None) -> str:
    """sha256 of a labeled file (the bundled one when `path` is None): trained weights record it,
    so a changed dataset is retrained rather than trusted."""
    return hashlib.sha256(_read_bytes(path, bundled, "labeled data")[0]).hexdigest()


def _lines(path: str | Path | None, bundled: str, what: str) -> tuple[list[tuple[int, str]], str]:
    raw, source = _read_bytes(path, bundled, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{source} is not UTF-8 text (byte {exc.start})") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()], source


def _object(line: str, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise InvalidInputError(f"{where}: expected an object, got {type(row).__name__}")
    return row


def read_labeled_jsonl(path: str | Path | None, bundled: str, what: str, *,
                       valid: Callable[[dict[str, Any]], bool], shape: str) -> list[dict[str, Any]]:
    """Objects, one a line, from `path` (or the bundled file when None); a line that is not
    JSON or fails `valid` is refused with `shape`, the expected form, in the message."""
    lines, source = _lines(path, bundled, what)
    rows = []
    for number, line in lines:
        row = _object(line, f"{source} line {number}")
        if not valid(row):
            raise InvalidInputError(f"{source} line {number}: expected {shape}")
        rows.append(row)
    if not rows:
        raise InvalidInputError(f"{source} has no examples")
    return rows


def load_guard_corpus(path: str | Path | None = None) -> list[dict[str, Any]]:
    """`{"text", "attack"}` rows of the bundled guard corpus, or of the file at `path`."""
    return read_labeled_jsonl(path, GUARD_CORPUS, "guard corpus", shape='{"text": str, "attack": bool}',
                              valid=lambda r: isinstance(r.get("text"), str) and isinstance(r.get("attack"), bool))


def load_fact_pairs(path: str | Path | None = None) -> list[dict[str, Any]]:
    """`{"old", "new", "label"}` rows of the bundled fact pairs, or of the file at `path`."""
    return read_labeled_jsonl(path, FACT_PAIRS, "fact pairs",
                              shape='{"old": str, "new": str, "label": duplicate|conflict|distinct}',
                              valid=lambda r: isinstance(r.get("old"), str) and isinstance(r.get("new"), str)
                              and r.get("label") in FACT_LABELS)


def load_fact_answers(path: str | Path | None = None) -> dict[tuple[str, str], str]:
    """Recorded extraction-model answers for fact pairs, `{(old, new): answer text}`: each line
    `{"old", "new", "answer"}` where `answer` is the raw text the model returned (the wire format
    the extraction parser reads). Lines starting with `#` are the file's documentation."""
    lines, source = _lines(path, FACT_ANSWERS, "fact answers")
    answers: dict[tuple[str, str], str] = {}
    for number, line in lines:
        if line.lstrip().startswith("#"):
            continue
        row = _object(line, f"{source} line {number}")
        if not all(isinstance(row.get(k), str) for k in ("old", "new", "answer")):
            raise InvalidInputError(f'{source} line {number}: expected {{"old": str, "new": str, "answer": str}}')
        answers[(row["old"], row["new"])] = row["answer"]
    if not answers:
        raise InvalidInputError(f"{source} has no answers")
    return answers


@dataclass(frozen=True)
class GateExample:
    """One gatekeeper example: the messages before it (oldest first), the message, and whether
    the bot should reply. `explicit` examples call the bot by name and never reach stage 1."""

    context: tuple[str, ...]
    message: str
    label: bool
    explicit: bool = False
    lang: str | None = None
    kind: str | None = None


def load_gate_examples(path: str | Path | None = None) -> list[GateExample]:
    """The bundled gatekeeper set (path None) or any JSONL of
    {"context": [str, ...], "message": str, "explicit": bool (optional), "label": bool}; each
    refusal names the file, the line and the field."""
    lines, source = _lines(path, GATEKEEPER_DATA, "gatekeeper data")
    examples = []
    for number, line in lines:
        where = f"{source} line {number}"
        row = _object(line, where)
        message, label = row.get("message"), row.get("label")
        context, explicit = row.get("context", []), row.get("explicit", False)
        if not isinstance(message, str) or not message.strip():
            raise InvalidInputError(f'{where}: "message" must be a non-empty string')
        if not isinstance(label, bool):
            raise InvalidInputError(f'{where}: "label" must be true or false, got {label!r}')
        if not isinstance(explicit, bool):
            raise InvalidInputError(f'{where}: "explicit" must be true or false, got {explicit!r}')
        if not isinstance(context, list) or not all(isinstance(c, str) and c.strip() for c in context):
            raise InvalidInputError(f'{where}: "context" must be a list of non-empty strings')
        for key in ("lang", "kind"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise InvalidInputError(f'{where}: "{key}" must be a string')
        examples.append(GateExample(tuple(context), message, label, explicit, row.get("lang"), row.get("kind")))
    if not examples:
        raise InvalidInputError(f"{source} has no examples")
    return examples

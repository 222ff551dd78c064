"""The labeled training sets the chat ships, one loader each, and the stable splits the shipped
models were trained on.

- `guard_train.jsonl`: the `dev` half of the guard corpus — prompt-injection attacks and benign
  look-alikes (`{"text", "attack"}`) the patterns were written on and the classifiers trained on.
- `gatekeeper_train.jsonl`: the `train` side (70 %) of the gatekeeper set — messages with their
  context and whether the bot should reply.

The held-out halves, the fact pairs and the fresh held-out sets (`*_fresh.jsonl`, written apart
from these files and never trained on) are evaluation data: they live with the benchmarks
(`benchmarks/data/`, not in the wheel), and `benchmarks.datasets` joins both halves again. A split
is decided by a hash of the example's text, so the same text never lands on both sides and adding
examples never moves old ones; the rules below are the ones the shipped weights and the published
numbers were made with: changing one would silently mix training and test data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError

__all__ = [
    "GUARD_CORPUS", "ORDINARY_KIND", "GATEKEEPER_DATA", "HashSplit", "GUARD_SPLIT", "GATEKEEPER_SPLIT",
    "GateExample", "read_labeled_jsonl", "read_lines", "parse_object", "data_digest", "load_guard_corpus",
    "load_gate_examples", "guard_split", "gate_split",
]

GUARD_CORPUS = "guard_train.jsonl"
# The `kind` of the guard corpus's everyday chat rows (benign, dev half only): messages from the
# project's own chat sets, and hand-written greetings, goodbyes and reactions ("anyway, see you",
# issue 42), that teach the classifier what ordinary messages look like. The
# false-alarm budget is counted on the other benign rows, the look-alikes the held-out half has.
ORDINARY_KIND = "ordinary_chat"
GATEKEEPER_DATA = "gatekeeper_train.jsonl"


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
GATEKEEPER_SPLIT = HashSplit("train", "test", digest_bytes=2, buckets=10, first_buckets=7)  # 70 / 30


def guard_split(row: dict[str, Any]) -> str:
    """`dev` or `test` half of a guard corpus row."""
    return GUARD_SPLIT.of(row["text"])


def gate_split(message: str) -> str:
    """`train` (70 %) or `test` side of a gatekeeper message."""
    return GATEKEEPER_SPLIT.of(message)


def _read_bytes(path: str | Path | None, bundled: str, what: str) -> tuple[bytes, str]:
    if path is None:
        return resources.files("gieok.chat.data").joinpath(bundled).read_bytes(), f"bundled {bundled}"
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


def read_lines(path: str | Path | None, bundled: str, what: str) -> tuple[list[tuple[int, str]], str]:
    raw, source = _read_bytes(path, bundled, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{source} is not UTF-8 text (byte {exc.start})") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()], source


def parse_object(line: str, where: str) -> dict[str, Any]:
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
    lines, source = read_lines(path, bundled, what)
    rows = []
    for number, line in lines:
        row = parse_object(line, f"{source} line {number}")
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
    lines, source = read_lines(path, GATEKEEPER_DATA, "gatekeeper data")
    examples = []
    for number, line in lines:
        where = f"{source} line {number}"
        row = parse_object(line, where)
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

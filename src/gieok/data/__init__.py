"""Data the project ships (labeled sets, the demo chat, trained weights) and one reader for
labeled JSONL files — bundled or the user's own — with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

__all__ = ["read_labeled_jsonl"]


def read_labeled_jsonl(path: str | Path | None, bundled: str, what: str, *,
                       valid: Callable[[dict[str, Any]], bool], shape: str) -> list[dict[str, Any]]:
    """Objects, one a line, from `path` (or the bundled file when None); a line that is not
    JSON or fails `valid` is refused with `shape`, the expected form, in the message."""
    if path is None:
        text = resources.files(__name__).joinpath(bundled).read_text(encoding="utf-8")
        source = f"bundled {what}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInputError(f"{what} not found: {path}") from None
        except UnicodeDecodeError:
            raise InvalidInputError(f"{what} {path} is not UTF-8 text") from None
        source = str(path)
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{source} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not valid(row):
            raise InvalidInputError(f"{source} line {number}: expected {shape}")
        rows.append(row)
    if not rows:
        raise InvalidInputError(f"{source} has no examples")
    return rows

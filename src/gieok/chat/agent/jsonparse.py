"""Tolerant reading of the JSON object a model was asked for.

Models wrap JSON in code fences, add a sentence before it, leave trailing commas, or stop
mid-object when they hit a token limit. This finds the first complete JSON object in the
text; it never evaluates anything, caps the size it looks at, and survives hostile input
(deep nesting, huge numbers, non-objects).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import LLMOutputError

__all__ = ["first_json_object", "MAX_JSON_CHARS"]

MAX_JSON_CHARS = 100_000
_FENCE = re.compile(r"```(?:json|JSON)?\s*")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_decoder = json.JSONDecoder()


def first_json_object(text: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise LLMOutputError(f"expected text, got {type(text).__name__}")
    if not text.strip():
        raise LLMOutputError("the answer was empty")
    if len(text) > MAX_JSON_CHARS:
        raise LLMOutputError(f"the answer is too long to be the requested JSON ({len(text):,} characters)")
    fenced = _FENCE.sub("", text)
    variants = [text, fenced, _TRAILING_COMMA.sub(r"\1", fenced)]
    problem = "no JSON object found"
    # The outermost object first, in every variant; only then objects that start later
    # (an inner object of a broken outer one may come back: callers validate the shape).
    for variant in variants:
        start = variant.find("{")
        if start != -1:
            try:
                value, _ = _decoder.raw_decode(variant, start)
            except json.JSONDecodeError as exc:
                problem = f"invalid JSON: {exc.msg}"
            except (RecursionError, ValueError) as exc:  # absurd nesting or numbers
                problem = f"unreadable JSON: {type(exc).__name__}"
            else:
                if isinstance(value, dict):
                    return value
                problem = "the JSON is not an object"
    for variant in variants:
        for start in _brace_positions(variant)[1:]:
            try:
                value, _ = _decoder.raw_decode(variant, start)
            except (json.JSONDecodeError, RecursionError, ValueError):
                continue
            if isinstance(value, dict):
                return value
    raise LLMOutputError(problem)


def _brace_positions(text: str, limit: int = 200) -> list[int]:
    out: list[int] = []
    start = text.find("{")
    while start != -1 and len(out) < limit:
        out.append(start)
        start = text.find("{", start + 1)
    return out

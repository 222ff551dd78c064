"""Data the chat ships: the labeled training halves of the guard corpus and the gatekeeper set,
the classifiers trained on them (`<name>-<encoder>.npz`), and the one place that reads the
labeled sets and splits them (`labeled.py`)."""

from .labeled import (
    GATEKEEPER_DATA,
    GUARD_CORPUS,
    GateExample,
    data_digest,
    gate_split,
    guard_split,
    load_gate_examples,
    load_guard_corpus,
    read_labeled_jsonl,
)

__all__ = [
    "GUARD_CORPUS", "GATEKEEPER_DATA", "GateExample", "read_labeled_jsonl", "data_digest", "load_guard_corpus",
    "load_gate_examples", "guard_split", "gate_split",
]

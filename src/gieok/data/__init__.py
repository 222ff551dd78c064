"""Data the project ships (labeled sets, the demo chat, trained weights) and the one place
that reads the labeled sets and splits them (`labeled.py`)."""

from .labeled import (
    FACT_LABELS,
    FACT_PAIRS,
    GATEKEEPER_DATA,
    GUARD_CORPUS,
    GateExample,
    data_digest,
    fact_split,
    gate_split,
    guard_split,
    load_fact_pairs,
    load_gate_examples,
    load_guard_corpus,
    read_labeled_jsonl,
)

__all__ = [
    "GUARD_CORPUS", "FACT_PAIRS", "GATEKEEPER_DATA", "FACT_LABELS", "GateExample", "read_labeled_jsonl",
    "data_digest", "load_guard_corpus", "load_fact_pairs", "load_gate_examples", "guard_split", "fact_split",
    "gate_split",
]

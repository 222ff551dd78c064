"""Hybrid retrieval: BM25 + vectors, fused, spread to neighbouring turns, re-weighted."""

from .hybrid import HybridRetriever, RetrievalParams, SearchRequest

__all__ = ["HybridRetriever", "RetrievalParams", "SearchRequest"]

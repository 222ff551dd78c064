"""Hybrid retrieval: BM25 + vectors, fused, spread to neighbouring turns, ordered by the learned ranker."""

from .hybrid import HybridRetriever, RetrievalParams, SearchRequest

__all__ = ["HybridRetriever", "RetrievalParams", "SearchRequest"]

"""In-memory indexes over the store: the block catalog, the vector index and BM25 postings."""

from .bm25 import BM25Index
from .catalog import Catalog
from .vector import AnnParams, VectorIndex, limit_blas_threads

__all__ = ["Catalog", "VectorIndex", "AnnParams", "BM25Index", "limit_blas_threads"]

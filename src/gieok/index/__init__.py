"""In-memory indexes over the store: the block catalog and the vector index."""

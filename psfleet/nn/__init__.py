"""Worker-side modules whose parameters live in the parameter server's tables."""

from psfleet.nn.sparse_embedding import SparseEmbedding, live_embeddings

__all__ = ["SparseEmbedding", "live_embeddings"]

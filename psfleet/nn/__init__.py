"""Worker-side modules whose parameters live in the parameter server's tables."""

from psfleet.nn.embedding_bag import SparseEmbeddingBag
from psfleet.nn.features import FeatureEmbeddings
from psfleet.nn.sparse_embedding import (
    SparseEmbedding,
    check_distinct_names,
    live_embeddings,
    use_prefetched,
)
from psfleet.nn.types import POOLINGS, EmbeddingTableSpec, Pooling, Prefetch, RowAccess

__all__ = ["POOLINGS", "EmbeddingTableSpec", "FeatureEmbeddings", "Pooling", "Prefetch",
           "RowAccess", "SparseEmbedding", "SparseEmbeddingBag", "check_distinct_names",
           "live_embeddings", "use_prefetched"]

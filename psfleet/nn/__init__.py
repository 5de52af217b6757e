"""Worker-side modules whose parameters live in the parameter server's tables."""

from psfleet.nn.embedding_bag import SparseEmbeddingBag
from psfleet.nn.features import FeatureEmbeddings, pass_ids
from psfleet.nn.sparse_embedding import (
    SparseEmbedding,
    check_distinct_names,
    live_embeddings,
    use_prefetched,
)
from psfleet.nn.types import (
    POOLINGS,
    AccessorSpec,
    EmbeddingTableSpec,
    Pooling,
    Prefetch,
    RowAccess,
    check_accessor,
)

__all__ = ["POOLINGS", "AccessorSpec", "EmbeddingTableSpec", "FeatureEmbeddings", "pass_ids",
           "Pooling", "Prefetch", "RowAccess", "SparseEmbedding", "SparseEmbeddingBag",
           "check_accessor", "check_distinct_names", "live_embeddings", "use_prefetched"]

"""Worker-side modules whose parameters live in the parameter server's tables."""

from psfleet.nn.sparse_embedding import (
    SparseEmbedding,
    check_distinct_names,
    live_embeddings,
    use_prefetched,
)
from psfleet.nn.types import Prefetch, RowAccess

__all__ = ["Prefetch", "RowAccess", "SparseEmbedding", "check_distinct_names",
           "live_embeddings", "use_prefetched"]

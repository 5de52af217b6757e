"""Worker-side modules whose parameters live in the parameter server's tables.

The names below are imported on first use (:mod:`psfleet._lazy`): checking a config
(``psfleet.nn.table_checks``) does not import torch.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.nn.embedding_bag import SparseEmbeddingBag
    from psfleet.nn.features import FeatureEmbeddings, pass_ids
    from psfleet.nn.sparse_embedding import (
        SparseEmbedding,
        check_distinct_names,
        live_embeddings,
        use_prefetched,
    )
    from psfleet.nn.table_checks import POOLINGS, AccessorSpec, Pooling, check_accessor
    from psfleet.nn.types import EmbeddingTableSpec, Prefetch, RowAccess

__all__ = [
    "POOLINGS",
    "AccessorSpec",
    "EmbeddingTableSpec",
    "FeatureEmbeddings",
    "pass_ids",
    "Pooling",
    "Prefetch",
    "RowAccess",
    "SparseEmbedding",
    "SparseEmbeddingBag",
    "check_accessor",
    "check_distinct_names",
    "live_embeddings",
    "use_prefetched",
]

__getattr__ = lazy_exports(__name__, {
    "AccessorSpec": "psfleet.nn.table_checks",
    "EmbeddingTableSpec": "psfleet.nn.types",
    "FeatureEmbeddings": "psfleet.nn.features",
    "POOLINGS": "psfleet.nn.table_checks",
    "Pooling": "psfleet.nn.table_checks",
    "Prefetch": "psfleet.nn.types",
    "RowAccess": "psfleet.nn.types",
    "SparseEmbedding": "psfleet.nn.sparse_embedding",
    "SparseEmbeddingBag": "psfleet.nn.embedding_bag",
    "check_accessor": "psfleet.nn.table_checks",
    "check_distinct_names": "psfleet.nn.sparse_embedding",
    "live_embeddings": "psfleet.nn.sparse_embedding",
    "pass_ids": "psfleet.nn.features",
    "use_prefetched": "psfleet.nn.sparse_embedding",
})

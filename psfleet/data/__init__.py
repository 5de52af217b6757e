"""Data layer: the Batch type, the raw Criteo parser and the in-memory reader."""

from psfleet.data.criteo import (
    NUM_DENSE,
    NUM_FIELDS,
    NUM_SLOTS,
    ParsedChunk,
    hash_feature,
    hash_features,
    parse_lines,
)
from psfleet.data.reader import CriteoReader, list_data_files
from psfleet.data.types import Batch

__all__ = [
    "NUM_DENSE",
    "NUM_FIELDS",
    "NUM_SLOTS",
    "Batch",
    "CriteoReader",
    "ParsedChunk",
    "hash_feature",
    "hash_features",
    "list_data_files",
    "parse_lines",
]

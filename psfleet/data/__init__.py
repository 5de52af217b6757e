"""Data layer: the Batch type, the raw Criteo parser, the in-memory reader and the
synthetic Criteo generator."""

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
from psfleet.data.synthetic import DatagenResult, generate_criteo, true_probabilities
from psfleet.data.types import Batch

__all__ = [
    "NUM_DENSE",
    "NUM_FIELDS",
    "NUM_SLOTS",
    "Batch",
    "CriteoReader",
    "DatagenResult",
    "ParsedChunk",
    "generate_criteo",
    "hash_feature",
    "hash_features",
    "list_data_files",
    "parse_lines",
    "true_probabilities",
]

"""Data layer: the Batch type and Reader protocol, parsers (registered by name: raw
Criteo TSV, PaddleRec slot format, CSV/TSV/Parquet columns, libSVM/libFFM), the streaming
QueueDataset, the InMemoryDataset with global shuffle, the torch DataLoader reader,
the in-memory CriteoReader, the jagged (multi-valued) feature types and the synthetic
generators (Criteo, multi-hot)."""

from psfleet.data import columnar as _columnar  # noqa: F401 (registers csv, parquet)
from psfleet.data import libsvm as _libsvm  # noqa: F401 (registers libsvm)
from psfleet.data import slot_format as _slot_format  # noqa: F401 (registers slot)
from psfleet.data.columnar import ColumnsConfig
from psfleet.data.criteo import (
    NUM_DENSE,
    NUM_FIELDS,
    NUM_SLOTS,
    hash_feature,
    hash_features,
    parse_criteo_bytes,
    parse_lines,
)
from psfleet.data.exchange import FileBarrier, FileExchange
from psfleet.data.files import list_data_files
from psfleet.data.inmemory_dataset import InMemoryDataset
from psfleet.data.jagged import JaggedRows, KeyedJagged
from psfleet.data.libsvm import LibsvmConfig
from psfleet.data.parsers import Parser, make_parser, parser_names, register_parser
from psfleet.data.queue_dataset import QueueDataset
from psfleet.data.reader import CriteoReader
from psfleet.data.slot_format import SlotFormatConfig
from psfleet.data.synthetic import DatagenResult, generate_criteo, true_probabilities
from psfleet.data.synthetic_multihot import MULTIHOT_COLUMNS, generate_multihot
from psfleet.data.torch_dataset import CtrIterableDataset, DataLoaderReader
from psfleet.data.types import Batch, FeatureSchema, ParsedChunk, RawChunk, Reader

__all__ = [
    "generate_multihot",
    "MULTIHOT_COLUMNS",
    "KeyedJagged",
    "JaggedRows",
    "FeatureSchema",
    "NUM_DENSE",
    "NUM_FIELDS",
    "NUM_SLOTS",
    "Batch",
    "ColumnsConfig",
    "CriteoReader",
    "CtrIterableDataset",
    "DataLoaderReader",
    "DatagenResult",
    "FileBarrier",
    "FileExchange",
    "InMemoryDataset",
    "LibsvmConfig",
    "ParsedChunk",
    "Parser",
    "QueueDataset",
    "RawChunk",
    "Reader",
    "SlotFormatConfig",
    "generate_criteo",
    "hash_feature",
    "hash_features",
    "list_data_files",
    "make_parser",
    "parse_criteo_bytes",
    "parse_lines",
    "parser_names",
    "register_parser",
    "true_probabilities",
]

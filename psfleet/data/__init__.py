"""Data layer: the Batch type and Reader protocol, parsers (registered by name: raw
Criteo TSV, PaddleRec slot format, CSV/TSV/Parquet columns, libSVM/libFFM), the streaming
QueueDataset, the InMemoryDataset with global shuffle, the torch DataLoader reader,
the in-memory CriteoReader, the jagged (multi-valued) feature types and the synthetic
generators (Criteo, multi-hot).

The names below are imported on first use (:mod:`psfleet._lazy`): reading a config or
parsing data does not import torch, which only batches (:mod:`psfleet.data.batch`) and
the readers that make them need."""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.data.batch import Batch
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
    from psfleet.data.jagged import KeyedJagged
    from psfleet.data.jagged_rows import JaggedRows
    from psfleet.data.libsvm import LibsvmConfig
    from psfleet.data.parsers import Parser, make_parser, parser_names, register_parser
    from psfleet.data.queue_dataset import QueueDataset
    from psfleet.data.reader import CriteoReader
    from psfleet.data.slot_format import SlotFormatConfig
    from psfleet.data.synthetic import DatagenResult, generate_criteo, true_probabilities
    from psfleet.data.synthetic_multihot import MULTIHOT_COLUMNS, generate_multihot
    from psfleet.data.torch_dataset import CtrIterableDataset, DataLoaderReader
    from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk, Reader

__all__ = [
    "Batch",
    "ColumnsConfig",
    "CriteoReader",
    "CtrIterableDataset",
    "DataLoaderReader",
    "DatagenResult",
    "FeatureSchema",
    "FileBarrier",
    "FileExchange",
    "InMemoryDataset",
    "JaggedRows",
    "KeyedJagged",
    "LibsvmConfig",
    "MULTIHOT_COLUMNS",
    "NUM_DENSE",
    "NUM_FIELDS",
    "NUM_SLOTS",
    "ParsedChunk",
    "Parser",
    "QueueDataset",
    "RawChunk",
    "Reader",
    "SlotFormatConfig",
    "generate_criteo",
    "generate_multihot",
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

__getattr__ = lazy_exports(__name__, {
    "Batch": "psfleet.data.batch",
    "ColumnsConfig": "psfleet.data.columnar",
    "CriteoReader": "psfleet.data.reader",
    "CtrIterableDataset": "psfleet.data.torch_dataset",
    "DataLoaderReader": "psfleet.data.torch_dataset",
    "DatagenResult": "psfleet.data.synthetic",
    "FeatureSchema": "psfleet.data.types",
    "FileBarrier": "psfleet.data.exchange",
    "FileExchange": "psfleet.data.exchange",
    "InMemoryDataset": "psfleet.data.inmemory_dataset",
    "JaggedRows": "psfleet.data.jagged_rows",
    "KeyedJagged": "psfleet.data.jagged",
    "LibsvmConfig": "psfleet.data.libsvm",
    "MULTIHOT_COLUMNS": "psfleet.data.synthetic_multihot",
    "NUM_DENSE": "psfleet.data.criteo",
    "NUM_FIELDS": "psfleet.data.criteo",
    "NUM_SLOTS": "psfleet.data.criteo",
    "ParsedChunk": "psfleet.data.types",
    "Parser": "psfleet.data.parsers",
    "QueueDataset": "psfleet.data.queue_dataset",
    "RawChunk": "psfleet.data.types",
    "Reader": "psfleet.data.types",
    "SlotFormatConfig": "psfleet.data.slot_format",
    "generate_criteo": "psfleet.data.synthetic",
    "generate_multihot": "psfleet.data.synthetic_multihot",
    "hash_feature": "psfleet.data.criteo",
    "hash_features": "psfleet.data.criteo",
    "list_data_files": "psfleet.data.files",
    "make_parser": "psfleet.data.parsers",
    "parse_criteo_bytes": "psfleet.data.criteo",
    "parse_lines": "psfleet.data.criteo",
    "parser_names": "psfleet.data.parsers",
    "register_parser": "psfleet.data.parsers",
    "true_probabilities": "psfleet.data.synthetic",
})

"""Parsers, registered by name: a parser turns a :class:`RawChunk` into a
:class:`~psfleet.data.types.ParsedChunk` (labels, dense, sparse keys, multi-valued
``jagged`` keys).

Built in:

- ``criteo``: raw Criteo Kaggle TSV (:mod:`psfleet.data.criteo`), no options.
- ``slot``: PaddleRec's slot text format (:mod:`psfleet.data.slot_format`), options
  :class:`~psfleet.data.slot_format.SlotFormatConfig`.
- ``csv``: delimited text with named or numbered columns, and ``parquet``: Parquet
  files (:mod:`psfleet.data.columnar`), options
  :class:`~psfleet.data.columnar.ColumnsConfig`.
- ``libsvm``: libSVM ``label idx:value`` and libFFM ``label field:idx:value`` text
  (:mod:`psfleet.data.libsvm`), options :class:`~psfleet.data.libsvm.LibsvmConfig`.

Add a format with :func:`register_parser`; :func:`make_parser` with an unknown name
lists the known ones. Parsers are thread safe (chunks are parsed in parallel).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal, Protocol

from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS, parse_criteo_bytes
from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk
from psfleet.errors import ConfigError

__all__ = ["CriteoParser", "Parser", "make_parser", "parser_names", "quoted_records",
           "register_parser"]


class Parser(Protocol):
    """Turns raw chunks of one format into arrays. Thread safe.

    Attributes:
        kind: ``text`` (payload is bytes of lines; ``pipe_command`` allowed) or
            ``parquet`` (payload is a ``pyarrow.Table``).
        header: True if the first line of each text file is a header, not data.
        quoted_records: (optional, default False) a quoted field may hold line breaks,
            so a record may span lines (CSV): the readers cut files and shares at
            record ends (:mod:`psfleet.data.records`); see :func:`quoted_records`.
        schema: the features of each example, by name (dense, single-valued sparse,
            multi-valued sparse).
    """

    kind: Literal["text", "parquet"]
    header: bool
    schema: FeatureSchema

    def parse(self, chunk: RawChunk, strict: bool) -> ParsedChunk:
        """Parse ``chunk``; malformed lines are skipped with a rate-limited warning
        naming ``file:line``, or raise :class:`~psfleet.errors.DataError` if ``strict``."""
        ...


class CriteoParser:
    """Raw Criteo TSV (``label, I1..I13, C1..C26``); see :mod:`psfleet.data.criteo`."""

    kind: Literal["text", "parquet"] = "text"
    header = False
    schema = FeatureSchema(dense=tuple(f"I{i}" for i in range(1, NUM_DENSE + 1)),
                           sparse=tuple(f"C{i}" for i in range(1, NUM_SLOTS + 1)))

    def parse(self, chunk: RawChunk, strict: bool) -> ParsedChunk:
        if not isinstance(chunk.payload, bytes):
            raise ConfigError(f"{chunk.source}: the criteo parser reads text, not Parquet")
        return parse_criteo_bytes(chunk.payload, chunk.source, chunk.first_line_no,
                                  line_step=chunk.line_step, strict=strict)


_REGISTRY: dict[str, Callable[[Any], Parser]] = {}

#: The modules registering the other built-in parsers. They import this module, so
#: they are imported on the registry's first use, not here.
_BUILTIN_MODULES = ("psfleet.data.columnar", "psfleet.data.libsvm", "psfleet.data.slot_format")
_builtins_loaded = False


def _load_builtins() -> None:
    """Import the modules that register the built-in parsers (once)."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def quoted_records(parser: Parser) -> bool:
    """Whether ``parser``'s records may span lines (its optional ``quoted_records``; a
    parser registered without it reads one record per line)."""
    return bool(getattr(parser, "quoted_records", False))


def register_parser(name: str, factory: Callable[[Any], Parser]) -> None:
    """Register ``factory(options) -> Parser`` under ``name`` (options may be None).

    Raises:
        ConfigError: ``name`` is already registered (a built-in name included).
    """
    _load_builtins()
    if name in _REGISTRY:
        raise ConfigError(f"parser {name!r} is already registered")
    _REGISTRY[name] = factory


def parser_names() -> list[str]:
    """The registered parser names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def make_parser(name: str, options: Any = None) -> Parser:
    """A parser by registered name.

    Args:
        name: ``criteo``, ``slot``, ``csv``, ``parquet``, ``libsvm`` or a registered name.
        options: the parser's options (``SlotFormatConfig``, ``ColumnsConfig``,
            ``LibsvmConfig``), or None for its defaults.

    Raises:
        ConfigError: unknown name (lists the known ones) or options the parser rejects.
    """
    _load_builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"parser: {name!r} is not one of {', '.join(parser_names())}")
    return factory(options)


def _criteo(options: Any) -> Parser:
    if options is not None:
        raise ConfigError("parser 'criteo' takes no options (slots / columns are for the "
                          "'slot' and 'csv' / 'parquet' parsers)")
    return CriteoParser()


_REGISTRY["criteo"] = _criteo  # the others register in _BUILTIN_MODULES

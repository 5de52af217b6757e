"""libSVM and libFFM text: ``label idx:value ...`` / ``label field:idx:value ...``.

One example per line, whitespace-separated tokens, the format many public CTR sets
ship in (libSVM's ``svm-train`` input; libFFM's field-aware variant, Juan et al.
2016)::

    1 3:1 17:0.5 1024:1                 # libSVM:  parser: libsvm
    0 0:3:1 1:17:0.5 1:1024:1           # libFFM:  libsvm: {fields: true, num_fields: 2}

- label: ``0`` / ``1``, or ``-1`` / ``+1`` (libSVM's binary sets): -1 -> 0, +1 -> 1
  (any number equal to -1, 0 or 1, e.g. ``1.0``).
- libSVM (``fields: false``): every ``idx:value`` token is one id of the single
  weighted multi-valued feature ``features``, with weight ``value``.
- libFFM (``fields: true``): ``num_fields`` weighted multi-valued features ``field0``
  .. ``field{n-1}``; a token goes to the feature of its field (0-based); a field
  ``>= num_fields`` is a malformed line. Within a feature, ids keep line order.
- ``idx``: a non-negative decimal integer; its key is ``((slot + 1) << 33) | idx`` for
  ``idx < 2**32`` (else the hashed text), the slot-format scheme
  (:mod:`psfleet.data.slot_format`), slot = the feature's position (0 for libSVM, the
  field for libFFM). ``value``: a number (float32 weight).

Schema: no dense and no single-valued features; the features above, ``weighted``.

Speed: all lines of a chunk are parsed by whole-chunk numpy / Arrow operations
(:func:`~psfleet.data._tokens.split_tokens`); lines that path rejects (malformed, or
with non-ASCII bytes, ids of more than 20 digits) are parsed one by one by
:meth:`LibsvmParser._parse_line`, the reference, which names the malformed ones
(rate-limited warnings, or :class:`~psfleet.errors.DataError` with ``strict``).
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, model_validator

from psfleet.data._fields import generic_low_bits
from psfleet.data._ids import decimal_low_bits
from psfleet.data._slot_fast import _dense_floats
from psfleet.data._tokens import ChunkTokens, bags_to_rows, first_per_group, split_tokens
from psfleet.data.criteo import slot_prefixes
from psfleet.data.malformed import RateLimitedWarner
from psfleet.data.parsers import Parser, register_parser
from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk
from psfleet.errors import ConfigError

__all__ = ["LibsvmConfig", "LibsvmParser"]

logger = logging.getLogger(__name__)
_warner = RateLimitedWarner(log=logger)
_MAX_ID = 1 << 32


class LibsvmConfig(BaseModel):
    """Options of the ``libsvm`` parser (module docstring).

    Attributes:
        fields: tokens are ``field:idx:value`` (libFFM) instead of ``idx:value``.
        num_fields: the fields of libFFM data (required with ``fields: true``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fields: bool = False
    num_fields: int | None = None

    @model_validator(mode="after")
    def _fields_declared(self) -> LibsvmConfig:
        if self.fields and (self.num_fields is None or self.num_fields < 1):
            raise ValueError("num_fields: required with fields: true (libFFM), >= 1")
        if not self.fields and self.num_fields is not None:
            raise ValueError("num_fields: only used with fields: true (libFFM)")
        return self


class LibsvmParser:
    """Parser of libSVM / libFFM text (module docstring). Thread safe.

    Args:
        config: the options (None: libSVM).
    """

    kind: Literal["text", "parquet"] = "text"
    header = False

    def __init__(self, config: LibsvmConfig | None = None) -> None:
        self.config = config or LibsvmConfig()
        self.num_features = int(self.config.num_fields or 1) if self.config.fields else 1
        names = (tuple(f"field{i}" for i in range(self.num_features)) if self.config.fields
                 else ("features",))
        self.schema = FeatureSchema(dense=(), sparse=(), multi=names, weighted=True)
        self._prefixes = slot_prefixes(self.num_features)

    def parse(self, chunk: RawChunk, strict: bool, *, fast: bool = True) -> ParsedChunk:
        """Parse ``chunk`` (module docstring); ``fast=False`` parses every line with the
        reference code (same result)."""
        if not isinstance(chunk.payload, bytes):
            raise ConfigError(f"{chunk.source}: the libsvm parser reads text, not Parquet")
        if fast:
            tokens = split_tokens(chunk.payload)
            count = tokens.lines
            labels, good, rows, features, low, weights = self._vectorised(tokens)
        else:
            count = chunk.payload.count(b"\n") + (0 if chunk.payload.endswith(b"\n") else 1)
            labels, good = np.zeros(count, dtype=np.float32), np.zeros(count, dtype=bool)
            rows = features = np.zeros(0, dtype=np.int64)
            low, weights = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float32)
        todo = np.flatnonzero(~good).tolist()
        bad: list[tuple[int, str]] = []
        if todo:
            lines = chunk.payload.decode("utf-8", errors="replace").split("\n")
            more_rows: list[int] = []
            more_features: list[int] = []
            more_low: list[int] = []
            more_weights: list[float] = []
            for row in todo:
                parsed = self._parse_line(lines[row])
                if isinstance(parsed, str):
                    bad.append((chunk.first_line_no + row * chunk.line_step, parsed))
                    continue
                label, ids = parsed
                labels[row], good[row] = label, True
                more_rows.extend([row] * len(ids))
                for feature, key, weight in ids:
                    more_features.append(feature)
                    more_low.append(key)
                    more_weights.append(weight)
            rows = np.concatenate([rows, np.array(more_rows, dtype=np.int64)])
            features = np.concatenate([features, np.array(more_features, dtype=np.int64)])
            low = np.concatenate([low, np.array(more_low, dtype=np.uint64)])
            weights = np.concatenate([weights, np.array(more_weights, dtype=np.float32)])
        _warner.report(chunk.source, bad, strict, "libsvm line")
        example = np.cumsum(good) - 1  # a good line's example index
        jagged = bags_to_rows(example[rows], features, low | self._prefixes[features],
                              int(good.sum()), self.num_features, weights)
        kept = labels[good]
        return ParsedChunk(kept, np.zeros((len(kept), 0), dtype=np.float32),
                           np.zeros((len(kept), 0), dtype=np.uint64), len(bad), count, jagged)

    def _vectorised(self, tokens: ChunkTokens) -> tuple[
            npt.NDArray[np.float32], npt.NDArray[np.bool_], npt.NDArray[np.int64],
            npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """(labels [N], good [N], and per id of the good lines: row, feature, low key
        bits, weight) of the lines the whole-chunk path takes."""
        count, line, padded = tokens.lines, tokens.line, tokens.padded
        good = tokens.usable.copy()
        first = first_per_group(line)
        has_tokens = np.zeros(count, dtype=bool)
        has_tokens[line] = True
        good &= has_tokens
        # labels: the first token of a line, no ':', a number equal to -1, 0 or 1
        at = np.flatnonzero(first)
        values, ok = _dense_floats(padded, tokens.starts[at, None],
                                   (tokens.ends - tokens.starts)[at, None])
        value = values[:, 0]
        ok &= (tokens.colon[at] < 0) & ((value == -1) | (value == 0) | (value == 1))
        good[line[at[~ok]]] = False
        labels = np.zeros(count, dtype=np.float32)
        labels[line[at]] = value == 1
        # ids: the other tokens
        ids = np.flatnonzero(~first)
        colon, colon2 = tokens.colon[ids], tokens.colon2[ids]
        starts, ends = tokens.starts[ids], tokens.ends[ids]
        if self.config.fields:
            field, field_ok = decimal_low_bits(padded, starts, colon - starts)
            field_ok &= (colon >= 0) & (colon2 >= 0) & (field < np.uint64(self.num_features))
            index_start, value_start = colon + 1, colon2 + 1
            index_end = colon2
            feature = np.where(field_ok, field, 0).astype(np.int64)
        else:
            field_ok = (colon >= 0) & (colon2 < 0)
            index_start, index_end, value_start = starts, colon, colon + 1
            feature = np.zeros(len(ids), dtype=np.int64)
        low, low_ok = decimal_low_bits(padded, index_start, index_end - index_start)
        weight, weight_ok = _dense_floats(padded, value_start[:, None],
                                          (ends - value_start)[:, None])
        ok = field_ok & low_ok & weight_ok
        good[line[ids[~ok]]] = False
        keep = good[line[ids]]
        return (labels, good, line[ids[keep]], feature[keep], low[keep],
                weight[keep, 0].astype(np.float32))

    def _parse_line(self, line: str) -> tuple[float, list[tuple[int, int, float]]] | str:
        """(label, [(feature, low key bits, weight), ...]) of one line, or why it is
        malformed. The reference for every line."""
        tokens = line.split()
        if not tokens:
            return "empty line (no label)"
        try:
            label = float(tokens[0])
        except ValueError:
            label = np.nan
        if label not in (-1.0, 0.0, 1.0):
            return f"label {tokens[0]!r} is not 0 / 1 or -1 / +1"
        parts_wanted = 3 if self.config.fields else 2
        form = "field:idx:value" if self.config.fields else "idx:value"
        ids: list[tuple[int, int, float]] = []
        for token in tokens[1:]:
            parts = token.split(":")
            if len(parts) != parts_wanted:
                return f"token {token!r} is not {form}"
            feature = 0
            if self.config.fields:
                field = parts.pop(0)
                if not (field.isascii() and field.isdigit()):
                    return f"field of {token!r} is not a non-negative integer"
                feature = int(field)
                if feature >= self.num_features:
                    return (f"field {feature} of {token!r} is not below num_fields "
                            f"{self.num_features}")
            index, value = parts
            if not (index.isascii() and index.isdigit()):
                return f"index of {token!r} is not a non-negative integer"
            try:
                weight = float(value)
            except ValueError:
                return f"value of {token!r} is not a number"
            number = int(index)
            ids.append((feature, number if number < _MAX_ID else generic_low_bits(index),
                        weight))
        return (1.0 if label == 1.0 else 0.0), ids



def _libsvm(options: object) -> Parser:
    if options is not None and not isinstance(options, LibsvmConfig):
        raise ConfigError("parser 'libsvm' takes a LibsvmConfig (runner.libsvm)")
    return LibsvmParser(options)


register_parser("libsvm", _libsvm)

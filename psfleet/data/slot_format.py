"""PaddleRec's slot text format: one example per line, space-separated ``slot:value``.

Example (``criteo_paddlerec/slot_format``, PaddleRec ``models/rank/dnn``)::

    click:0 dense_feature:0.05 ... dense_feature:0.08 1:737395 2:210498 ... 26:306163

Which slots exist is declared in the config (:class:`SlotFormatConfig`), as in
PaddleRec's ``sparse_slots`` / ``dense_slots``:

- ``label_slot`` (``click``): the label, ``0`` or ``1``.
- ``dense_slots`` (``{dense_feature: 13}``): name -> number of float values; the
  values of all dense slots, in declaration order, form the dense features. Missing
  values are padded with 0.0.
- ``sparse_slots`` (``["1", ..., "26"]``, or name -> width): integer ids; a slot of
  width ``w`` contributes ``w`` key columns (e.g. ``{feat_idx: 39}``). A missing slot
  (or missing values) is padded with id 0, as PaddleRec pads missing slots.
- ``multi_slots`` (``["2..301"]``): multi-valued (variable-length) slots: every token
  of such a slot on the line, any count (0: an empty bag), any order, becomes one id of
  the example's bag for that slot (the ``jagged`` features, :class:`~psfleet.data.
  jagged.JaggedRows`). ``"a..b"`` stands for the names ``"a"``, ``"a+1"``, ..., ``"b"``
  (also in a ``sparse_slots`` list).
- tokens of undeclared slots are ignored (as PaddleRec's readers do);
  ``value_first: true`` reads ``value:slot`` tokens (the Fleet ``feasign:slot`` order).
- ``dense_transform``: ``none`` (default), ``log1p`` or ``standardize`` (with
  ``dense_mean`` / ``dense_std``, one per dense column), :mod:`psfleet.data._dense`.

PaddleRec's ``slot_dnn`` feasign demo (``feasign:slot``, slot 1 the label)::

    slots: {label_slot: "1", value_first: true, dense_slots: {}, sparse_slots: [],
            multi_slots: ["2..301"]}

Keys: sparse column ``c`` (0-based over all sparse columns, then the multi-valued slots
after them: the position in ``schema.features``) with id ``v`` gets ``((c + 1) << 33) |
v`` for ``v < 2**32`` and ``((c + 1) << 33) | (1 << 32) | (1 + crc31(str(v)))``
otherwise (the id's text, as on the line), the scheme of :mod:`psfleet.data.criteo`,
so features never share keys.

Malformed lines (no or a non-0/1 label, a non-numeric value, more values than a slot
declares, a token without ``:``) are counted and skipped with a rate-limited warning
naming ``file:line``; ``strict`` raises :class:`~psfleet.errors.DataError`.

Speed: without multi-valued slots, the lines of a chunk that have the token layout of
its first well-formed line (the usual case: every line lists the same slots in the same
order) are parsed column-wise by :mod:`psfleet.data._slot_fast`; with multi-valued
slots (or when more than a tenth of a chunk's lines have other layouts), lines are
parsed by whole-chunk numpy operations whatever their layout
(:mod:`psfleet.data._slot_variable`). Lines neither path takes are parsed one by one by
:meth:`SlotParser._parse_line`, the reference. The result is the same either way.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from psfleet.data._dense import DenseTransform, check_dense_transform, transform_dense
from psfleet.data._fields import NOT_HEX_BIT, generic_low_bits
from psfleet.data._slot_fast import TokenLayout, parse_layout
from psfleet.data._slot_variable import SlotLayout, VariableRows, parse_variable
from psfleet.data._tokens import bags_to_rows
from psfleet.data.criteo import slot_prefixes
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.malformed import RateLimitedWarner
from psfleet.data.parsers import Parser, register_parser
from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk
from psfleet.errors import ConfigError

__all__ = ["SlotFormatConfig", "SlotParser", "expand_slot_names"]

logger = logging.getLogger(__name__)
_warner = RateLimitedWarner(log=logger)
_MAX_ID = 1 << 32
_LAYOUT_PROBE_LINES = 16  # lines searched for a well-formed one to take the layout from
_MAX_RANGE = 100_000  # names one "a..b" item may stand for
# Without multi-valued slots, the lines the one-layout path leaves are parsed by the
# any-layout path when they are more than 1 / _VARIABLE_SHARE of the chunk (a second
# whole-chunk pass costs about as much as that share parsed line by line).
_VARIABLE_SHARE = 10


def expand_slot_names(names: list[str]) -> list[str]:
    """``names`` with every ``"a..b"`` item (integers ``a <= b``) replaced by the names
    ``"a"``, ``"a+1"``, ..., ``"b"``.

    Raises:
        ValueError: a range item that is not two integers ``a <= b`` (at most 100,000
            names).
    """
    out: list[str] = []
    for name in names:
        low, dots, high = name.partition("..")
        if not dots:
            out.append(name)
            continue
        if not (low.isdigit() and high.isdigit() and int(low) <= int(high)
                and int(high) - int(low) < _MAX_RANGE):
            raise ValueError(f"{name!r} is not a range 'a..b' of integers a <= b")
        out.extend(str(i) for i in range(int(low), int(high) + 1))
    return out


class SlotFormatConfig(BaseModel):
    """The slots of the slot text format (module docstring); defaults are PaddleRec's
    rank/dnn Criteo slots."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label_slot: str = "click"
    dense_slots: dict[str, int] = Field(default_factory=lambda: {"dense_feature": 13})
    sparse_slots: list[str] | dict[str, int] = Field(
        default_factory=lambda: [str(i) for i in range(1, 27)])
    multi_slots: list[str] = []
    value_first: bool = False
    dense_transform: DenseTransform = "none"
    dense_mean: list[float] | None = None
    dense_std: list[float] | None = None

    @field_validator("dense_slots")
    @classmethod
    def _dense_widths(cls, slots: dict[str, int]) -> dict[str, int]:
        if any(w < 1 for w in slots.values()):
            raise ValueError("every dense slot needs a width >= 1")
        return slots

    @field_validator("sparse_slots")
    @classmethod
    def _sparse_widths(cls, slots: list[str] | dict[str, int]) -> list[str] | dict[str, int]:
        if isinstance(slots, list):
            slots = expand_slot_names(slots)
        widths = slots.values() if isinstance(slots, dict) else [1] * len(slots)
        if any(w < 1 for w in widths):
            raise ValueError("every sparse slot needs a width >= 1")
        if isinstance(slots, list) and len(set(slots)) != len(slots):
            raise ValueError("sparse slot names must be distinct")
        return slots

    @field_validator("multi_slots")
    @classmethod
    def _multi_names(cls, slots: list[str]) -> list[str]:
        slots = expand_slot_names(slots)
        if len(set(slots)) != len(slots):
            raise ValueError("multi-valued slot names must be distinct")
        return slots

    @model_validator(mode="after")
    def _some_sparse_and_stats(self) -> SlotFormatConfig:
        if not self.sparse_slots and not self.multi_slots:
            raise ValueError("sparse_slots / multi_slots: declare at least one sparse or "
                             "multi-valued slot")
        check_dense_transform(self.dense_transform, self.dense_mean, self.dense_std,
                              sum(self.dense_slots.values()))
        return self

    def sparse_widths(self) -> dict[str, int]:
        """Sparse slot name -> width, in declaration order."""
        if isinstance(self.sparse_slots, dict):
            return dict(self.sparse_slots)
        return {name: 1 for name in self.sparse_slots}


class SlotParser:
    """Parser of the slot text format (module docstring). Thread safe.

    Args:
        config: the declared slots.

    Raises:
        ConfigError: a slot name is declared twice (label, dense and sparse together).
    """

    kind: Literal["text", "parquet"] = "text"
    header = False

    def __init__(self, config: SlotFormatConfig | None = None) -> None:
        self.config = config or SlotFormatConfig()
        self._dense = dict(self.config.dense_slots)
        self._sparse = self.config.sparse_widths()
        self._multi = {name: index for index, name in enumerate(self.config.multi_slots)}
        names = [self.config.label_slot, *self._dense, *self._sparse, *self._multi]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"slots: slot names {repeated} are declared twice (label, "
                              "dense, sparse and multi-valued slots together)")
        self.num_dense = sum(self._dense.values())
        self.num_slots = sum(self._sparse.values())
        self.schema = FeatureSchema(dense=_column_names(self._dense),
                                    sparse=_column_names(self._sparse),
                                    multi=tuple(self._multi))
        all_prefixes = slot_prefixes(self.num_slots + len(self._multi))
        self._prefixes = all_prefixes[:self.num_slots]
        self._multi_prefixes = all_prefixes[self.num_slots:]
        self._variable = SlotLayout.build(self.config.label_slot, self._dense, self._sparse,
                                          list(self._multi), self.config.value_first)
        self._dense_start = dict(zip(self._dense, np.cumsum([0, *self._dense.values()]),
                                     strict=False))
        self._sparse_start = dict(zip(self._sparse, np.cumsum([0, *self._sparse.values()]),
                                      strict=False))

    def parse(self, chunk: RawChunk, strict: bool, *, fast: bool = True) -> ParsedChunk:
        """Parse ``chunk``; malformed lines are skipped with a rate-limited warning
        naming ``file:line``, or raise :class:`~psfleet.errors.DataError` if ``strict``.

        Without multi-valued slots, lines with the token layout of the chunk's first
        well-formed line are parsed column-wise (:mod:`psfleet.data._slot_fast`); with
        them, all lines by whole-chunk operations (:mod:`psfleet.data._slot_variable`).
        The others, and all lines with ``fast=False``, are parsed one by one
        (:meth:`_parse_line`, the reference). Every path gives the same result.
        """
        if not isinstance(chunk.payload, bytes):
            raise ConfigError(f"{chunk.source}: the slot parser reads text, not Parquet")
        lines: list[str] = []
        variable: VariableRows | None = None
        layout = self._layout(chunk.payload) if fast and not self._multi else None
        if layout is not None:
            rows = parse_layout(chunk.payload, layout, self.num_dense, self.num_slots)
            labels, dense, sparse, good = rows.labels, rows.dense, rows.sparse, rows.parsed
            if int((~good).sum()) * _VARIABLE_SHARE > len(good):  # many other layouts
                other = parse_variable(chunk.payload, self._variable, self.num_dense,
                                       self.num_slots)
                take = other.parsed & ~good
                labels[take], dense[take], sparse[take] = (other.labels[take],
                                                           other.dense[take],
                                                           other.sparse[take])
                good |= take
        elif fast:
            variable = parse_variable(chunk.payload, self._variable, self.num_dense,
                                      self.num_slots)
            labels, dense, sparse, good = (variable.labels, variable.dense, variable.sparse,
                                           variable.parsed)
        else:
            lines = _split_lines(chunk.payload)
            labels = np.zeros(len(lines), dtype=np.float32)
            dense = np.zeros((len(lines), self.num_dense), dtype=np.float32)
            sparse = np.zeros((len(lines), self.num_slots), dtype=np.uint64)
            good = np.zeros(len(lines), dtype=bool)
        count = len(good)
        todo = np.flatnonzero(~good).tolist()
        if todo and not lines:
            lines = _split_lines(chunk.payload)
        bad: list[tuple[int, str]] = []
        bag_rows: list[int] = []
        bag_features: list[int] = []
        bag_ids: list[int] = []
        with np.errstate(over="ignore"):  # a float beyond float32's range is stored as inf
            for row in todo:
                bags: list[list[int]] = [[] for _ in self._multi]
                reason = self._parse_line(lines[row], row, labels, dense, sparse, bags)
                if reason is None:
                    good[row] = True
                    for feature, bag in enumerate(bags):
                        bag_rows.extend([row] * len(bag))
                        bag_features.extend([feature] * len(bag))
                        bag_ids.extend(bag)
                else:
                    bad.append((chunk.first_line_no + row * chunk.line_step, reason))
        _warner.report(chunk.source, bad, strict, "slot-format line")
        sparse |= self._prefixes
        if self.config.dense_transform != "none":
            dense = transform_dense(dense, self.config.dense_transform, self.config.dense_mean,
                                    self.config.dense_std)
        jagged = None
        if self._multi:
            jagged = self._bags(variable, np.array(bag_rows, dtype=np.int64),
                                np.array(bag_features, dtype=np.int64),
                                np.array(bag_ids, dtype=np.uint64), good)
        if bad:
            labels, dense, sparse = labels[good], dense[good], sparse[good]
        return ParsedChunk(labels, dense, sparse, malformed=len(bad), lines=count,
                           jagged=jagged)


    def _bags(self, variable: VariableRows | None, rows: npt.NDArray[np.int64],
              features: npt.NDArray[np.int64], ids: npt.NDArray[np.uint64],
              good: npt.NDArray[np.bool_]) -> JaggedRows:
        """The multi-valued slots of the good lines, example-major: the ids the
        vectorised path read plus those the reference read (``rows``, ``features``,
        ``ids``; each line comes from one of them, so a stable sort keeps token order)."""
        if variable is not None:
            rows = np.concatenate([variable.multi_row, rows])
            features = np.concatenate([variable.multi_feature, features])
            ids = np.concatenate([variable.multi_low, ids])
        rows_of_good = np.cumsum(good) - 1  # a good line's example index
        return bags_to_rows(rows_of_good[rows], features, ids | self._multi_prefixes[features],
                            int(good.sum()), len(self._multi))

    def _layout(self, data: bytes) -> TokenLayout | None:
        """The token layout of the first of the chunk's first few lines that is
        well-formed, or None (no such line, or its names cannot be matched bytewise)."""
        scratch = (np.zeros(1, np.float32), np.zeros((1, self.num_dense), np.float32),
                   np.zeros((1, self.num_slots), np.uint64))
        start = 0
        for _ in range(_LAYOUT_PROBE_LINES):
            end = data.find(b"\n", start)
            line = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
            start = end + 1
            if self._parse_line(line, 0, *scratch) is not None:
                if end < 0:
                    return None
                continue
            pairs = [token.partition(":") for token in line.split()]
            names = [right if self.config.value_first else left for left, _, right in pairs]
            layout = self._layout_of(names)
            return layout if layout.usable() else None
        return None

    def _layout_of(self, names: list[str]) -> TokenLayout:
        """Where the values of a well-formed line with these slot names go (the walk of
        :meth:`_parse_line`)."""
        label_token = -1
        dense: dict[int, int] = {}
        sparse: dict[int, int] = {}
        dense_used = dict.fromkeys(self._dense, 0)
        sparse_used = dict.fromkeys(self._sparse, 0)
        for index, name in enumerate(names):
            if name == self.config.label_slot:
                label_token = index
            elif name in dense_used:
                dense[index] = int(self._dense_start[name]) + dense_used[name]
                dense_used[name] += 1
            elif name in sparse_used:
                sparse[index] = int(self._sparse_start[name]) + sparse_used[name]
                sparse_used[name] += 1
        return TokenLayout(
            names=tuple(name.encode("utf-8", "surrogatepass") for name in names),
            value_first=self.config.value_first, label_token=label_token,
            dense_tokens=tuple(dense), dense_columns=tuple(dense.values()),
            sparse_tokens=tuple(sparse), sparse_columns=tuple(sparse.values()))

    def _parse_line(self, line: str, row: int, labels: np.ndarray, dense: np.ndarray,
                    sparse: np.ndarray, bags: list[list[int]] | None = None) -> str | None:
        """Fill row ``row`` (all zeros before) and append the multi-valued slots' ids
        (low key bits) to ``bags`` (one list per slot); returns why the line is
        malformed, or None. The reference for every line."""
        label: str | None = None
        dense_used = dict.fromkeys(self._dense, 0)
        sparse_used = dict.fromkeys(self._sparse, 0)
        value_first = self.config.value_first
        for token in line.split():
            left, sep, right = token.partition(":")
            if not sep:
                return f"token {token!r} has no ':'"
            name, value = (right, left) if value_first else (left, right)
            if name == self.config.label_slot:
                label = value
            elif name in dense_used:
                used = dense_used[name]
                if used >= self._dense[name]:
                    return f"dense slot {name!r} has more than {self._dense[name]} values"
                try:
                    dense[row, self._dense_start[name] + used] = float(value)
                except ValueError:
                    return f"dense slot {name!r} value {value!r} is not a number"
                dense_used[name] = used + 1
            elif name in sparse_used:
                used = sparse_used[name]
                if used >= self._sparse[name]:
                    return f"sparse slot {name!r} has more than {self._sparse[name]} values"
                if not (value.isascii() and value.isdigit()):
                    return f"sparse slot {name!r} id {value!r} is not a non-negative integer"
                number = int(value)
                low = number if number < _MAX_ID else generic_low_bits(value) | NOT_HEX_BIT
                sparse[row, self._sparse_start[name] + used] = low
                sparse_used[name] = used + 1
            elif name in self._multi:
                if not (value.isascii() and value.isdigit()):
                    return (f"multi-valued slot {name!r} id {value!r} is not a non-negative "
                            "integer")
                if bags is not None:
                    number = int(value)
                    bags[self._multi[name]].append(
                        number if number < _MAX_ID else generic_low_bits(value) | NOT_HEX_BIT)
        if label is None:
            return f"label slot {self.config.label_slot!r} is missing"
        if label not in ("0", "1"):
            return f"label {label!r} is not 0 or 1"
        labels[row] = 1.0 if label == "1" else 0.0
        return None


def _column_names(widths: dict[str, int]) -> tuple[str, ...]:
    """One name per column: the slot's name, or ``name[i]`` for a slot of width > 1."""
    return tuple(name if width == 1 else f"{name}[{i}]"
                 for name, width in widths.items() for i in range(width))


def _split_lines(data: bytes) -> list[str]:
    """The chunk's lines as text (a final empty line is the trailing newline)."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _slot(options: object) -> Parser:
    if options is not None and not isinstance(options, SlotFormatConfig):
        raise ConfigError("parser 'slot' takes a SlotFormatConfig (runner.slots)")
    return SlotParser(options)


register_parser("slot", _slot)

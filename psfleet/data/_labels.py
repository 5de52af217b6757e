"""Labels as numbers or text (:class:`~psfleet.data.columnar.ColumnsConfig`).

- default: numbers, ``0`` / ``1`` (``0.0`` / ``1.0`` accepted).
- ``label_positive: ">50K"``: that text is 1; with ``label_negative: ["<=50K"]`` those
  texts are 0 and any other text is a malformed line; without ``label_negative`` every
  other text is 0.
- ``label_map: {yes: 1, no: 0}``: each listed text to its label; any other text is a
  malformed line.

Label texts are compared after trimming surrounding whitespace (``" >50K"`` in a
``", "``-separated file is ``">50K"``). A malformed line's message names the value.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LabelRule"]


class LabelRule:
    """How label values become 0.0 / 1.0 (module docstring). Thread safe.

    Args:
        positive: ``label_positive`` or None.
        negative: ``label_negative`` or None.
        mapping: ``label_map`` or None (not together with ``positive``).
    """

    def __init__(self, positive: str | None, negative: list[str] | None,
                 mapping: dict[str, int] | None) -> None:
        self.numeric = positive is None and mapping is None
        self._positive = positive
        self._negative = negative
        if mapping is not None:
            self._texts = list(mapping)
            self._labels = np.array([float(v) for v in mapping.values()], dtype=np.float64)
        elif positive is not None and negative is not None:
            self._texts = [positive, *negative]
            self._labels = np.array([1.0] + [0.0] * len(negative), dtype=np.float64)
        else:
            self._texts = []
            self._labels = np.zeros(0, dtype=np.float64)

    def describe(self) -> str:
        """What the labels must be, for messages."""
        if self.numeric:
            return "0 or 1 (or set columns.label_positive / label_map for text labels)"
        return f"one of {self._texts!r} (columns.label_positive / label_negative / label_map)"

    def one(self, text: str) -> float | None:
        """The label of one value, or None if it has none."""
        if self.numeric:
            try:
                value = float(text)
            except ValueError:
                return None
            return value if value in (0.0, 1.0) else None
        text = text.strip()
        if self._positive is not None and self._negative is None:
            return 1.0 if text == self._positive else 0.0
        if text in self._texts:
            return float(self._labels[self._texts.index(text)])
        return None

    def column(self, array: pa.Array | pa.ChunkedArray
               ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None:
        """(labels [N] float64, valid [N] bool) of a text column (vectorised), or None if
        it is not valid UTF-8 (the caller reads it line by line)."""
        try:
            text = pc.utf8_trim_whitespace(pc.cast(array, pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        text = pc.fill_null(text, "")
        count = len(text)
        if self._positive is not None and self._negative is None:
            labels = np.asarray(pc.equal(text, self._positive).to_numpy(zero_copy_only=False),
                                dtype=np.float64)
            return labels, np.ones(count, dtype=bool)
        index = pc.index_in(text, value_set=pa.array(self._texts, pa.string()))
        found = np.asarray(pc.is_valid(index).to_numpy(zero_copy_only=False), dtype=bool)
        at = np.asarray(pc.fill_null(index, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        labels = np.where(found, self._labels[at] if len(self._labels) else 0.0, 0.0)
        return labels.astype(np.float64), found

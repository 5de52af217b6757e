"""Raw little-endian buffers for keys (uint64) and values (float32) on the wire."""

from __future__ import annotations

import numpy as np

from psfleet.errors import InvalidRequestError

__all__ = ["keys_to_bytes", "keys_from_bytes", "floats_to_bytes", "floats_from_bytes",
           "int64s_from_bytes"]

_KEY = np.dtype("<u8")
_FLOAT = np.dtype("<f4")
_INT64 = np.dtype("<i8")


def keys_to_bytes(keys: np.ndarray) -> bytes:
    """Encode keys (uint64[N], or int64 holding the same bits) as 8N bytes."""
    if keys.dtype == np.int64:
        keys = keys.view(np.uint64)
    return np.ascontiguousarray(keys, dtype=_KEY).tobytes()


def keys_from_bytes(buf: bytes) -> np.ndarray:
    """Decode 8N bytes into a read-only uint64[N] view.

    Raises:
        InvalidRequestError: the length is not a multiple of 8.
    """
    if len(buf) % 8:
        raise InvalidRequestError(f"key buffer of {len(buf)} bytes is not a multiple of 8")
    return np.frombuffer(buf, dtype=_KEY)


def floats_to_bytes(values: np.ndarray) -> bytes:
    """Encode float32 values of any shape, row-major, as 4N bytes."""
    return np.ascontiguousarray(values, dtype=_FLOAT).tobytes()


def floats_from_bytes(buf: bytes, dim: int | None = None) -> np.ndarray:
    """Decode 4N bytes into a read-only float32 view: rows [N / dim, dim] when ``dim``
    is given (also for dim 1), else flat [N].

    Raises:
        InvalidRequestError: the length does not fit ``dim`` columns of float32.
    """
    width = 1 if dim is None else dim
    if len(buf) % (4 * width):
        raise InvalidRequestError(
            f"value buffer of {len(buf)} bytes does not hold float32 rows of {dim}")
    flat = np.frombuffer(buf, dtype=_FLOAT)
    return flat if dim is None else flat.reshape(-1, dim)


def int64s_from_bytes(buf: bytes) -> np.ndarray:
    """Decode 8N bytes into a read-only int64[N] view (a dense table's flat indices).

    Raises:
        InvalidRequestError: the length is not a multiple of 8.
    """
    if len(buf) % 8:
        raise InvalidRequestError(f"int64 buffer of {len(buf)} bytes is not a multiple of 8")
    return np.frombuffer(buf, dtype=_INT64)

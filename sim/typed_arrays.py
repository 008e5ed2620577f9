"""Flat typed arrays (8 bytes an item, no per-item objects) for per-request state, and numpy copies of them."""

from __future__ import annotations

from array import array

import numpy as np


def typed(code: str, values: np.ndarray) -> array:
    """A typed array ("d": float64, "q": int64) holding values."""
    a = array(code)
    a.frombytes(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
    return a


def numpy_copy(a: array) -> np.ndarray:
    """A numpy copy of a typed array."""
    return np.frombuffer(a, dtype=np.float64 if a.typecode == "d" else np.int64).copy()

"""Profile input checks: what a profile is built from and looked up with.

The profiler's arrays must be finite numbers of the expected shape (errors
name the file and key). Range: inputs outside the profiled range are clamped to it with a
`ProfileRangeWarning` (`out_of_range="clip"`) or rejected with ValueError
(`out_of_range="raise"`). Decode KV usage between 0 and the lowest measured
point (one running request) is inside the range: ITL there is the
single-request ITL and throughput scales with the fraction of a request.
Above the highest measured KV usage of the neighbouring rows it is out of
range. NaN inputs are always a ValueError. Warnings name the value, so in a
hot loop that leaves the range often, filter ProfileRangeWarning or use the
vectorised calls (one warning per call).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Literal

import numpy as np

OutOfRange = Literal["clip", "raise"]


class ProfileRangeWarning(UserWarning):
    """An input was outside the profiled range and was clamped to it."""


def check_out_of_range(out_of_range: str, *, source: str) -> None:
    if out_of_range not in ("clip", "raise"):
        raise ValueError(f"{source}: out_of_range must be 'clip' or 'raise', got {out_of_range!r}")


def profile_array(arrays: Mapping[str, np.ndarray], key: str, *, source: str, ndim: int = 1) -> np.ndarray:
    """Fetch `key` as a finite float array of `ndim` dims; errors name source and key."""
    if key not in arrays:
        raise ValueError(f"{source}: missing key {key!r} (has {sorted(arrays)})")
    raw = np.asarray(arrays[key])
    if raw.ndim != ndim:
        raise ValueError(f"{source}: key {key!r} must be {ndim}-D, got shape {raw.shape}")
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"{source}: key {key!r} must be numeric, got dtype {raw.dtype}")
    a = raw.astype(float)
    if a.size == 0:
        raise ValueError(f"{source}: key {key!r} is empty")
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ValueError(f"{source}: key {key!r} has {int(bad.sum())} non-finite values (first at index {i}: {a.ravel()[i]})")
    return a


def clamp(value: float, lo: float, hi: float, *, what: str, unit: str, source: str, out_of_range: str) -> float:
    """Clamp `value` to [lo, hi]: warn (clip) or raise; NaN always raises."""
    if value != value:  # NaN
        raise ValueError(f"profile {source}: {what} is NaN")
    if lo <= value <= hi:
        return value
    side, bound = ("below the profiled min", lo) if value < lo else ("above the profiled max", hi)
    msg = f"profile {source}: {what} {value:g} {unit} is {side} {bound:g} {unit}"
    if out_of_range == "raise":
        raise ValueError(f"{msg} (out_of_range='raise')")
    warnings.warn(f"{msg}; clamped (out_of_range='clip')", ProfileRangeWarning, stacklevel=4)
    return bound


def clamp_many(
    values: np.ndarray, lo, hi, *, what: str, unit: str, source: str, out_of_range: str, warn: bool = True
) -> np.ndarray:
    """Vector clamp: one warning (or error) per call naming the count and extremes.

    warn=False clamps silently (internal callers whose inputs are in range up to rounding).
    """
    v = np.asarray(values, dtype=float)
    if np.isnan(v).any():
        raise ValueError(f"profile {source}: {what} has NaN values")
    low, high = v < lo, v > hi
    n = int(low.sum() + high.sum())
    if n == 0:
        return v
    if not warn:
        return np.clip(v, lo, hi)
    msg = (
        f"profile {source}: {n} of {v.size} {what} values outside the profiled range "
        f"(min {v.min():g}, max {v.max():g} {unit})"
    )
    if out_of_range == "raise":
        raise ValueError(f"{msg} (out_of_range='raise')")
    warnings.warn(f"{msg}; clamped (out_of_range='clip')", ProfileRangeWarning, stacklevel=4)
    return np.clip(v, lo, hi)



__all__ = ["OutOfRange", "ProfileRangeWarning", "check_out_of_range", "clamp", "clamp_many", "profile_array"]

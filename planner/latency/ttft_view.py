"""The TTFT sizing and correction read: an idle prefill engine's mean and p90 TTFT by prompt length.

Two sources give it. The profile (`ProfileTtftView`) measured one single-request
TTFT per prompt length, so its p90 is its mean; that is what the planner always
used. A published latency model (the one the router routes with), tabulated at
prompt lengths on an idle engine by whoever fetched it (`TabulatedTtftView`),
gives both a mean and a p90, so router and planner share one view of latency.

Sizing takes the mean as the service time (the queue's offered load) and the p90
for the reachability check (which requests can meet the TTFT target at all, and
how long each may wait); the correction step compares the observed TTFT with the
mean of the same source. Between tabulated points the view is linear in log-log
coordinates (TTFT follows a near power law in prompt length); below the shortest
point it is that point's TTFT (the fixed per-batch cost); beyond the longest it
grows linearly with length, as the profile and the simulator extrapolate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from planner.latency.profile import PrefillProfile

Quantile = Literal["mean", "p90"]


class TtftView(Protocol):
    """Single-request TTFT (ms) by prompt length, and where it comes from (for messages)."""

    @property
    def source(self) -> str: ...

    @property
    def published(self) -> bool: ...

    def ttft_ms_many(self, isl_tokens: np.ndarray, *, quantile: Quantile = "mean") -> np.ndarray: ...

    def ttft_ms_at(self, isl_tokens: float, *, quantile: Quantile = "mean") -> float: ...


def extrapolated_ttft_ms(profile: PrefillProfile, isl_tokens: np.ndarray) -> np.ndarray:
    """The profile's single-request TTFT (ms) at each prompt length (tokens).

    Shorter than the profiled range: the shortest measured TTFT. Longer: the
    longest measured TTFT scaled linearly with length (prefill is compute-bound there).
    """
    isl = np.asarray(isl_tokens, dtype=float)
    lo, hi = profile.isl_range_tokens
    ttft = profile.ttft_ms_many(np.clip(isl, lo, hi))
    return np.where(isl > hi, ttft * isl / hi, ttft)


@dataclass(frozen=True)
class ProfileTtftView:
    """The profile's TTFT: one measured figure per length, so the p90 is the mean."""

    profile: PrefillProfile
    source: str = "profile"
    published: bool = False

    def ttft_ms_many(self, isl_tokens: np.ndarray, *, quantile: Quantile = "mean") -> np.ndarray:
        return extrapolated_ttft_ms(self.profile, isl_tokens)

    def ttft_ms_at(self, isl_tokens: float, *, quantile: Quantile = "mean") -> float:
        # the profile's scalar path (a few ulps from the vectorised one), as sizing always read it
        lo, hi = self.profile.isl_range_tokens
        return self.profile.ttft_ms_at(isl_tokens) if lo <= isl_tokens <= hi else \
            float(extrapolated_ttft_ms(self.profile, np.array([isl_tokens]))[0])


@dataclass(frozen=True)
class TabulatedTtftView:
    """Mean and p90 idle-engine TTFT (ms) at increasing prompt lengths (tokens), e.g. a published model's.

    source: what the figures are, for messages (e.g. "published model v3").
    """

    isl_tokens: tuple[float, ...]
    mean_ms: tuple[float, ...]
    p90_ms: tuple[float, ...]
    source: str
    published: bool = True

    def __post_init__(self) -> None:
        n = len(self.isl_tokens)
        if n < 2:
            raise ValueError(f"TTFT view {self.source}: isl_tokens needs at least 2 points, got {n}")
        for name in ("mean_ms", "p90_ms"):
            values = getattr(self, name)
            if len(values) != n:
                raise ValueError(f"TTFT view {self.source}: {name} has {len(values)} points, isl_tokens {n}")
            bad = [v for v in values if not (math.isfinite(v) and v > 0)]
            if bad:
                raise ValueError(f"TTFT view {self.source}: {name} must be finite and > 0 ms, got {bad[0]!r}")
        x = np.asarray(self.isl_tokens, dtype=float)
        if not (np.all(np.isfinite(x)) and x[0] > 0 and np.all(np.diff(x) > 0)):
            raise ValueError(f"TTFT view {self.source}: isl_tokens must be > 0 and strictly increasing, "
                             f"got {list(self.isl_tokens)}")

    @classmethod
    def from_points(cls, isl_tokens: Sequence[float], mean_ms: Sequence[float], p90_ms: Sequence[float], *,
                    source: str, published: bool = True) -> "TabulatedTtftView":
        """From arrays (numpy or lists); the values are stored as plain floats."""
        as_tuple = lambda a: tuple(float(v) for v in np.asarray(a, dtype=float).ravel())  # noqa: E731
        return cls(as_tuple(isl_tokens), as_tuple(mean_ms), as_tuple(p90_ms), source=source, published=published)

    def ttft_ms_many(self, isl_tokens: np.ndarray, *, quantile: Quantile = "mean") -> np.ndarray:
        if quantile not in ("mean", "p90"):
            raise ValueError(f"TTFT view {self.source}: quantile must be 'mean' or 'p90', got {quantile!r}")
        ys = np.log(np.asarray(self.mean_ms if quantile == "mean" else self.p90_ms))
        xs = np.log(np.asarray(self.isl_tokens))
        isl = np.maximum(np.asarray(isl_tokens, dtype=float), 1e-9)
        hi = self.isl_tokens[-1]
        out = np.exp(np.interp(np.log(np.minimum(isl, hi)), xs, ys))
        return np.where(isl > hi, out * isl / hi, out)

    def ttft_ms_at(self, isl_tokens: float, *, quantile: Quantile = "mean") -> float:
        return float(self.ttft_ms_many(np.array([float(isl_tokens)]), quantile=quantile)[0])


def ttft_view_of(profile: PrefillProfile, view: TtftView | None) -> TtftView:
    """The view given, else the profile's."""
    return view if view is not None else ProfileTtftView(profile)


"""One engine configuration's latency profile: prefill vs input length, decode vs load (planner.latency.decode_profile).

The profiler measures a handful of points: prefill TTFT and throughput at ~17
input lengths, and decode ITL and throughput at a few concurrency levels for
each of ~6 context lengths. The planner, the simulator and the router need
values between those points, millions of times per simulated day, so every
interpolant is built once at construction and a scalar lookup is a bisect plus
one cubic (a few microseconds, no numpy call). Vectorised `*_many` variants take
arrays.

Method, and why it differs from Dynamo's (leave-one-out errors on the real
profiles are measured by benchmarks/bench_interpolation.py and quoted in the
sizing docs):

* Prefill: monotone piecewise-cubic Hermite (PCHIP) in log-log coordinates,
  for TTFT and for throughput/GPU separately. Both follow near power laws in
  ISL (fixed overhead at short prompts, linear plus quadratic attention cost
  at long ones), so in log-log they are close to straight lines and a cubic
  between points fits better. PCHIP never leaves the range of its two
  neighbouring points, keeps TTFT monotone wherever the measurements are, and
  is exact at every measured point. Dynamo's unconstrained cubic overshoots
  next to a noisy point (e.g. the 70B TP8 pre-swept outlier) by up to 4x.

Inputs outside the profiled range: planner.latency.profile_checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from planner.latency.decode_profile import DecodeProfile
from planner.latency.pchip import Pchip
from planner.latency.profile_checks import OutOfRange, check_out_of_range, clamp, clamp_many, profile_array

PREFILL_KEYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")


@dataclass(frozen=True)
class PrefillProfile:
    """Prefill TTFT and throughput/GPU as functions of input length (ISL).

    isl_tokens: measured ISLs, tokens, strictly increasing.
    ttft_ms: single-request TTFT at each ISL, ms.
    throughput_per_gpu: prefill tokens/s/GPU at each ISL.
    """

    isl_tokens: np.ndarray
    ttft_ms: np.ndarray
    throughput_per_gpu: np.ndarray
    source: str
    out_of_range: OutOfRange = "clip"
    _ttft: Pchip = field(init=False, repr=False, compare=False)
    _thpt: Pchip = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_out_of_range(self.out_of_range, source=self.source)
        x = np.asarray(self.isl_tokens, dtype=float)
        n = len(x)
        for key, arr in (("prefill_ttft", self.ttft_ms), ("prefill_thpt_per_gpu", self.throughput_per_gpu)):
            if len(arr) != n:
                raise ValueError(f"{self.source}: key {key!r} has {len(arr)} points, 'prefill_isl' has {n}")
        if n < 2:
            raise ValueError(f"{self.source}: key 'prefill_isl' needs at least 2 points, got {n}")
        if np.any(np.diff(x) <= 0):
            raise ValueError(f"{self.source}: key 'prefill_isl' must be strictly increasing, got {x.tolist()}")
        if np.any(x <= 0):
            raise ValueError(f"{self.source}: key 'prefill_isl' must be > 0, got min {x.min():g}")
        if np.any(np.asarray(self.ttft_ms) <= 0):
            raise ValueError(f"{self.source}: key 'prefill_ttft' must be > 0 ms, got min {np.min(self.ttft_ms):g}")
        if np.any(np.asarray(self.throughput_per_gpu) <= 0):
            raise ValueError(
                f"{self.source}: key 'prefill_thpt_per_gpu' must be > 0, got min {np.min(self.throughput_per_gpu):g}"
            )
        object.__setattr__(self, "_ttft", Pchip(x, self.ttft_ms, log_log=True))
        object.__setattr__(self, "_thpt", Pchip(x, self.throughput_per_gpu, log_log=True))

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray], *, source: str, out_of_range: OutOfRange = "clip"
    ) -> "PrefillProfile":
        """Build from the profiler's arrays (keys prefill_isl, prefill_ttft, prefill_thpt_per_gpu).

        Points are sorted by ISL. source: file name for error messages.
        """
        isl = profile_array(arrays, "prefill_isl", source=source)
        ttft = profile_array(arrays, "prefill_ttft", source=source)
        thpt = profile_array(arrays, "prefill_thpt_per_gpu", source=source)
        if not (len(isl) == len(ttft) == len(thpt)):
            raise ValueError(
                f"{source}: prefill_isl, prefill_ttft, prefill_thpt_per_gpu must have equal lengths, "
                f"got {len(isl)}, {len(ttft)}, {len(thpt)}"
            )
        order = np.argsort(isl, kind="stable")
        return cls(isl[order], ttft[order], thpt[order], source=source, out_of_range=out_of_range)

    @property
    def isl_range_tokens(self) -> tuple[float, float]:
        return (self._ttft.lo, self._ttft.hi)

    def _isl(self, isl_tokens: float) -> float:
        return clamp(
            float(isl_tokens), self._ttft.lo, self._ttft.hi,
            what="ISL", unit="tokens", source=self.source, out_of_range=self.out_of_range,
        )

    def ttft_ms_at(self, isl_tokens: float) -> float:
        """Single-request TTFT at `isl_tokens` input tokens, ms."""
        return self._ttft(self._isl(isl_tokens))

    def throughput_per_gpu_at(self, isl_tokens: float) -> float:
        """Prefill throughput at `isl_tokens` input tokens, tokens/s/GPU."""
        return self._thpt(self._isl(isl_tokens))

    def _isl_many(self, isl_tokens) -> np.ndarray:
        return clamp_many(
            isl_tokens, self._ttft.lo, self._ttft.hi,
            what="ISL", unit="tokens", source=self.source, out_of_range=self.out_of_range,
        )

    def ttft_ms_many(self, isl_tokens) -> np.ndarray:
        """Vectorised `ttft_ms_at`: array of ISLs (tokens) -> TTFTs (ms); one warning per call."""
        return self._ttft.many(self._isl_many(isl_tokens))

    def throughput_per_gpu_many(self, isl_tokens) -> np.ndarray:
        """Vectorised `throughput_per_gpu_at` (tokens/s/GPU)."""
        return self._thpt.many(self._isl_many(isl_tokens))


@dataclass(frozen=True)
class EngineProfile:
    """Prefill and decode profiles of one model/engine configuration."""

    prefill: PrefillProfile
    decode: DecodeProfile
    name: str
    # GPUs one engine of each role was profiled with (the profiler's meta.json:
    # num_gpus_*_engine, or the TP degree); None: the profile does not say.
    gpus_per_prefill_engine: int | None = None
    gpus_per_decode_engine: int | None = None


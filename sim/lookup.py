"""Precomputed profile lookups for the simulator's inner loop.

The simulator asks for a prefill batch time or a decode step time a few times per
request, hundreds of thousands of times per replay. These tables sample the
`EngineProfile` interpolants once and answer with plain Python arithmetic.

Outside the profiled range the simulator must keep going (an overloaded fleet is
exactly what a what-if explores), so instead of clamping:

* prefill above the longest profiled ISL runs at the throughput measured there
  (TTFT grows linearly: ttft(isl) = ttft(max) * isl / max); below the shortest it
  takes the shortest's TTFT (fixed per-request overhead);
* decode ITL above the highest profiled KV usage at a context grows linearly with
  the mean slope of that context's measured curve (more tokens in the batch, more
  time per step); contexts outside the measured rows use the nearest row.

Within the range the tables reproduce the profile: prefill exactly at every integer
ISL, decode by linear interpolation between 512 samples of each measured context
row's curve, blended between rows linearly in 1/context as the profile does.
"""

from __future__ import annotations

import bisect
import warnings

import numpy as np

from planner.latency.profile import EngineProfile
from planner.latency.profile_checks import ProfileRangeWarning

_KV_SAMPLES = 512


class ProfileTables:
    """Fast prefill-time and decode-step-time lookups for one EngineProfile."""

    def __init__(self, profile: EngineProfile):
        self.name = profile.name
        self.profile = profile
        pre, dec = profile.prefill, profile.decode
        lo, hi = pre.isl_range_tokens
        self.isl_min_tokens = int(np.ceil(lo))
        self.isl_max_tokens = int(np.floor(hi))
        grid = np.arange(0, self.isl_max_tokens + 1, dtype=float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            self._prefill_ms: list[float] = pre.ttft_ms_many(np.maximum(grid, lo)).tolist()
            ttft_max = pre.ttft_ms_at(self.isl_max_tokens)
        self._prefill_ms_per_token_beyond = ttft_max / self.isl_max_tokens

        self.max_kv_tokens = int(dec.max_kv_tokens)
        ctx_rows = np.unique(np.asarray(dec.context_tokens, dtype=float))
        self._ctx: list[float] = ctx_rows.tolist()
        self._inv_ctx: list[float] = (1.0 / ctx_rows).tolist()
        self._row_hi: list[float] = []
        self._row_step: list[float] = []
        self._row_itl: list[list[float]] = []
        self._row_slope: list[float] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            for ctx in ctx_rows:
                kv_lo, kv_hi = dec.kv_range_frac(float(ctx))
                kv = np.linspace(0.0, kv_hi, _KV_SAMPLES)
                itl = dec.itl_ms_many(kv, np.full_like(kv, ctx))
                span = max(kv_hi - kv_lo, 1e-9)
                slope = max((float(itl[-1]) - float(dec.itl_ms_at(kv_lo, float(ctx)))) / span, 0.0)
                self._row_hi.append(float(kv_hi))
                self._row_step.append(float(kv_hi) / (_KV_SAMPLES - 1))
                self._row_itl.append(itl.tolist())
                self._row_slope.append(slope)

    def prefill_ms(self, tokens: int) -> float:
        """Time to prefill `tokens` tokens in one batch, ms (the profile's TTFT at that ISL)."""
        if tokens <= self.isl_max_tokens:
            return self._prefill_ms[tokens if tokens > 0 else 0]
        return tokens * self._prefill_ms_per_token_beyond

    def _row_itl_ms(self, r: int, kv_frac: float) -> float:
        hi = self._row_hi[r]
        table = self._row_itl[r]
        if kv_frac >= hi:
            return table[-1] + self._row_slope[r] * (kv_frac - hi)
        if kv_frac <= 0.0:
            return table[0]
        x = kv_frac / self._row_step[r]
        i = int(x)
        f = x - i
        return table[i] + f * (table[i + 1] - table[i])

    def itl_ms(self, kv_frac: float, context_tokens: float) -> float:
        """Decode step time at a KV usage (0..1+, of max_kv_tokens) and mean context, ms."""
        ctxs = self._ctx
        j = bisect.bisect_left(ctxs, context_tokens)
        if j == 0:
            return self._row_itl_ms(0, kv_frac)
        if j >= len(ctxs):
            return self._row_itl_ms(len(ctxs) - 1, kv_frac)
        i = j - 1
        inv = self._inv_ctx
        w = (inv[i] - 1.0 / context_tokens) / (inv[i] - inv[j])
        a = self._row_itl_ms(i, kv_frac)
        return a + w * (self._row_itl_ms(j, kv_frac) - a)


class DriftedTables(ProfileTables):
    """The profile's lookups, with engines slower (scale > 1) or faster than profiled.

    Production rarely matches the profiling run (other hardware revision, driver,
    interference); this is the drift the planner's correction factors and the
    retrained latency predictor exist for, made explicit.
    """

    def __init__(self, profile, *, prefill_scale: float, decode_scale: float):
        super().__init__(profile)
        self.prefill_scale = prefill_scale
        self.decode_scale = decode_scale

    def prefill_ms(self, tokens: int) -> float:
        return super().prefill_ms(tokens) * self.prefill_scale

    def itl_ms(self, kv_frac: float, context_tokens: float) -> float:
        return super().itl_ms(kv_frac, context_tokens) * self.decode_scale

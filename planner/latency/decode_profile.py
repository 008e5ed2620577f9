"""Decode ITL and throughput vs KV usage and context length, interpolated from the profiler's sweep.

* Decode ITL: the profiler sweeps concurrency at a few fixed context lengths,
  so the points lie on rows of constant context. Each row gets a PCHIP in KV
  usage; between two rows we blend linearly in 1/context at the same KV usage.
  The 1/context weight comes from the usual step-time model
  ITL = a + b*batch + c*batch*context with batch = kv_usage*max_kv/context:
  at fixed KV usage that is linear in 1/context, so the blend is exact for
  such an engine, while blending linearly in context overestimates ITL
  several-fold between a short and a long context row.
* Decode throughput is not interpolated directly: it falls ~1/context at fixed
  KV usage and ~1/ITL along a row, which no generic interpolant captures. We
  interpolate (the same way as ITL) its efficiency, measured throughput over
  the ideal concurrency*1000/ITL (about 1/TP per GPU and nearly constant), and
  multiply back. Throughput is then consistent with ITL by Little's law.
* Dynamo resamples the scattered points onto a 100x100 (kv_usage, context)
  grid with griddata and reads the nearest cell: not exact at the measured
  points, blind to the row structure, and sensitive to the unscaled axes.
* Best decode throughput under an ITL target: dense evaluation in KV usage at
  the requested context (plus every measured KV point) and a root-find
  (brentq) on the ITL crossing, instead of scanning grid cells. Feasibility
  uses the running maximum of ITL over KV usage: ITL physically never falls
  as load rises, so a measured dip at high load is treated as noise, not as an
  island of feasible operating points.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq

from planner.latency.pchip import Pchip
from planner.latency.profile_checks import OutOfRange, check_out_of_range, clamp, clamp_many, profile_array

DECODE_KEYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")

# Dense KV samples per best-throughput search; the ITL crossing is then refined by brentq.
_SEARCH_POINTS = 257


@dataclass(frozen=True)
class DecodeOperatingPoint:
    """A decode operating point at one context length.

    throughput_per_gpu: output tokens/s/GPU.
    kv_usage_frac: KV-cache usage, 0..1 of max_kv_tokens.
    itl_ms: inter-token latency there, ms.
    concurrency: running requests per replica (kv_usage_frac*max_kv_tokens/context).
    meets_target: False when no KV usage meets the ITL target at that context
        (the point is then the lowest-ITL one).
    """

    throughput_per_gpu: float
    kv_usage_frac: float
    itl_ms: float
    concurrency: float
    meets_target: bool


@dataclass(frozen=True)
class _Row:
    """One measured context length: PCHIPs along KV usage."""

    context_tokens: float
    itl: Pchip
    efficiency: Pchip  # measured throughput / (concurrency * 1000 / ITL), dimensionless


@dataclass(frozen=True)
class DecodeProfile:
    """Decode ITL and throughput/GPU as functions of KV usage and context length.

    kv_usage_frac: measured KV usage per point, 0..1 of max_kv_tokens.
    context_tokens: context length per point (isl + osl/2), tokens.
    itl_ms: ITL per point, ms. throughput_per_gpu: output tokens/s/GPU per point.
    max_kv_tokens: KV-cache capacity of one engine, tokens.
    """

    kv_usage_frac: np.ndarray
    context_tokens: np.ndarray
    itl_ms: np.ndarray
    throughput_per_gpu: np.ndarray
    max_kv_tokens: int
    source: str
    out_of_range: OutOfRange = "clip"
    _rows: tuple[_Row, ...] = field(init=False, repr=False, compare=False)
    _ctx: list[float] = field(init=False, repr=False, compare=False)
    _inv_ctx: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = self.source
        check_out_of_range(self.out_of_range, source=src)
        x = np.asarray(self.kv_usage_frac, dtype=float)
        y = np.asarray(self.context_tokens, dtype=float)
        itl = np.asarray(self.itl_ms, dtype=float)
        thpt = np.asarray(self.throughput_per_gpu, dtype=float)
        n = len(x)
        for key, arr in (("y_context_length", y), ("z_itl", itl), ("z_thpt_per_gpu", thpt)):
            if len(arr) != n:
                raise ValueError(f"{src}: key {key!r} has {len(arr)} points, 'x_kv_usage' has {n}")
        if not self.max_kv_tokens > 0:
            raise ValueError(f"{src}: key 'max_kv_tokens' must be > 0, got {self.max_kv_tokens}")
        if np.any(x <= 0):
            raise ValueError(
                f"{src}: key 'x_kv_usage' must be > 0 (a point with no running request says nothing "
                f"about decode), got min {x.min():g}"
            )
        if np.any(y <= 0):
            raise ValueError(f"{src}: key 'y_context_length' must be > 0, got min {y.min():g}")
        if np.any(itl <= 0):
            raise ValueError(f"{src}: key 'z_itl' must be > 0 ms, got min {itl.min():g}")
        if np.any(thpt <= 0):
            raise ValueError(f"{src}: key 'z_thpt_per_gpu' must be > 0, got min {thpt.min():g}")
        # Throughput is carried as its ratio to the ideal concurrency*1000/ITL (per GPU that
        # is ~1/TP, a little less for measured engines); the ratio barely moves with load or
        # context, so it interpolates far better than throughput itself.
        eff = thpt * y * itl / (x * self.max_kv_tokens * 1000.0)
        rows = []
        for ctx in np.unique(y):
            sel = y == ctx
            order = np.argsort(x[sel], kind="stable")
            xs = x[sel][order]
            if np.any(np.diff(xs) <= 0):
                raise ValueError(
                    f"{src}: key 'x_kv_usage' repeats a value at y_context_length={ctx:g}: {xs.tolist()}"
                )
            rows.append(_Row(float(ctx), Pchip(xs, itl[sel][order]), Pchip(xs, eff[sel][order])))
        if len(rows) < 2 and n < 2:
            raise ValueError(f"{src}: decode profile needs at least 2 points, got {n}")
        object.__setattr__(self, "_rows", tuple(rows))
        object.__setattr__(self, "_ctx", [r.context_tokens for r in rows])
        object.__setattr__(self, "_inv_ctx", [1.0 / r.context_tokens for r in rows])

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray], *, source: str, out_of_range: OutOfRange = "clip"
    ) -> "DecodeProfile":
        """Build from the profiler's arrays (x_kv_usage, y_context_length, z_itl, z_thpt_per_gpu, max_kv_tokens)."""
        x = profile_array(arrays, "x_kv_usage", source=source)
        y = profile_array(arrays, "y_context_length", source=source)
        itl = profile_array(arrays, "z_itl", source=source)
        thpt = profile_array(arrays, "z_thpt_per_gpu", source=source)
        if not (len(x) == len(y) == len(itl) == len(thpt)):
            raise ValueError(
                f"{source}: x_kv_usage, y_context_length, z_itl, z_thpt_per_gpu must have equal lengths, "
                f"got {len(x)}, {len(y)}, {len(itl)}, {len(thpt)}"
            )
        if "max_kv_tokens" not in arrays:
            raise ValueError(f"{source}: missing key 'max_kv_tokens' (has {sorted(arrays)})")
        mk = np.asarray(arrays["max_kv_tokens"])
        if mk.size != 1:
            raise ValueError(f"{source}: key 'max_kv_tokens' must hold one value, got shape {mk.shape}")
        mk_f = profile_array({"max_kv_tokens": mk.reshape(1)}, "max_kv_tokens", source=source)[0]
        if mk_f <= 0 or mk_f != int(mk_f):
            raise ValueError(f"{source}: key 'max_kv_tokens' must be a positive integer, got {mk_f:g}")
        return cls(x, y, itl, thpt, max_kv_tokens=int(mk_f), source=source, out_of_range=out_of_range)

    # -- range -------------------------------------------------------------

    @property
    def context_range_tokens(self) -> tuple[float, float]:
        return (self._ctx[0], self._ctx[-1])

    def _bracket(self, context_tokens: float) -> tuple[int, int, float]:
        """Rows below/above `context_tokens` (already in range) and the 1/context weight of the upper."""
        j = bisect.bisect_left(self._ctx, context_tokens)
        if j == 0:
            return 0, 0, 0.0
        if j >= len(self._ctx):
            k = len(self._ctx) - 1
            return k, k, 0.0
        if self._ctx[j] == context_tokens:
            return j, j, 0.0
        i = j - 1
        inv = 1.0 / context_tokens
        w = (self._inv_ctx[i] - inv) / (self._inv_ctx[i] - self._inv_ctx[j])
        return i, j, w

    def kv_range_frac(self, context_tokens: float) -> tuple[float, float]:
        """Measured KV usage span at a context length (blended between rows), 0..1."""
        ctx = self._context(context_tokens)
        i, j, w = self._bracket(ctx)
        ri, rj = self._rows[i], self._rows[j]
        return (ri.itl.lo + w * (rj.itl.lo - ri.itl.lo), ri.itl.hi + w * (rj.itl.hi - ri.itl.hi))

    def _context(self, context_tokens: float) -> float:
        return clamp(
            float(context_tokens), self._ctx[0], self._ctx[-1],
            what="context length", unit="tokens", source=self.source, out_of_range=self.out_of_range,
        )

    def _point(self, kv_usage_frac: float, context_tokens: float) -> tuple[float, int, int, float, float]:
        ctx = self._context(context_tokens)
        i, j, w = self._bracket(ctx)
        ri, rj = self._rows[i], self._rows[j]
        hi = ri.itl.hi + w * (rj.itl.hi - ri.itl.hi)
        kv = float(kv_usage_frac)
        if kv != kv:
            raise ValueError(f"profile {self.source}: KV usage is NaN")
        if kv < 0.0 or kv > hi:
            kv = clamp(
                kv, 0.0, hi, what=f"KV usage at context {ctx:g} tokens", unit="(fraction)",
                source=self.source, out_of_range=self.out_of_range,
            )
        return ctx, i, j, w, kv

    # -- lookups -----------------------------------------------------------

    def itl_ms_at(self, kv_usage_frac: float, context_tokens: float) -> float:
        """ITL at a KV usage (0..1 of max_kv_tokens) and context length (tokens), ms."""
        ctx, i, j, w, kv = self._point(kv_usage_frac, context_tokens)
        a = self._rows[i].itl(kv)
        if w == 0.0:
            return a
        return a + w * (self._rows[j].itl(kv) - a)

    def throughput_per_gpu_at(self, kv_usage_frac: float, context_tokens: float) -> float:
        """Decode throughput at a KV usage and context length, output tokens/s/GPU.

        efficiency * concurrency * 1000 / ITL, so it is consistent with `itl_ms_at`
        (Little's law); below one running request it scales with the fraction.
        """
        ctx, i, j, w, kv = self._point(kv_usage_frac, context_tokens)
        ri, rj = self._rows[i], self._rows[j]
        itl, eff = ri.itl(kv), ri.efficiency(kv)
        if w != 0.0:
            itl += w * (rj.itl(kv) - itl)
            eff += w * (rj.efficiency(kv) - eff)
        return eff * kv * self.max_kv_tokens / ctx * 1000.0 / itl

    def concurrency_at(self, kv_usage_frac: float, context_tokens: float) -> float:
        """Running requests per engine at a KV usage and context: kv*max_kv_tokens/context."""
        return kv_usage_frac * self.max_kv_tokens / context_tokens

    def kv_usage_for(self, concurrency: float, context_tokens: float) -> float:
        """KV usage (0..1) that `concurrency` running requests of `context_tokens` occupy."""
        return concurrency * context_tokens / self.max_kv_tokens

    def _many(
        self, kv_usage_frac, context_tokens, *, warn: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Vector lookup: (ITL ms, efficiency, clamped KV usage, clamped context)."""
        kv, ctx = np.broadcast_arrays(np.asarray(kv_usage_frac, dtype=float), np.asarray(context_tokens, dtype=float))
        ctx = clamp_many(
            ctx, self._ctx[0], self._ctx[-1], what="context length", unit="tokens",
            source=self.source, out_of_range=self.out_of_range, warn=warn,
        )
        ctxs = np.asarray(self._ctx)
        j = np.clip(np.searchsorted(ctxs, ctx, side="left"), 0, len(ctxs) - 1)
        exact = ctxs[j] == ctx
        i = np.where(exact, j, np.maximum(j - 1, 0))
        inv_i, inv_j = 1.0 / ctxs[i], 1.0 / ctxs[j]
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(i == j, 0.0, (inv_i - 1.0 / ctx) / (inv_i - inv_j))
        row_hi = np.array([r.itl.hi for r in self._rows])
        hi = row_hi[i] + w * (row_hi[j] - row_hi[i])
        kv = clamp_many(
            kv, 0.0, hi, what="KV usage", unit="(fraction)", source=self.source, out_of_range=self.out_of_range,
            warn=warn,
        )
        itl_i, itl_j, eff_i, eff_j = (np.empty(kv.shape) for _ in range(4))
        for k, row in enumerate(self._rows):
            for sel, itl_out, eff_out in ((i == k, itl_i, eff_i), (j == k, itl_j, eff_j)):
                if sel.any():
                    itl_out[sel] = row.itl.many(kv[sel])
                    eff_out[sel] = row.efficiency.many(kv[sel])
        return itl_i + w * (itl_j - itl_i), eff_i + w * (eff_j - eff_i), kv, ctx

    def itl_ms_many(self, kv_usage_frac, context_tokens) -> np.ndarray:
        """Vectorised `itl_ms_at` (broadcasts its arguments); one warning per call."""
        return self._many(kv_usage_frac, context_tokens)[0]

    def throughput_per_gpu_many(self, kv_usage_frac, context_tokens) -> np.ndarray:
        """Vectorised `throughput_per_gpu_at` (output tokens/s/GPU)."""
        itl, eff, kv, ctx = self._many(kv_usage_frac, context_tokens)
        return eff * kv * self.max_kv_tokens / ctx * 1000.0 / itl

    # -- operating point ---------------------------------------------------

    def best_throughput_per_gpu(self, itl_target_ms: float, context_tokens: float) -> DecodeOperatingPoint:
        """Highest throughput/GPU whose ITL meets `itl_target_ms` at `context_tokens`.

        Only KV usages below the first point where ITL exceeds the target count
        (ITL's running maximum is used, so a measured dip at higher load is not
        an operating point). If even the lowest KV usage misses the target, the
        lowest-ITL point comes back with meets_target=False.
        """
        if not itl_target_ms == itl_target_ms:
            raise ValueError(f"profile {self.source}: ITL target is NaN")
        ctx = self._context(context_tokens)
        i, j, w = self._bracket(ctx)
        ri, rj = self._rows[i], self._rows[j]
        lo = ri.itl.lo + w * (rj.itl.lo - ri.itl.lo)
        hi = ri.itl.hi + w * (rj.itl.hi - ri.itl.hi)
        knots = [k for k in np.concatenate([ri.itl.x, rj.itl.x]) if lo <= k <= hi]
        kv = np.unique(np.concatenate([np.linspace(lo, hi, _SEARCH_POINTS), knots]))
        itl, eff, kv, _ = self._many(kv, ctx, warn=False)
        thpt = eff * kv * self.max_kv_tokens / ctx * 1000.0 / itl
        envelope = np.maximum.accumulate(itl)
        ok = envelope <= itl_target_ms
        if not ok[0]:
            k = int(np.argmin(itl))
            return DecodeOperatingPoint(
                float(thpt[k]), float(kv[k]), float(itl[k]), self.concurrency_at(float(kv[k]), ctx), False
            )
        last = int(np.flatnonzero(ok)[-1])
        cand_kv, cand_itl, cand_thpt = list(kv[: last + 1]), list(itl[: last + 1]), list(thpt[: last + 1])
        if last + 1 < len(kv):
            # The envelope crosses the target between kv[last] and kv[last+1]: find the crossing.
            floor = float(envelope[last])

            def itl_eff(k: float) -> tuple[float, float]:
                a_itl, a_eff = ri.itl(k), ri.efficiency(k)
                if w != 0.0:
                    a_itl += w * (rj.itl(k) - a_itl)
                    a_eff += w * (rj.efficiency(k) - a_eff)
                return a_itl, a_eff

            a, b = float(kv[last]), float(kv[last + 1])
            if max(floor, itl_eff(b)[0]) > itl_target_ms:
                root = brentq(lambda k: max(floor, itl_eff(k)[0]) - itl_target_ms, a, b, xtol=1e-9)
                r_itl, r_eff = itl_eff(root)
                cand_kv.append(root)
                cand_itl.append(r_itl)
                cand_thpt.append(r_eff * root * self.max_kv_tokens / ctx * 1000.0 / r_itl)
        k = int(np.argmax(cand_thpt))
        best_kv = float(cand_kv[k])
        return DecodeOperatingPoint(
            float(cand_thpt[k]), best_kv, float(cand_itl[k]), self.concurrency_at(best_kv, ctx), True
        )



__all__ = ["DECODE_KEYS", "DecodeOperatingPoint", "DecodeProfile"]

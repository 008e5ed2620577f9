"""ServeGen workload statistics: load them and synthesise request streams from them.

A ServeGen archive (alibaba/ServeGen) holds, per client, one row per 10-minute
window (`window_start_s, rate_rps, inter_arrival_cv, pattern, shape, scale`,
pattern Gamma/Weibull/empty) and, per 6-hour window, the input and output token
length distributions ({length: probability}). Windows where every client is zero
are collection gaps, not idle time.

Synthesis method (deterministic for a seed): for each client and 10-minute
window with a pattern and a positive rate, inter-arrival gaps are drawn from the
window's fitted family (Gamma or Weibull) with its fitted shape, and the scale is
set so the mean gap is 1 / (rate_rps * rate_scale): the published rate is the
measured one, the shape carries the burstiness (CV). The renewal process starts at
a uniformly random phase of its first gap. Each request's input and output length
is drawn independently from the client's distribution for the 6-hour window
containing it; if that window has none, the nearest window of the same client that
has one; if the client has none at all, the distribution pooled over all clients.
"""

from __future__ import annotations

import json
import math
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import gamma as gamma_fn

from workloads.traces import Trace, make_trace

WINDOW_S = 600.0
DIST_WINDOW_S = 21600.0
PATTERNS = ("", "Gamma", "Weibull")
_CHUNK = re.compile(r"(?:^|/)(chunk-\d+)-(trace\.csv|dataset\.json)$")


@dataclass(frozen=True)
class LengthDist:
    """A discrete length distribution: values (tokens) and their cumulative probability."""

    values: np.ndarray  # int64, ascending
    cdf: np.ndarray  # float64, ends at 1

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[np.searchsorted(self.cdf, rng.random(n), side="right").clip(0, len(self.values) - 1)]


@dataclass(frozen=True)
class ServeGenData:
    """Per-client window statistics from one ServeGen archive.

    clients: client ids ("chunk-N"), sorted by N.
    window_start_s: (W,) 10-minute window starts, seconds from the archive start.
    rate_rps, cv, shape, scale: (C, W) per client and window; 0 where the client is idle.
    pattern: (C, W) int8 codes into PATTERNS ("" / Gamma / Weibull).
    input_dists / output_dists: per client, {6-hour window start s: LengthDist}.
    """

    name: str
    clients: tuple[str, ...]
    window_start_s: np.ndarray
    rate_rps: np.ndarray
    cv: np.ndarray
    pattern: np.ndarray
    shape: np.ndarray
    scale: np.ndarray
    input_dists: tuple[dict[float, LengthDist], ...]
    output_dists: tuple[dict[float, LengthDist], ...]

    @property
    def window_s(self) -> float:
        return WINDOW_S

    def summed_series(self) -> tuple[np.ndarray, np.ma.MaskedArray]:
        """(window_start_s, requests per window summed over clients).

        Windows where every client reports zero are masked: they are collection gaps,
        not idle time, and must not be fed to a predictor as zero load.
        """
        counts = self.rate_rps.sum(axis=0) * WINDOW_S
        gap = ~np.any(self.rate_rps > 0, axis=0)
        return self.window_start_s.copy(), np.ma.MaskedArray(counts, mask=gap)


def _parse_dist(text: str, *, where: str) -> LengthDist | None:
    """Parse a '{len: prob, ...}' literal; None when empty."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"{where}: expected a {{length: probability}} mapping, got {body[:40]!r}")
    body = body[1:-1].strip()
    if not body:
        return None
    flat = np.array(body.replace(":", ",").split(","), dtype=np.float64)
    if len(flat) % 2:
        raise ValueError(f"{where}: odd number of entries in the length distribution")
    values, probs = flat[0::2], flat[1::2]
    if np.any(values < 0) or np.any(probs < 0) or not probs.sum() > 0:
        raise ValueError(f"{where}: lengths and probabilities must be non-negative with a positive total")
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(probs[order])
    return LengthDist(values=values[order].astype(np.int64), cdf=cdf / cdf[-1])


def _parse_trace_csv(text: str, *, where: str) -> np.ndarray:
    """Rows (window_start_s, rate, cv, pattern_code, shape, scale) as a float array."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != 6:
            raise ValueError(f"{where}: line {lineno}: expected 6 columns, got {len(parts)}")
        pattern = parts[3].strip()
        if pattern not in PATTERNS:
            raise ValueError(f"{where}: line {lineno}: pattern must be Gamma, Weibull or empty, got {pattern!r}")
        try:
            nums = [float(parts[i]) for i in (0, 1, 2, 4, 5)]
        except ValueError:
            raise ValueError(f"{where}: line {lineno}: non-numeric field in {line.strip()!r}") from None
        if nums[1] < 0 or not all(math.isfinite(x) for x in nums):
            raise ValueError(f"{where}: line {lineno}: rate must be finite and >= 0, got {parts[1]!r}")
        rows.append((nums[0], nums[1], nums[2], PATTERNS.index(pattern), nums[3], nums[4]))
    if not rows:
        raise ValueError(f"{where}: no windows")
    return np.array(rows, dtype=np.float64)


def load_servegen(path: str | Path) -> ServeGenData:
    """Load a ServeGen .tar.gz: every client's 10-minute windows and length distributions."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: ServeGen archive not found")
    traces: dict[str, np.ndarray] = {}
    datasets: dict[str, dict] = {}
    try:
        tar = tarfile.open(path, "r:*")
    except tarfile.TarError as exc:
        raise ValueError(f"{path}: not a tar archive: {exc}") from None
    with tar:
        for member in tar:
            m = _CHUNK.search(member.name)
            if not member.isfile() or not m:
                continue
            where = f"{path}:{member.name}"
            text = tar.extractfile(member).read().decode("utf-8")
            if m.group(2) == "trace.csv":
                traces[m.group(1)] = _parse_trace_csv(text, where=where)
            else:
                try:
                    raw = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
                datasets[m.group(1)] = {
                    float(k): (
                        _parse_dist(v.get("input_tokens", "{}"), where=f"{where}: {k}.input_tokens"),
                        _parse_dist(v.get("output_tokens", "{}"), where=f"{where}: {k}.output_tokens"),
                    )
                    for k, v in raw.items()
                }
    if not traces:
        raise ValueError(f"{path}: no ServeGen chunk-N-trace.csv files found")
    clients = tuple(sorted(traces, key=lambda c: int(c.split("-")[1])))
    starts = traces[clients[0]][:, 0]
    for c in clients:
        if traces[c].shape[0] != len(starts) or np.any(traces[c][:, 0] != starts):
            raise ValueError(f"{path}: {c}-trace.csv windows do not line up with {clients[0]}-trace.csv")
    stack = np.stack([traces[c] for c in clients])  # (C, W, 6)
    in_d, out_d = [], []
    for c in clients:
        ds = datasets.get(c, {})
        in_d.append({k: v[0] for k, v in ds.items() if v[0] is not None})
        out_d.append({k: v[1] for k, v in ds.items() if v[1] is not None})
    return ServeGenData(
        name=path.name.removesuffix(".tar.gz"),
        clients=clients,
        window_start_s=starts.copy(),
        rate_rps=stack[:, :, 1].copy(),
        cv=stack[:, :, 2].copy(),
        pattern=stack[:, :, 3].astype(np.int8),
        shape=stack[:, :, 4].copy(),
        scale=stack[:, :, 5].copy(),
        input_dists=tuple(in_d),
        output_dists=tuple(out_d),
    )


def _pooled(dists: tuple[dict[float, LengthDist], ...]) -> LengthDist:
    """Equal-weight mixture of every client's every window (the fallback distribution)."""
    all_d = [d for per_client in dists for d in per_client.values()]
    if not all_d:
        raise ValueError("ServeGen data has no token-length distributions at all")
    values = np.unique(np.concatenate([d.values for d in all_d]))
    pmf = np.zeros(len(values))
    for d in all_d:
        p = np.diff(d.cdf, prepend=0.0)
        pmf[np.searchsorted(values, d.values)] += p
    cdf = np.cumsum(pmf)
    return LengthDist(values=values, cdf=cdf / cdf[-1])


def _dist_for(dists: dict[float, LengthDist], t_s: float, fallback: LengthDist) -> LengthDist:
    if not dists:
        return fallback
    key = math.floor(t_s / DIST_WINDOW_S) * DIST_WINDOW_S
    if key in dists:
        return dists[key]
    nearest = min(dists, key=lambda k: (abs(k - key), k))
    return dists[nearest]


def _gaps(rng: np.random.Generator, pattern: int, shape: float, mean_gap_s: float, n: int) -> np.ndarray:
    """n inter-arrival gaps with the fitted family and shape, scaled to mean_gap_s."""
    if pattern == 1 and shape > 0:  # Gamma: mean = shape * scale
        return rng.gamma(shape, mean_gap_s / shape, size=n)
    if pattern == 2 and shape > 0:  # Weibull: mean = scale * Gamma(1 + 1/shape)
        return rng.weibull(shape, size=n) * (mean_gap_s / gamma_fn(1.0 + 1.0 / shape))
    return rng.exponential(mean_gap_s, size=n)


def synthesize_servegen(
    data: ServeGenData, *, start_s: float, duration_s: float, seed: int, rate_scale: float = 1.0
) -> Trace:
    """A request trace for [start_s, start_s + duration_s) of the archive, times re-based to 0.

    rate_scale: multiplies every client's rate (e.g. 0.002 turns ~1,800 req/s into ~3.6).
    Deterministic for (data, start_s, duration_s, seed, rate_scale).
    """
    if not duration_s > 0:
        raise ValueError(f"synthesize_servegen: duration_s must be > 0, got {duration_s}")
    if not rate_scale > 0:
        raise ValueError(f"synthesize_servegen: rate_scale must be > 0, got {rate_scale}")
    end_s = start_s + duration_s
    last = data.window_start_s[-1] + WINDOW_S
    if start_s < data.window_start_s[0] or end_s > last + 1e-9:
        raise ValueError(
            f"synthesize_servegen: [{start_s:g}, {end_s:g}) s is outside {data.name}'s "
            f"[{data.window_start_s[0]:g}, {last:g}) s"
        )
    rng = np.random.default_rng(seed)
    w_lo = int(np.searchsorted(data.window_start_s, start_s, side="right")) - 1
    w_hi = int(np.searchsorted(data.window_start_s, end_s, side="left"))
    pooled_in = pooled_out = None
    times, isl, osl = [], [], []
    for ci in range(len(data.clients)):
        for w in range(max(w_lo, 0), w_hi):
            rate = data.rate_rps[ci, w] * rate_scale
            if rate <= 0 or data.pattern[ci, w] == 0:
                continue
            w0 = data.window_start_s[w]
            lo, hi = max(w0, start_s), min(w0 + WINDOW_S, end_s)
            mean_gap = 1.0 / rate
            n_guess = int(rate * WINDOW_S * 1.3) + 16
            gaps = _gaps(rng, int(data.pattern[ci, w]), float(data.shape[ci, w]), mean_gap, n_guess)
            gaps[0] *= rng.random()
            t = w0 + np.cumsum(gaps)
            while t[-1] < w0 + WINDOW_S:
                more = _gaps(rng, int(data.pattern[ci, w]), float(data.shape[ci, w]), mean_gap, n_guess)
                t = np.concatenate([t, t[-1] + np.cumsum(more)])
            t = t[(t >= lo) & (t < hi)]
            if not len(t):
                continue
            if pooled_in is None:
                pooled_in, pooled_out = _pooled(data.input_dists), _pooled(data.output_dists)
            d_in = _dist_for(data.input_dists[ci], w0, pooled_in)
            d_out = _dist_for(data.output_dists[ci], w0, pooled_out)
            times.append(t - start_s)
            isl.append(d_in.sample(rng, len(t)))
            osl.append(d_out.sample(rng, len(t)))
    if not times:
        return make_trace(f"{data.name}[{start_s:g}+{duration_s:g}s]", [], [], [])
    return make_trace(
        f"{data.name}[{start_s:g}+{duration_s:g}s]x{rate_scale:g}",
        np.concatenate(times),
        np.concatenate(isl),
        np.concatenate(osl),
    )

"""Interpolation accuracy and lookup speed: planner.latency.profile vs Dynamo's method, on the real profiles.

Accuracy is leave-one-out: drop one measured point (or one whole context row
for decode), rebuild the interpolant from the rest, predict the dropped point,
and compare with the measurement. Dynamo's method is reimplemented here from
its described behaviour, for comparison only:
  prefill: cubic 1-D interpolation (scipy interp1d kind="cubic");
  decode: scipy griddata(method="cubic") on the raw (kv_usage, context) points
  onto a 100x100 grid over kv 0..1 and context 0..max, NaN cells filled by
  nearest neighbour, lookups read the nearest grid cell.

Writes benchmarks/results/interpolation.json and prints a markdown table.
Run: .venv/bin/python benchmarks/bench_interpolation.py
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy
from scipy.interpolate import Akima1DInterpolator, PchipInterpolator, griddata, interp1d

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import read_npz  # noqa: E402
from planner.latency.decode_profile import DecodeProfile  # noqa: E402
from planner.latency.profile import PrefillProfile  # noqa: E402
from planner.latency.profile_checks import ProfileRangeWarning  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "profiles"
OUT = ROOT / "benchmarks" / "results" / "interpolation.json"


def profiles() -> dict[str, tuple[dict, dict]]:
    """name -> (prefill arrays, decode arrays), 1-D."""
    out = {}
    for name, parts in {
        "dynamo H200 Llama-8B TP1 (measured)": ("dynamo", "profiler", "H200_TP1P_TP1D"),
        "aiconfigurator H100 Llama-8B TP1 (estimate)": ("aiconfigurator", "Llama-3.1-8B_H100_vllm_TP1P_TP1D"),
        "aiconfigurator H100 Qwen3-32B TP4 (estimate)": ("aiconfigurator", "Qwen3-32B_H100_sglang_TP4P_TP4D"),
    }.items():
        d = DATA.joinpath(*parts)
        out[name] = (
            read_npz(d / "selected_prefill_interpolation" / "raw_data.npz"),
            read_npz(d / "selected_decode_interpolation" / "raw_data.npz"),
        )
    pre = DATA / "dynamo" / "pre_swept" / "h100_sxm" / "vllm" / "nvidia" / "Llama-3.3-70B-Instruct-FP8"
    p, d = read_npz(pre / "prefill.npz"), read_npz(pre / "decode.npz")
    for r, tp in enumerate(p["tp"].ravel()):
        out[f"dynamo pre-swept H100 Llama-70B TP{tp} (measured)"] = (
            {k: p[k][r].ravel() for k in p},
            {k: d[k][r].ravel() for k in d},
        )
    return out


def pct_err(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return 100.0 * np.abs(np.asarray(pred, float) - true) / np.abs(true)


def summary(errs) -> dict:
    e = np.asarray(errs, float)
    if e.size == 0:
        return {"n": 0}
    return {"n": int(e.size), "mean_pct": round(float(e.mean()), 2), "median_pct": round(float(np.median(e)), 2),
            "max_pct": round(float(e.max()), 2)}


# -- prefill -------------------------------------------------------------------


def prefill_loo(arrays: dict) -> dict:
    x = np.asarray(arrays["prefill_isl"], float)
    res = {}
    for key in ("prefill_ttft", "prefill_thpt_per_gpu"):
        y = np.asarray(arrays[key], float)
        errs = {m: [] for m in ("ours_pchip_loglog", "dynamo_cubic", "pchip_linear_axes", "linear", "akima")}
        for i in range(1, len(x) - 1):  # interior points: every method interpolates, none extrapolates
            keep = np.arange(len(x)) != i
            xs, ys = x[keep], y[keep]
            arrays_i = {
                "prefill_isl": xs,
                "prefill_ttft": ys if key == "prefill_ttft" else np.asarray(arrays["prefill_ttft"], float)[keep],
                "prefill_thpt_per_gpu": ys if key != "prefill_ttft" else np.asarray(arrays["prefill_thpt_per_gpu"], float)[keep],
            }
            ours = PrefillProfile.from_arrays(arrays_i, source="loo")
            pred = ours.ttft_ms_at(x[i]) if key == "prefill_ttft" else ours.throughput_per_gpu_at(x[i])
            errs["ours_pchip_loglog"].append(pct_err(pred, y[i]))
            errs["pchip_linear_axes"].append(pct_err(PchipInterpolator(xs, ys)(x[i]), y[i]))
            errs["dynamo_cubic"].append(pct_err(interp1d(xs, ys, kind="cubic")(x[i]), y[i]))
            errs["linear"].append(pct_err(np.interp(x[i], xs, ys), y[i]))
            errs["akima"].append(pct_err(Akima1DInterpolator(xs, ys)(x[i]), y[i]))
        res[key] = {m: summary(v) for m, v in errs.items()}
    return res


# -- decode: Dynamo's grid -------------------------------------------------------


class DynamoGrid:
    """Dynamo-style decode lookup: griddata cubic onto 100x100, nearest-fill, nearest cell."""

    def __init__(self, x, y, itl, thpt, resolution: int = 100):
        self.res = resolution
        self.xi = np.linspace(0, 1, resolution)
        self.yi = np.linspace(0, max(y), resolution)
        gx, gy = np.meshgrid(self.xi, self.yi)
        self.itl = self._grid(x, y, itl, gx, gy)
        self.thpt = self._grid(x, y, thpt, gx, gy)

    @staticmethod
    def _grid(x, y, z, gx, gy):
        g = griddata((x, y), z, (gx, gy), method="cubic")
        nan = np.isnan(g)
        if nan.any():
            g[nan] = griddata((x, y), z, (gx, gy), method="nearest")[nan]
        return g

    def idx(self, kv, ctx):
        ix = int(np.clip(np.round(kv / (self.xi[1] - self.xi[0])), 0, self.res - 1))
        iy = int(np.clip(np.round(ctx / (self.yi[1] - self.yi[0])), 0, self.res - 1))
        return iy, ix

    def itl_at(self, kv, ctx):
        return self.itl[self.idx(kv, ctx)]

    def thpt_at(self, kv, ctx):
        return self.thpt[self.idx(kv, ctx)]


def griddata_exact(x, y, z, xq, yq):
    """Dynamo's interpolant evaluated at the query itself (no grid rounding), nearest where NaN."""
    v = griddata((x, y), z, (np.atleast_1d(xq), np.atleast_1d(yq)), method="cubic")
    nan = np.isnan(v)
    if nan.any():
        v[nan] = griddata((x, y), z, (np.atleast_1d(xq), np.atleast_1d(yq)), method="nearest")[nan]
    return v


class LinearContextDecode(DecodeProfile):
    """Ablation: our rows, but blended linearly in context instead of in 1/context (scalar path only)."""

    def _bracket(self, context_tokens):
        i, j, w = super()._bracket(context_tokens)
        if i == j:
            return i, j, w
        return i, j, (context_tokens - self._ctx[i]) / (self._ctx[j] - self._ctx[i])


def _decode_arrays(arrays, keep):
    return {
        "x_kv_usage": np.asarray(arrays["x_kv_usage"], float)[keep],
        "y_context_length": np.asarray(arrays["y_context_length"], float)[keep],
        "z_itl": np.asarray(arrays["z_itl"], float)[keep],
        "z_thpt_per_gpu": np.asarray(arrays["z_thpt_per_gpu"], float)[keep],
        "max_kv_tokens": np.ravel(arrays["max_kv_tokens"])[:1],
    }


def decode_loo(arrays: dict) -> dict:
    x = np.asarray(arrays["x_kv_usage"], float)
    y = np.asarray(arrays["y_context_length"], float)
    z = {"itl": np.asarray(arrays["z_itl"], float), "thpt": np.asarray(arrays["z_thpt_per_gpu"], float)}
    methods = ("ours_rows_inv_ctx", "ours_rows_linear_ctx", "dynamo_grid100", "dynamo_griddata_exact")
    out = {}
    for mode in ("point", "row"):
        errs = {q: {m: [] for m in methods} for q in z}
        if mode == "point":
            # points strictly inside their row's KV span, so every method interpolates
            groups = []
            for ctx in np.unique(y):
                idx = np.flatnonzero(y == ctx)
                idx = idx[np.argsort(x[idx])]
                groups += [[i] for i in idx[1:-1]]
        else:
            ctxs = np.unique(y)
            groups = [list(np.flatnonzero(y == c)) for c in ctxs[1:-1]]  # interior rows
        for g in groups:
            keep = np.ones(len(x), bool)
            keep[g] = False
            arr = _decode_arrays(arrays, keep)
            ours = DecodeProfile.from_arrays(arr, source="loo")
            lin = LinearContextDecode.from_arrays(arr, source="loo")
            grid = DynamoGrid(x[keep], y[keep], z["itl"][keep], z["thpt"][keep])
            for i in g:
                truth_itl, truth_thpt = z["itl"][i], z["thpt"][i]
                preds = {
                    "ours_rows_inv_ctx": (ours.itl_ms_at(x[i], y[i]), ours.throughput_per_gpu_at(x[i], y[i])),
                    "ours_rows_linear_ctx": (lin.itl_ms_at(x[i], y[i]), lin.throughput_per_gpu_at(x[i], y[i])),
                    "dynamo_grid100": (grid.itl_at(x[i], y[i]), grid.thpt_at(x[i], y[i])),
                    "dynamo_griddata_exact": (
                        griddata_exact(x[keep], y[keep], z["itl"][keep], x[i], y[i])[0],
                        griddata_exact(x[keep], y[keep], z["thpt"][keep], x[i], y[i])[0],
                    ),
                }
                for m, (pi, pt) in preds.items():
                    errs["itl"][m].append(pct_err(pi, truth_itl))
                    errs["thpt"][m].append(pct_err(pt, truth_thpt))
        out[mode] = {q: {m: summary(v) for m, v in errs[q].items()} for q in errs}
    return out


def in_sample(prefill: dict, decode: dict) -> dict:
    """Error at the measured points themselves (0 for an exact interpolant)."""
    x, y = np.asarray(decode["x_kv_usage"], float), np.asarray(decode["y_context_length"], float)
    grid = DynamoGrid(x, y, np.asarray(decode["z_itl"], float), np.asarray(decode["z_thpt_per_gpu"], float))
    ours = DecodeProfile.from_arrays(decode, source="in-sample")
    e_grid = [pct_err(grid.itl_at(a, b), t) for a, b, t in zip(x, y, decode["z_itl"])]
    e_ours = [pct_err(ours.itl_ms_at(a, b), t) for a, b, t in zip(x, y, decode["z_itl"])]
    return {"decode_itl": {"ours_rows_inv_ctx": summary(e_ours), "dynamo_grid100": summary(e_grid)}}


def timing(prefill: dict, decode: dict) -> dict:
    """Median per-call wall time, microseconds, for scalar lookups (random in-range queries)."""
    rng = np.random.default_rng(0)
    p = PrefillProfile.from_arrays(prefill, source="t")
    d = DecodeProfile.from_arrays(decode, source="t")
    x, y = np.asarray(decode["x_kv_usage"], float), np.asarray(decode["y_context_length"], float)
    grid = DynamoGrid(x, y, np.asarray(decode["z_itl"], float), np.asarray(decode["z_thpt_per_gpu"], float))
    cubic = interp1d(np.asarray(prefill["prefill_isl"], float), np.asarray(prefill["prefill_ttft"], float), kind="cubic")
    isl = rng.uniform(*p.isl_range_tokens, 2000)
    ctx = rng.uniform(*d.context_range_tokens, 2000)
    kv = np.array([rng.uniform(0, d.kv_range_frac(c)[1]) for c in ctx])

    def per_call_us(fn, n_rep=7):
        runs = []
        for _ in range(n_rep):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) / len(isl) * 1e6)
        return round(statistics.median(runs), 3)

    def build_ms(fn, n_rep=5):
        runs = []
        for _ in range(n_rep):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(runs), 2)

    t_best = []
    for c in ctx[:50]:
        t0 = time.perf_counter()
        d.best_throughput_per_gpu(20.0, c)
        t_best.append((time.perf_counter() - t0) * 1e6)
    return {
        "ours_prefill_ttft_us": per_call_us(lambda: [p.ttft_ms_at(v) for v in isl]),
        "dynamo_prefill_ttft_us": per_call_us(lambda: [float(cubic(v)) for v in isl]),
        "ours_decode_itl_us": per_call_us(lambda: [d.itl_ms_at(a, b) for a, b in zip(kv, ctx)]),
        "dynamo_decode_itl_us": per_call_us(lambda: [grid.itl_at(a, b) for a, b in zip(kv, ctx)]),
        "ours_decode_itl_vectorised_us_per_point": per_call_us(lambda: d.itl_ms_many(kv, ctx)),
        "ours_best_throughput_us": round(statistics.median(t_best), 1),
        "ours_build_ms": build_ms(lambda: (PrefillProfile.from_arrays(prefill, source="t"),
                                           DecodeProfile.from_arrays(decode, source="t"))),
        "dynamo_build_ms": build_ms(lambda: DynamoGrid(x, y, np.asarray(decode["z_itl"], float),
                                                       np.asarray(decode["z_thpt_per_gpu"], float))),
    }


def main() -> None:
    warnings.simplefilter("ignore", ProfileRangeWarning)
    result = {
        "what": "leave-one-out interpolation error (abs % of the measured value) and scalar lookup time",
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
                    "cpu": platform.processor() or platform.machine()},
        "profiles": {},
    }
    for name, (pre, dec) in profiles().items():
        print(f"... {name}", file=sys.stderr)
        result["profiles"][name] = {
            "prefill_loo": prefill_loo(pre),
            "decode_loo": decode_loo(dec),
            "in_sample": in_sample(pre, dec),
            "timing": timing(pre, dec),
        }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


def table(result: dict) -> str:
    lines = [
        "| profile | prefill TTFT LOO mean/max % (ours / Dynamo cubic) "
        "| decode ITL point-LOO mean/max % (ours / Dynamo grid) "
        "| decode ITL row-LOO mean/max % (ours / Dynamo grid) "
        "| decode thpt row-LOO mean/max % (ours / Dynamo grid) "
        "| prefill thpt LOO mean/max % (ours / Dynamo cubic) | decode thpt point-LOO mean/max % (ours / Dynamo grid) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["profiles"].items():
        pt = r["prefill_loo"]["prefill_ttft"]
        dp, dr = r["decode_loo"]["point"], r["decode_loo"]["row"]

        def pair(d, a="ours_rows_inv_ctx", b="dynamo_grid100"):
            if not d[a]["n"]:
                return "n/a"
            return f"{d[a]['mean_pct']}/{d[a]['max_pct']} vs {d[b]['mean_pct']}/{d[b]['max_pct']} (n={d[a]['n']})"

        lines.append(
            f"| {name} | {pair(pt, 'ours_pchip_loglog', 'dynamo_cubic')} | {pair(dp['itl'])} | {pair(dr['itl'])} "
            f"| {pair(dr['thpt'])} | {pair(r['prefill_loo']['prefill_thpt_per_gpu'], 'ours_pchip_loglog', 'dynamo_cubic')} "
            f"| {pair(dp['thpt'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""`sla-planner backtest`: how well each load predictor would have forecast a series.

Rolling-origin backtest (see planner.backtest): at every interval the predictor
sees only the past (the most recent --window points), forecasts --horizon
intervals ahead, and is scored against what happened. MASE < 1 means better
than last value on this series. p90_coverage is the share of intervals at or
below the upper (p90) forecast.

PATH may be
  - a CSV of per-interval values with a header (pick the column with --column;
    an optional time column t_s / timestamp / time gives interval times in
    seconds, else rows are --bin-s apart; empty cells are missing values),
  - a request trace (Azure CSV or Mooncake JSONL, plain or gzip), binned into
    --bin-s intervals (column: num_requests, avg_isl_tokens or avg_osl_tokens);
    the trailing partial bin is dropped,
  - a ServeGen archive (.tar.gz): requests per 10-minute window summed over
    clients, windows where every client is zero masked as collection gaps;
    --bin-s may merge whole windows.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

from planner_cli.command import command_parser

TIME_COLUMNS = ("t_s", "timestamp", "time", "ts")
TRACE_COLUMNS = ("num_requests", "avg_isl_tokens", "avg_osl_tokens")
SERVEGEN_WINDOW_S = 600.0


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "backtest", doc=__doc__,
                       help="backtest load predictors on a series or trace (MAE, sMAPE, MASE, bias, p90 coverage)")
    p.add_argument("--series", required=True, metavar="PATH", help="CSV of per-interval values, trace, or ServeGen archive")
    p.add_argument("--column", default=None, help="which column to forecast (traces: default num_requests)")
    p.add_argument("--bin-s", type=float, default=None,
                   help="interval width, s (traces: default 60; CSV without time column: row spacing, default 60)")
    p.add_argument("--predictor", default="all", help="a predictor name, a comma-separated list, or 'all' (default)")
    p.add_argument("--horizon", type=int, default=1, help="score the k-th step ahead (default: %(default)s)")
    p.add_argument("--window", type=int, default=1008,
                   help="history points each forecast may use, like the planner's history_intervals (default: %(default)s)")
    p.add_argument("--start", type=int, default=5, help="first forecast origin, points (default: %(default)s)")
    p.add_argument("--quantile", type=float, default=0.9, help="upper quantile scored as coverage (default: %(default)s)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the results as JSON here")


def _fail(msg: str) -> int:
    print(f"sla-planner backtest: error: {msg}", file=sys.stderr)
    return 2


def _read_text(path: Path) -> str:
    import gzip

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from None


def _load_value_csv(path: Path, *, column: str | None, bin_s: float | None):
    import numpy as np

    rows = list(csv.reader(io.StringIO(_read_text(path))))
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise ValueError(f"{path}: need a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    time_col = next((c for c in TIME_COLUMNS if c in header), None)
    values = [h for h in header if h != time_col]
    if column is None:
        if len(values) != 1:
            raise ValueError(f"{path}: several value columns ({', '.join(values)}): choose one with --column")
        column = values[0]
    if column not in header or column == time_col:
        raise ValueError(f"{path}: no column {column!r}; columns: {', '.join(values)}")
    ci = header.index(column)
    ti = header.index(time_col) if time_col else None

    def number(cell: str, lineno: int, name: str) -> float:
        cell = cell.strip()
        if cell == "" or cell.lower() in ("nan", "na", "null"):
            return math.nan
        try:
            return float(cell)
        except ValueError:
            raise ValueError(f"{path}: line {lineno}: column {name!r}: {cell!r} is not a number") from None

    t, y = [], []
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{path}: line {lineno}: {len(row)} fields, header has {len(header)}")
        y.append(number(row[ci], lineno, column))
        if ti is not None:
            tv = number(row[ti], lineno, time_col)
            if not math.isfinite(tv):
                raise ValueError(f"{path}: line {lineno}: column {time_col!r} is empty")
            t.append(tv)
    step = bin_s or 60.0
    t_s = np.asarray(t) if ti is not None else step * np.arange(1, len(y) + 1)
    return t_s, np.asarray(y, dtype=float), f"{path.name}:{column}"


def _load_servegen(path: Path, *, column: str | None, bin_s: float | None):
    import numpy as np

    from workloads.servegen import load_servegen

    if column not in (None, "num_requests"):
        raise ValueError(f"{path}: a ServeGen archive only has column 'num_requests', not {column!r}")
    data = load_servegen(path)
    start, counts = data.summed_series()
    y = counts.filled(np.nan).astype(float)
    t = start + SERVEGEN_WINDOW_S  # interval end times
    if bin_s is not None and abs(bin_s - SERVEGEN_WINDOW_S) > 1e-9:
        k = bin_s / SERVEGEN_WINDOW_S
        if k < 1 or abs(k - round(k)) > 1e-9:
            raise ValueError(f"{path}: --bin-s {bin_s} must be a whole multiple of the 600 s ServeGen window")
        k = int(round(k))
        n = (y.size // k) * k
        # A merged bin with any masked window is masked too: its sum would be short.
        y = y[:n].reshape(-1, k).sum(axis=1)
        t = t[:n].reshape(-1, k)[:, -1]
    return t, y, f"{path.name} (summed over {len(data.clients)} clients)"


def load_series(path: str | Path, *, column: str | None = None, bin_s: float | None = None):
    """(t_s, y, description) for a backtest: per-interval CSV, trace (binned) or ServeGen archive.

    Raises ValueError naming the file (and line/column) on bad input.
    """
    import numpy as np

    from workloads.traces import bin_trace, detect_format, load_trace

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    if bin_s is not None and not (bin_s > 0 and math.isfinite(bin_s)):
        raise ValueError(f"--bin-s must be a positive number of seconds, got {bin_s}")
    try:
        fmt = detect_format(path)
    except ValueError:
        fmt = "csv"
    if fmt == "servegen":
        return _load_servegen(path, column=column, bin_s=bin_s)
    if fmt == "csv":
        return _load_value_csv(path, column=column, bin_s=bin_s)
    col = column or "num_requests"
    if col not in TRACE_COLUMNS:
        raise ValueError(f"{path}: a {fmt} trace has columns {', '.join(TRACE_COLUMNS)}, not {col!r}")
    trace = load_trace(path, fmt=fmt)
    if len(trace) == 0:
        raise ValueError(f"{path}: trace has no requests")
    width = bin_s or 60.0
    # The trace ends inside its last bin; that bin's count would look like a
    # sudden drop, so only whole bins are kept.
    whole = math.floor(trace.duration_s / width + 1e-9)
    if whole < 1:
        raise ValueError(f"{path}: trace spans {trace.duration_s:.0f} s, less than one {width:g} s bin")
    hist = bin_trace(trace, bin_s=width, end_s=whole * width)
    return np.asarray(hist.t_s), np.asarray(getattr(hist, col), dtype=float), f"{path.name}:{col} ({fmt}, {hist.interval_s:g} s bins)"


def predictor_list(spec: str) -> list[str]:
    """Names from 'all', one name or a comma-separated list; unknown names are a ValueError."""
    from planner.predictors.registry import predictor_names

    valid = predictor_names()
    names = valid if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        shown = ", ".join(repr(b) for b in bad) or repr(spec)
        raise ValueError(f"unknown predictor {shown}; valid: {', '.join(valid)} or all")
    return names


def run_backtests(t_s, y, names, *, horizon=1, window=1008, start=5, quantile=0.9, progress=None) -> dict:
    """{name: BacktestResult} for each predictor, warm-started as the planner's cache would."""
    from planner.backtest import rolling_origin
    from planner.predictors.registry import make_predictor

    warm_up(names)
    results = {}
    for name in names:
        results[name] = rolling_origin(
            t_s,
            y,
            lambda name=name: make_predictor(name, warm_start=True),
            name=name,
            horizon=horizon,
            start=start,
            window=window,
            quantile=quantile,
        )
        if progress:
            progress(name, results[name])
    return results


def warm_up(names) -> None:
    """Fit each predictor once on a tiny series, so library imports are not timed as steps."""
    import numpy as np

    from planner.predictors.registry import make_predictor

    t = 60.0 * np.arange(1, 41)
    y = 100.0 + 10.0 * np.sin(np.arange(40))
    for name in names:
        make_predictor(name).fit(t, y).predict_quantile(0.9, 1)


def format_table(results: dict) -> str:
    """Markdown table: one row per predictor."""
    lines = [
        "| predictor | MAE | sMAPE | MASE | bias | under-forecast | p90 coverage | ms/step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        s = r.scores
        cov = "n/a" if s.p90_coverage is None else f"{100 * s.p90_coverage:.0f}%"
        lines.append(
            f"| {name} | {s.mae:.4g} | {s.smape:.3f} | {s.mase:.3f} | {s.bias:+.3g} | "
            f"{100 * s.under_rate:.0f}% | {cov} | {r.ms_per_step:.1f} |"
        )
    return "\n".join(lines)


def quiet_libraries() -> None:
    """Prophet/CmdStan log every fit at INFO; keep the command's output readable."""
    import logging
    import warnings

    for name in ("cmdstanpy", "prophet", "prophet.plot"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        # cmdstanpy installs its own INFO handler on first use; create it now and mute it.
        from cmdstanpy.utils import get_logger

        get_logger().setLevel(logging.CRITICAL)
    except ImportError:
        pass
    warnings.filterwarnings("ignore", module="statsmodels")


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    try:
        names = predictor_list(args.predictor)
        if args.horizon < 1:
            raise ValueError(f"--horizon must be >= 1, got {args.horizon}")
        if args.window < 2:
            raise ValueError(f"--window must be >= 2, got {args.window}")
        if args.start < 1:
            raise ValueError(f"--start must be >= 1, got {args.start}")
        if not 0 < args.quantile < 1:
            raise ValueError(f"--quantile must be in (0, 1), got {args.quantile}")
        t_s, y, desc = load_series(args.series, column=args.column, bin_s=args.bin_s)
        if len(y) < args.start + args.horizon:
            raise ValueError(
                f"{args.series}: {len(y)} intervals, need at least --start + --horizon = {args.start + args.horizon}"
            )
    except (ValueError, OSError) as exc:
        return _fail(str(exc))

    def progress(name, r):
        print(f"  {name}: MASE {r.scores.mase:.3f}, {r.ms_per_step:.1f} ms/step", file=sys.stderr, flush=True)

    print(f"backtest {desc}: {len(y)} intervals, horizon {args.horizon}, window {args.window}", file=sys.stderr)
    try:
        results = run_backtests(
            t_s, y, names, horizon=args.horizon, window=args.window, start=args.start,
            quantile=args.quantile, progress=progress,
        )
    except ValueError as exc:
        return _fail(f"{args.series}: {exc}")
    print(format_table(results))
    if args.json_out:
        doc = {
            "series": {
                "path": str(args.series),
                "description": desc,
                "intervals": int(len(y)),
                "missing": int(sum(1 for v in y if not math.isfinite(v))),
                "horizon": args.horizon,
                "window": args.window,
                "start": args.start,
                "quantile": args.quantile,
            },
            "predictors": {name: r.as_dict() for name, r in results.items()},
        }
        try:
            Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            return _fail(f"writing {args.json_out}: {exc}")
    return 0

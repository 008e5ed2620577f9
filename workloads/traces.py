"""Request traces: load production traces and transform them for replay.

A `Trace` is three aligned arrays (arrival time, input and output length) plus
optional prefix-block hashes. Formats are detected from the content, not the
file name: Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`)
and Mooncake JSONL (`timestamp` in ms, `input_length`, `output_length`,
`hash_ids`), each plain or gzip-compressed. ServeGen archives are not request
traces but per-window statistics; `workloads.servegen` synthesises traces from them.

Transformations return new traces and never mutate their input.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from planner.types import LoadHistory

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FORMATS = ("azure", "mooncake", "servegen")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Trace:
    """One request stream, sorted by arrival.

    name: where it came from (file name plus transformations).
    arrival_s: float64 arrival times, seconds from the trace start, sorted ascending.
    isl_tokens / osl_tokens: int64 input / output lengths, tokens.
    hash_ids: per-request prefix-block hashes (Mooncake: 512-token blocks; equal ids
        mean a shared prefix), or None when the format has none.
    skipped_lines: malformed lines skipped while loading (skip_malformed=True).
    skipped_examples: up to five "line N: problem" strings for those lines.
    """

    name: str
    arrival_s: np.ndarray
    isl_tokens: np.ndarray
    osl_tokens: np.ndarray
    hash_ids: list | None = None
    skipped_lines: int = 0
    skipped_examples: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("isl_tokens", "osl_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"trace {self.name}: {name} has {len(getattr(self, name))} entries, arrival_s has {n}"
                )
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError(f"trace {self.name}: hash_ids has {len(self.hash_ids)} entries, arrival_s has {n}")
        if n > 1 and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"trace {self.name}: arrival_s must be sorted ascending")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Last arrival time, seconds (0 for an empty trace)."""
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0


def make_trace(name, arrival_s, isl, osl, hash_ids=None, *, skipped=0, examples=()) -> Trace:
    """A trace from request columns in any order, sorted by arrival (stable: equal timestamps keep file order)."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    isl_a = np.asarray(isl, dtype=np.int64)
    osl_a = np.asarray(osl, dtype=np.int64)
    order = np.argsort(arrival, kind="stable")
    if len(order) > 1 and np.any(order[1:] < order[:-1]):
        arrival, isl_a, osl_a = arrival[order], isl_a[order], osl_a[order]
        if hash_ids is not None:
            hash_ids = [hash_ids[i] for i in order]
    return Trace(
        name=name,
        arrival_s=arrival,
        isl_tokens=isl_a,
        osl_tokens=osl_a,
        hash_ids=hash_ids,
        skipped_lines=skipped,
        skipped_examples=tuple(examples),
    )


def _read_head(path: Path, n: int = 4096) -> bytes:
    with open(path, "rb") as f:
        raw = f.read(n)
    if raw.startswith(GZIP_MAGIC):
        with gzip.open(path, "rb") as g:
            try:
                return g.read(n)
            except (OSError, EOFError) as exc:
                raise ValueError(f"{path}: corrupt gzip data: {exc}") from None
    return raw


def detect_format(path: str | Path) -> str:
    """Trace format from the file's content: 'azure', 'mooncake' or 'servegen'.

    Raises ValueError naming the file when the content matches none of them.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: trace file not found")
    head = _read_head(path)
    # A gzip whose payload is a tar archive (ustar magic at byte 257) is ServeGen.
    if len(head) > 262 and head[257:262] == b"ustar":
        return "servegen"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("{"):
        return "mooncake"
    cols = tuple(c.strip() for c in first.split(","))
    if cols[:3] == AZURE_HEADER:
        return "azure"
    raise ValueError(
        f"{path}: unrecognised trace format: first line {first[:80]!r}; expected an Azure CSV header "
        f"{','.join(AZURE_HEADER)!r}, Mooncake JSONL objects, or a ServeGen .tar.gz"
    )


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _parse_count(value, *, field_name: str) -> int:
    """A non-negative integer token count (accepts 12, "12", 12.0)."""
    if isinstance(value, bool):
        raise ValueError(f"{field_name} must be a non-negative integer, got {value!r}")
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        raise ValueError(f"{field_name} must be a non-negative integer, got {value!r}") from None
    if not isinstance(number, (int, float)) or not math.isfinite(number) or number < 0 or number != int(number):
        raise ValueError(f"{field_name} must be a non-negative integer, got {value!r}")
    return int(number)


class _Collector:
    """Accumulates rows; raises or records malformed lines."""

    def __init__(self, path: Path, skip_malformed: bool):
        self.path = path
        self.skip_malformed = skip_malformed
        self.skipped = 0
        self.examples: list[str] = []

    def bad(self, lineno: int, problem: str) -> None:
        if not self.skip_malformed:
            raise ValueError(f"{self.path}: line {lineno}: {problem}")
        self.skipped += 1
        if len(self.examples) < 5:
            self.examples.append(f"line {lineno}: {problem}")


def _load_azure(path: Path, skip_malformed: bool) -> Trace:
    col = _Collector(path, skip_malformed)
    t_abs: list[float] = []
    isl: list[int] = []
    osl: list[int] = []
    with _open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(c.strip().lstrip("\ufeff") for c in header[:3]) != AZURE_HEADER:
            raise ValueError(f"{path}: line 1: expected header {','.join(AZURE_HEADER)!r}, got {header!r}")
        for row in reader:
            lineno = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != 3:
                col.bad(lineno, f"expected 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens), got {len(row)}")
                continue
            try:
                ts = datetime.fromisoformat(row[0].strip()).timestamp()
            except ValueError:
                col.bad(lineno, f"TIMESTAMP is not a date-time, got {row[0]!r}")
                continue
            try:
                i = _parse_count(row[1].strip(), field_name="ContextTokens")
                o = _parse_count(row[2].strip(), field_name="GeneratedTokens")
            except ValueError as exc:
                col.bad(lineno, str(exc))
                continue
            t_abs.append(ts)
            isl.append(i)
            osl.append(o)
    if not t_abs:
        raise ValueError(f"{path}: no valid requests (skipped {col.skipped} malformed lines)")
    t = np.asarray(t_abs, dtype=np.float64)
    return make_trace(path.name, t - t.min(), isl, osl, skipped=col.skipped, examples=col.examples)


def _load_mooncake(path: Path, skip_malformed: bool) -> Trace:
    col = _Collector(path, skip_malformed)
    t_ms: list[float] = []
    isl: list[int] = []
    osl: list[int] = []
    hashes: list = []
    any_hash = False
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                col.bad(lineno, f"not valid JSON: {exc.msg}")
                continue
            if not isinstance(obj, dict):
                col.bad(lineno, f"expected a JSON object, got {type(obj).__name__}")
                continue
            missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
            if missing:
                col.bad(lineno, f"missing field(s) {', '.join(missing)}")
                continue
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
                col.bad(lineno, f"timestamp must be non-negative milliseconds, got {ts!r}")
                continue
            try:
                i = _parse_count(obj["input_length"], field_name="input_length")
                o = _parse_count(obj["output_length"], field_name="output_length")
            except ValueError as exc:
                col.bad(lineno, str(exc))
                continue
            h = obj.get("hash_ids")
            if h is not None and not (isinstance(h, list) and all(isinstance(x, int) for x in h)):
                col.bad(lineno, f"hash_ids must be a list of integers, got {str(h)[:40]!r}")
                continue
            any_hash = any_hash or h is not None
            t_ms.append(float(ts))
            isl.append(i)
            osl.append(o)
            hashes.append(h if h is not None else [])
    if not t_ms:
        raise ValueError(f"{path}: no valid requests (skipped {col.skipped} malformed lines)")
    t = np.asarray(t_ms, dtype=np.float64) / 1000.0
    return make_trace(
        path.name, t - t.min(), isl, osl, hashes if any_hash else None, skipped=col.skipped, examples=col.examples
    )


def load_trace(path: str | Path, *, fmt: str | None = None, skip_malformed: bool = False) -> Trace:
    """Load an Azure CSV or Mooncake JSONL trace (gzip or plain), sorted, starting at 0 s.

    fmt: 'azure' or 'mooncake'; None detects it from the content.
    skip_malformed: False raises ValueError naming the file and line number of the first
        malformed line; True skips such lines and counts them in `Trace.skipped_lines`.
    """
    path = Path(path)
    fmt = fmt or detect_format(path)
    # A gzip cut short past its first block fails only while the rows are read, and the
    # decompressor's error does not say which file.
    try:
        if fmt == "azure":
            return _load_azure(path, skip_malformed)
        if fmt == "mooncake":
            return _load_mooncake(path, skip_malformed)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path}: truncated or corrupt gzip data: {exc}") from None
    if fmt == "servegen":
        raise ValueError(
            f"{path}: is a ServeGen archive (per-window statistics, not requests): "
            "use workloads.servegen.load_servegen and synthesize_servegen"
        )
    raise ValueError(f"{path}: unknown trace format {fmt!r}; expected one of azure, mooncake")


def write_mooncake_jsonl(trace: Trace, path: str | Path) -> Path:
    """Write a trace as Mooncake JSONL (`timestamp` in whole ms, `input_length`, `output_length`, and
    `hash_ids` when the trace has them): the layout Dynamo's planner reads as a warm-up trace
    (predictor.warmup_trace_path), so a transformed trace (multiply_load, time_window) can warm one."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for i, (t_s, isl, osl) in enumerate(zip(trace.arrival_s, trace.isl_tokens, trace.osl_tokens)):
            row = {"timestamp": int(round(float(t_s) * 1000.0)), "input_length": int(isl), "output_length": int(osl)}
            if trace.hash_ids is not None:
                row["hash_ids"] = [int(h) for h in trace.hash_ids[i]]
            f.write(json.dumps(row) + "\n")
    return path


def bin_trace(trace: Trace, *, bin_s: float, start_s: float = 0.0, end_s: float | None = None,
              peak_window_s: float | None = None, peak_step_s: float = 5.0) -> LoadHistory:
    """Per-bin request counts and mean lengths, the series the planner's collect step rebuilds.

    bin_s: bin width, seconds. Bins cover [start_s, end_s) (end_s defaults to just past the
    last arrival); t_s holds bin end times. Empty bins have mean lengths NaN. peak_window_s:
    each bin's peak rate too (the collect step's peak_rps, read every peak_step_s); None: not read.
    """
    from planner.predict import bin_requests  # the planner core's binning: one definition

    return bin_requests(
        trace.arrival_s,
        trace.isl_tokens,
        trace.osl_tokens,
        bin_s=bin_s,
        start_s=start_s,
        end_s=trace.duration_s + 1e-9 if end_s is None else end_s,
        peak_window_s=peak_window_s,
        peak_step_s=peak_step_s,
    )


def scale_time(trace: Trace, factor: float) -> Trace:
    """Stretch (factor > 1) or compress (factor < 1) the time axis; rate changes by 1/factor."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"scale_time: factor must be a positive finite number, got {factor}")
    return Trace(
        name=f"{trace.name}*time{factor:g}",
        arrival_s=trace.arrival_s * factor,
        isl_tokens=trace.isl_tokens,
        osl_tokens=trace.osl_tokens,
        hash_ids=trace.hash_ids,
    )


def multiply_load(trace: Trace, k: float, *, seed: int, jitter_s: float = 1.0) -> Trace:
    """Superpose k copies of the trace, each request shifted by U(-jitter_s, +jitter_s).

    The shifts are far below a minute, so the minute-scale load shape is kept while
    arrivals of the copies do not coincide. A fractional k adds a random subset of one
    more copy (k=2.5: two copies plus half the requests of a third). The first copy is
    the original, unshifted. Times stay >= 0: a request shifted before the start is
    mirrored at 0 (|t|), so the copies' first seconds keep their spread. Clipping them to 0
    instead had piled every such request onto t = 0 (37-72 requests at once on the
    Azure traces x8, +-30 s): a synchronised clump in a model of independent tenants.
    """
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"multiply_load: k must be a positive finite number, got {k}")
    if jitter_s < 0:
        raise ValueError(f"multiply_load: jitter_s must be >= 0, got {jitter_s}")
    rng = np.random.default_rng(seed)
    n = len(trace)
    whole = int(math.floor(k + 1e-12))
    frac = k - whole
    pieces_idx = [np.arange(n)] * whole
    if frac > 1e-9:
        pieces_idx.append(np.sort(rng.choice(n, size=int(round(frac * n)), replace=False)))
    arrivals = []
    for copy, idx in enumerate(pieces_idx):
        t = trace.arrival_s[idx]
        if copy > 0 and jitter_s > 0:
            t = t + rng.uniform(-jitter_s, jitter_s, size=len(idx))
        arrivals.append(t)
    idx_all = np.concatenate(pieces_idx) if pieces_idx else np.arange(0)
    arrival = np.abs(np.concatenate(arrivals)) if arrivals else np.zeros(0)
    hashes = [trace.hash_ids[i] for i in idx_all] if trace.hash_ids is not None else None
    return make_trace(
        f"{trace.name}*load{k:g}", arrival, trace.isl_tokens[idx_all], trace.osl_tokens[idx_all], hashes,
        skipped=trace.skipped_lines, examples=trace.skipped_examples,
    )


def rotate_time(trace: Trace, offset_s: float, *, period_s: float | None = None) -> Trace:
    """The trace started offset_s later on a loop: t -> (t + offset_s) mod period_s, re-sorted.

    The same requests, lengths and bursts, at other minutes: a stand-in for another hour of the same
    service when a trace holds only one. period_s: the loop's length, beyond the last arrival (default:
    the whole minutes that hold the trace, so a one-hour trace keeps its minute grid).
    """
    period = (math.floor(trace.duration_s / 60.0) + 1) * 60.0 if period_s is None else float(period_s)
    if not (math.isfinite(period) and period > trace.duration_s):
        raise ValueError(f"rotate_time: period_s must be finite and beyond the last arrival "
                         f"({trace.duration_s:g} s), got {period_s}")
    if not math.isfinite(offset_s):
        raise ValueError(f"rotate_time: offset_s must be finite, got {offset_s}")
    return make_trace(f"{trace.name}>>{offset_s:g}s", np.mod(trace.arrival_s + offset_s, period), trace.isl_tokens,
                      trace.osl_tokens, trace.hash_ids, skipped=trace.skipped_lines, examples=trace.skipped_examples)


def lead_in(lead: Trace, trace: Trace, *, lead_s: float) -> Trace:
    """`lead` then `trace` started lead_s seconds later: a replay with ReplaySettings.lead_in_s = lead_s
    scores `trace` on a fleet and a planner that have run through `lead` (a running fleet's start)."""
    if not (math.isfinite(lead_s) and lead_s > lead.duration_s):
        raise ValueError(f"lead_in: lead_s must be finite and beyond the lead's last arrival ({lead.duration_s:g} s), "
                         f"got {lead_s}")
    hashes = None if lead.hash_ids is None or trace.hash_ids is None else list(lead.hash_ids) + list(trace.hash_ids)
    return make_trace(f"{lead.name}+{trace.name}@{lead_s:g}s", np.concatenate([lead.arrival_s, trace.arrival_s + lead_s]),
                      np.concatenate([lead.isl_tokens, trace.isl_tokens]),
                      np.concatenate([lead.osl_tokens, trace.osl_tokens]), hashes)


def time_window(trace: Trace, start_s: float, end_s: float) -> Trace:
    """Requests arriving in [start_s, end_s), re-based so start_s becomes 0."""
    if not end_s > start_s:
        raise ValueError(f"time_window: end_s ({end_s}) must be > start_s ({start_s})")
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, end_s], side="left")
    hashes = trace.hash_ids[lo:hi] if trace.hash_ids is not None else None
    return Trace(
        name=f"{trace.name}[{start_s:g}:{end_s:g}]",
        arrival_s=trace.arrival_s[lo:hi] - start_s,
        isl_tokens=trace.isl_tokens[lo:hi],
        osl_tokens=trace.osl_tokens[lo:hi],
        hash_ids=hashes,
    )


def with_idle_gaps(trace: Trace, *, busy_s: float, gap_s: float, bursts: int) -> Trace:
    """The trace's first `bursts` windows of busy_s seconds, each followed by gap_s seconds without a request.

    Window j ([j busy_s, (j+1) busy_s) of the source, as recorded) starts at j (busy_s + gap_s): a workload that
    idles between bursts (scale to zero's case). The source must be at least bursts x busy_s long.
    """
    if not (busy_s > 0 and gap_s >= 0 and bursts >= 1):
        raise ValueError(f"with_idle_gaps: need busy_s > 0, gap_s >= 0, bursts >= 1, got {busy_s}, {gap_s}, {bursts}")
    if trace.duration_s < bursts * busy_s:
        raise ValueError(f"with_idle_gaps: {trace.name} lasts {trace.duration_s:.0f} s, {bursts} bursts of "
                         f"{busy_s:g} s need {bursts * busy_s:g} s")
    parts = [time_window(trace, j * busy_s, (j + 1) * busy_s) for j in range(bursts)]
    hashes = None if trace.hash_ids is None else [h for p in parts for h in p.hash_ids]
    return make_trace(
        f"{trace.name} {bursts}x{busy_s:g}s+{gap_s:g}s idle",
        np.concatenate([p.arrival_s + j * (busy_s + gap_s) for j, p in enumerate(parts)]),
        np.concatenate([p.isl_tokens for p in parts]), np.concatenate([p.osl_tokens for p in parts]), hashes)


def detect_tick_s(trace: Trace, *, min_tick_s: float = 0.5) -> float | None:
    """Timestamp rounding tick of a trace, seconds, or None when arrivals are not on a grid.

    A trace is ticked when every arrival is a multiple of a common step >= min_tick_s
    (e.g. Mooncake traces rounded to ~3 s), found as the GCD of the arrival times in ms.
    """
    if len(trace) < 2:
        return None
    ms = np.round(trace.arrival_s * 1000.0)
    if np.any(np.abs(ms - trace.arrival_s * 1000.0) > 1e-6):
        return None
    tick_ms = int(np.gcd.reduce(ms.astype(np.int64)))
    return tick_ms / 1000.0 if tick_ms / 1000.0 >= min_tick_s else None


def jitter_within_ticks(trace: Trace, *, tick_s: float, seed: int) -> Trace:
    """Spread arrivals uniformly inside their rounding tick [t, t + tick_s).

    Rounded timestamps replayed as-is would send a whole tick's requests at once.
    """
    if not tick_s > 0:
        raise ValueError(f"jitter_within_ticks: tick_s must be > 0, got {tick_s}")
    rng = np.random.default_rng(seed)
    arrival = trace.arrival_s + rng.uniform(0.0, tick_s, size=len(trace))
    return make_trace(
        f"{trace.name}~jitter{tick_s:g}", arrival, trace.isl_tokens, trace.osl_tokens, trace.hash_ids,
        skipped=trace.skipped_lines, examples=trace.skipped_examples,
    )


def load_warmup_trace(path: str) -> Trace:
    """The warm-up trace (predictor.warmup_trace_path), read once.

    Errors name the file: a missing or malformed trace fails the run rather
    than silently forecasting without it.
    """
    try:
        trace = load_trace(path)
    except OSError as exc:
        raise ValueError(f"predictor.warmup_trace_path: {path}: cannot read the warm-up trace: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"predictor.warmup_trace_path: {exc}") from None
    if len(trace) == 0:
        raise ValueError(f"predictor.warmup_trace_path {path}: the warm-up trace holds no requests")
    return trace


def load_warmup_history(path: str, *, interval_s: float, peak_window_s: float | None = None,
                        peak_step_s: float = 5.0) -> LoadHistory:
    """A warm-up trace's per-interval load (predictor.warmup_trace_path), binned at interval_s seconds.

    peak_window_s / peak_step_s: the live collect step's peak-rate window and step; with them each
    warm interval carries its peak rate too, so the burst and clumping signals read from the first
    run (None: not read, as when the live history has no peak rates).
    """
    return bin_trace(load_warmup_trace(path), bin_s=interval_s, peak_window_s=peak_window_s, peak_step_s=peak_step_s)

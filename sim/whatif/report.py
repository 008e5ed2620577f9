"""What a replay means: SLA attainment, latency percentiles, GPU-hours, scale events, plots.

`summarize` gives the JSON the CLI writes and the flows publish; `plot_*` draw PNG
figures with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.replay import ReplayResult

PERCENTILES = (50, 90, 99)


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    v = values[np.isfinite(values)]
    if not len(v):
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": float(x) for p, x in zip(PERCENTILES, np.percentile(v, PERCENTILES), strict=True)}


def _reactive_cell(tried: list | None, attainment: float) -> str:
    """The shortest hindsight-reactive hold reaching the policy's attainment, or the best one tried; n/a: not run."""
    if not tried:
        return "n/a"
    w, att, gph = tried[-1]
    if att >= attainment:
        return f"hold {w}: {100 * att:.2f}% @ {gph:.2f} GPU-h"
    w, att, gph = max(tried, key=lambda x: x[1])
    return f"none of {len(tried)} holds (best, {w}: {100 * att:.2f}% @ {gph:.2f} GPU-h)"


def summarize(result: ReplayResult, *, oracle_gpu_hours: float | None = None, extra: dict | None = None) -> dict:
    """The replay's headline figures as plain JSON-able values.

    slo_attainment: share of requests meeting both the TTFT and the ITL target (0..1).
    ttft_ms / itl_ms / e2e_ms: p50, p90, p99 over requests (ITL over requests with >1 token).
    gpu_hours: GPUs allocated (starting, ready or draining) integrated over the replay.
    scale_events: pool-level target changes applied.
    """
    req = result.requests
    met = result.sla_met()
    slo = result.scenario.slo
    ttft = req.ttft_ms
    itl = req.itl_ms
    itl_ok = np.isnan(itl) | (itl <= slo.itl_ms)
    out = {
        "trace": result.trace_name,
        "policy": result.policy,
        "requests": int(len(req.arrival_s)),
        "completed": int(np.isfinite(req.finish_s).sum()),
        "slo_attainment": float(met.mean()) if len(met) else 1.0,
        "ttft_attainment": float((ttft <= slo.ttft_ms).mean()) if len(ttft) else 1.0,
        "itl_attainment": float(itl_ok.mean()) if len(itl) else 1.0,
        "ttft_ms": _percentiles(ttft),
        "itl_ms": _percentiles(itl),
        "e2e_ms": _percentiles(req.e2e_ms),
        "gpu_hours": result.gpu_hours,
        "gpu_hours_by_pool": {k: v / 3600.0 for k, v in result.gpu_seconds.items()},
        "oracle_gpu_hours": oracle_gpu_hours,
        "scale_events": len(result.scale_log),
        "max_replicas": {
            "prefill": int(max(result.timeline.prefill_allocated, default=0)),
            "decode": int(max(result.timeline.decode_allocated, default=0)),
        },
        "engine_model": result.scenario.sim.engine_model,
        "simulated_s": result.end_s,
        "wall_s": result.wall_s,
        "policy_wall_s": result.policy_wall_s,
        "requests_per_wall_s": len(req.arrival_s) / result.wall_s if result.wall_s > 0 else None,
        "scenario": {
            "ttft_ms": slo.ttft_ms,
            "itl_ms": slo.itl_ms,
            "interval_s": result.scenario.interval_s,
            "startup_s": result.scenario.sim.startup_s,
            "router": result.scenario.router,
        },
    }
    if result.fast_path_events:
        out["fast_path"] = fast_path_summary(result)
    if extra:
        out.update(extra)
    return out


def fast_path_summary(result: ReplayResult) -> dict:
    """The fast path's events with their latencies, s: onset -> decision -> replicas ready.

    onset_to_decision_s etc.: p50 / p90 / max over the events that scaled up
    (ready: over those whose replicas all served).
    """
    events = result.fast_path_events
    ups = [e for e in events if e.applied]
    ready = [e for e in ups if e.ready_s is not None]

    def spread(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p90": None, "max": None}
        v = np.asarray(values, dtype=float)
        return {"p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)), "max": float(v.max())}

    codes: dict[str, int] = {}
    for e in events:
        codes[e.code] = codes.get(e.code, 0) + 1
    return {
        "events": len(events),
        "scale_ups": len(ups),
        "by_code": codes,
        "onset_to_decision_s": spread([e.decided_s - e.onset_s for e in ups]),
        "decision_to_ready_s": spread([e.ready_s - e.decided_s for e in ready]),
        "onset_to_ready_s": spread([e.ready_s - e.onset_s for e in ready]),
        "list": [e.as_dict() for e in events],
    }


def floor_words(floor: dict) -> str:
    """The warm-up's start floor in words (the what-if summary's warmup_floor)."""
    if not floor["runs"]:
        return "the warm-up's floor raised no target (the sizing was above it)"
    pools = ", ".join(f"{p} to {floor[p]}" for p in ("prefill", "decode") if floor[p])
    return f"the warm-up's floor raised {pools} ({floor['runs']} run(s))"


def markdown_report(summary: dict) -> str:
    """A short Markdown table of the headline figures (for a Prefect artifact)."""

    def ms(d: dict, key: str) -> str:
        v = d[key]
        return "n/a" if v is None else f"{v:.1f}"

    s = summary
    oracle = "n/a" if s.get("oracle_gpu_hours") is None else f"{s['oracle_gpu_hours']:.2f}"
    rows = [
        ("trace", s["trace"]),
        ("load", s.get("load_model") or "the trace as recorded"),
        ("policy", s["policy"]),
        ("engines timed as", "Dynamo 1.6.1's mocker" if s.get("engine_model") == "dynamo_mocker" else "the profile"),
        ("requests", f"{s['requests']:,}"),
        ("SLA attainment (TTFT and ITL)", f"{100 * s['slo_attainment']:.2f}%"),
        ("TTFT p50 / p90 / p99, ms", " / ".join(ms(s["ttft_ms"], k) for k in ("p50", "p90", "p99"))),
        ("ITL p50 / p90 / p99, ms", " / ".join(ms(s["itl_ms"], k) for k in ("p50", "p90", "p99"))),
        ("GPU-hours", f"{s['gpu_hours']:.2f}"),
        ("oracle GPU-hours", oracle),
        ("hindsight-reactive reaching it", _reactive_cell(s.get("hindsight_reactive_tried"), s["slo_attainment"])),
        ("scale events", str(s["scale_events"])),
        (
            "SLA targets",
            f"TTFT {s['scenario']['ttft_ms']:g} ms, ITL {s['scenario']['itl_ms']:g} ms, "
            f"interval {s['scenario']['interval_s']:g} s, startup {s['scenario']['startup_s']:g} s",
        ),
        ("wall time, s", f"{s['wall_s']:.1f}"),
    ]
    start = [f"predictor warmed from {s['warmup_trace_path']}"] if s.get("warmup_trace_path") else []
    if s.get("warmup_floor"):
        start.append(floor_words(s["warmup_floor"]))
    if s.get("lead_in_trace_path"):
        start.append(f"after {s['lead_in_trace_path']}, replayed first and not scored (a running fleet)")
    if start:
        rows.insert(3, ("planner start", "; ".join(start)))
    if s.get("recurrence_hold_s"):
        rows.insert(3, ("scale-down hold", f"recurrence hold, {s['recurrence_hold_s']:g} s (rank 2)"))
    if s.get("planner_settings"):
        rows.insert(3, ("planner settings", ", ".join(f"{k} = {v}" for k, v in s["planner_settings"].items())))
    fast = s.get("fast_path")
    if fast is not None:
        rows.insert(-2, ("fast-path events (scale-ups)", f"{fast['events']} ({fast['scale_ups']})"))
    lines = ["| quantity | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if fast is not None:
        lines += ["", *fast_path_table(fast)]
    return "\n".join(lines)


FAST_PATH_ROWS = 20


def fast_path_table(fast: dict) -> list[str]:
    """Markdown lines: each fast-path event's onset, decision and ready times (s) and targets."""

    def when(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.0f}"

    lines = [
        "Fast path: saturation onset -> decision -> replicas ready (simulated s)",
        "",
        "| onset | fired | decided | ready | onset -> ready, s | decision | prefill, decode |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in fast["list"][:FAST_PATH_ROWS]:
        took = "n/a" if e["ready_s"] is None else f"{e['ready_s'] - e['onset_s']:.0f}"
        change = f"{e['from_replicas'][0]}, {e['from_replicas'][1]}"
        if e["applied"]:
            change += f" -> {e['to_replicas'][0]}, {e['to_replicas'][1]}"
        lines.append(f"| {when(e['onset_s'])} | {when(e['fired_s'])} | {when(e['decided_s'])} | {when(e['ready_s'])} "
                     f"| {took} | {e['code']} | {change} |")
    if len(fast["list"]) > FAST_PATH_ROWS:
        lines.append(f"| ... {len(fast['list']) - FAST_PATH_ROWS} more | | | | | | |")
    return lines


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path) -> Path:
    """Write the laid-out figure to path as PNG, close it; returns the path."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def plot_load_vs_replicas(result: ReplayResult, path: str | Path) -> Path:
    """PNG: request rate per interval against ready/allocated workers of both pools."""
    plt = _figure()
    tl = result.timeline
    t_min = np.asarray(tl.t_s) / 60.0
    rps = np.asarray(tl.arrivals) / result.scenario.interval_s
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    ax.plot(t_min, rps, color="0.4", label="arrivals, req/s")
    ax.set_xlabel("time, min")
    ax.set_ylabel("requests/s")
    ax2 = ax.twinx()
    ax2.step(t_min, tl.prefill_ready, where="post", color="tab:blue", label="prefill ready")
    ax2.step(t_min, tl.decode_ready, where="post", color="tab:orange", label="decode ready")
    ax2.step(t_min, tl.prefill_allocated, where="post", color="tab:blue", ls=":", label="prefill allocated")
    ax2.step(t_min, tl.decode_allocated, where="post", color="tab:orange", ls=":", label="decode allocated")
    ax2.set_ylabel("workers")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title(f"{result.trace_name}: load vs workers ({result.policy})")
    return _save(plt, fig, path)


def plot_latency(result: ReplayResult, path: str | Path) -> Path:
    """PNG: per-interval p90 TTFT and ITL (by arrival interval) against the targets."""
    plt = _figure()
    req = result.requests
    interval = result.scenario.interval_s
    n = max(1, int(math.ceil(result.end_s / interval)))
    idx = np.minimum((req.arrival_s // interval).astype(int), n - 1)
    ttft, itl = req.ttft_ms, req.itl_ms
    p90_ttft = np.full(n, np.nan)
    p90_itl = np.full(n, np.nan)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    for i in range(n):
        sel = order[bounds[i] : bounds[i + 1]]
        if len(sel):
            p90_ttft[i] = np.nanpercentile(ttft[sel], 90)
            v = itl[sel]
            if np.isfinite(v).any():
                p90_itl[i] = np.nanpercentile(v, 90)
    t_min = (np.arange(n) + 0.5) * interval / 60.0
    slo = result.scenario.slo
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), dpi=100, sharex=True)
    a1.plot(t_min, p90_ttft, color="tab:blue", label="p90 TTFT")
    a1.axhline(slo.ttft_ms, color="tab:red", ls="--", label=f"target {slo.ttft_ms:g} ms")
    a1.set_ylabel("TTFT, ms")
    a1.set_yscale("log")
    a1.legend(fontsize=8)
    a2.plot(t_min, p90_itl, color="tab:orange", label="p90 ITL")
    a2.axhline(slo.itl_ms, color="tab:red", ls="--", label=f"target {slo.itl_ms:g} ms")
    a2.set_ylabel("ITL, ms")
    a2.set_xlabel("time, min (by arrival)")
    a2.legend(fontsize=8)
    a1.set_title(f"{result.trace_name}: latency over time ({result.policy})")
    return _save(plt, fig, path)


def misses_per_minute(result: ReplayResult) -> tuple[np.ndarray, np.ndarray]:
    """(minute starts, requests missing the SLA) by arrival minute, over the whole replay."""
    req = result.requests
    n = max(1, int(math.ceil(result.end_s / 60.0)))
    minute = np.minimum((req.arrival_s // 60.0).astype(int), n - 1)
    missed = np.bincount(minute[~result.sla_met()], minlength=n)
    return np.arange(n, dtype=float), missed


def plot_misses_per_minute(results: dict[str, ReplayResult], path: str | Path) -> Path:
    """PNG: workers of each pool and requests missing the SLA per minute, one line per replay.

    results: label -> replay of the same trace, e.g. the planner, the oracle and the best static fleet.
    """
    plt = _figure()
    fig, (ap, ad, am) = plt.subplots(3, 1, figsize=(10, 7.5), dpi=100, sharex=True,
                                     gridspec_kw={"height_ratios": (1, 1, 1.2)})
    for i, (label, r) in enumerate(results.items()):
        color = f"C{i}"
        tl = r.timeline
        t_min = np.asarray(tl.t_s) / 60.0
        ap.step(t_min, tl.prefill_allocated, where="post", color=color, label=f"{label} ({r.gpu_hours:.2f} GPU-h)")
        ad.step(t_min, tl.decode_allocated, where="post", color=color, label=label)
        minutes, missed = misses_per_minute(r)
        share = 100.0 * float(r.sla_met().mean()) if len(r.requests.arrival_s) else 100.0
        am.step(minutes, missed, where="post", color=color, label=f"{label}: {int(missed.sum()):,} missed, "
                                                                     f"{share:.2f}% met")
    ap.set_ylabel("prefill workers")
    ad.set_ylabel("decode workers")
    am.set_ylabel("SLA misses / min")
    am.set_xlabel("time, min (misses by arrival)")
    for ax in (ap, ad, am):
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)
    ap.legend(fontsize=8, loc="upper left")
    am.legend(fontsize=8, loc="upper left")
    first = next(iter(results.values()))
    slo = first.scenario.slo
    ap.set_title(f"{first.trace_name}: workers and SLA misses per minute "
                 f"(TTFT {slo.ttft_ms:g} ms, ITL {slo.itl_ms:g} ms)")
    return _save(plt, fig, path)

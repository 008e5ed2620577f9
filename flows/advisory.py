"""What a recommend-only (advisory) run shows beside its decision: the comparison with the running autoscaler.

Pure builders (no Prefect imports), as flows.report's: the decision table's advisory rows, the
summary's paragraph and the chart's lines, from planner.advisory's comparison.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from connectors.autoscaler_history import AdvisoryHistory
from flows.charts import AdvisoryLines
from planner.advisory import AdvisoryComparison, ReplicaRow, advisory_targets, comparison_grid, value_at
from planner.types import POOLS, Decision


@dataclass(frozen=True)
class AdvisoryView:
    """Everything a recommend-only run publishes about the comparison: table rows, summary, chart lines,
    and both series as a table of their changes (`series_table`)."""

    comparison: AdvisoryComparison
    rows: list[tuple[str, str, str]]
    summary: str
    lines: AdvisoryLines
    series: list[dict]

    def as_dict(self) -> dict:
        """The comparison for the run's result data (JSON-friendly)."""
        c = self.comparison
        return {"autoscaler": self.lines.autoscaler, "now": {p: {"advisory": c.advisory_now[p],
                                                                  "autoscaler": c.autoscaler_now[p]} for p in POOLS},
                "window_s": c.window_s, "intervals": c.intervals, "advisory_gpu_hours": c.advisory_gpu_hours,
                "autoscaler_gpu_hours": c.autoscaler_gpu_hours, "more_intervals": c.more_intervals,
                "fewer_intervals": c.fewer_intervals, "same_intervals": c.same_intervals}


def advisory_view(c: AdvisoryComparison, history: AdvisoryHistory, decision: Decision, *, autoscaler: str,
                  now_s: float) -> AdvisoryView:
    """The run's comparison as published: autoscaler names the running autoscaler; now_s: the run's time, s."""
    ours = (*history.advisory, advisory_targets(decision, now_s=now_s))
    theirs = (*history.autoscaler, (now_s, *(c.autoscaler_now[p] for p in POOLS)))
    return AdvisoryView(
        comparison=c, rows=advisory_rows(c, autoscaler=autoscaler, queries=history.queries),
        summary=advisory_summary(c, autoscaler=autoscaler),
        lines=AdvisoryLines(autoscaler, ours),
        series=series_table(ours, theirs, now_s=now_s, window_s=c.window_s, step_s=c.step_s),
    )


def series_table(ours: Sequence[ReplicaRow], theirs: Sequence[ReplicaRow], *, now_s: float, window_s: float,
                 step_s: float) -> list[dict]:
    """Both histories on the comparison's grid (one point per step_s ending at now_s, seconds), one row where
    either changes (the first point and now always): time (UTC), ours and theirs per pool ("" where unknown)."""
    ours, theirs = sorted(ours, key=lambda r: r[0]), sorted(theirs, key=lambda r: r[0])
    grid = comparison_grid(now_s=now_s, window_s=window_s, step_s=step_s)
    out: list[dict] = []
    last = None
    for i, t in enumerate(grid):
        values = tuple(value_at(rows, t, pool=p, max_age_s=step_s) for rows in (ours, theirs) for p in POOLS)
        if values != last or i == len(grid) - 1:
            out.append({"time (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)),
                        **{f"{side} {p}": "" if v is None else v
                           for (side, p), v in zip([(s, p) for s in ("ours", "theirs") for p in POOLS], values)}})
            last = values
    return out


def _signed(n: int | None) -> str:
    return "unknown" if n is None else f"{n:+d}"


def _gpu_hours_delta(ours: float, theirs: float) -> str:
    if theirs <= 0:
        return f"{ours - theirs:+.2f} GPU-h"
    return f"{ours - theirs:+.2f} GPU-h, {100 * (ours - theirs) / theirs:+.1f}%"


def _span(c: AdvisoryComparison) -> str:
    return f"{c.intervals} of {int(c.window_s // c.step_s)} intervals of {c.step_s:g} s with both known"


def advisory_rows(c: AdvisoryComparison, *, autoscaler: str,
                  queries: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str, str]]:
    """(item, value, detail) rows: this run against the autoscaler now, then the window's summary."""
    rows = [("result", "advisory", f"nothing written (planner.mode advisory); {autoscaler} runs the fleet")]
    for pool in POOLS:
        ours, theirs = c.advisory_now[pool], c.autoscaler_now[pool]
        rows.append((f"{pool}: ours vs {autoscaler} now", f"{ours} vs {theirs} ({_signed(c.now_difference[pool])})",
                     "advisory target against the replicas the connector reads now"))
    hours = c.window_s / 3600.0
    rows.append((f"GPU-hours over {hours:g} h: ours vs {autoscaler}",
                 f"{c.advisory_gpu_hours:.2f} vs {c.autoscaler_gpu_hours:.2f}",
                 f"{_gpu_hours_delta(c.advisory_gpu_hours, c.autoscaler_gpu_hours)}; {_span(c)}"))
    rows.append((f"intervals ours more / fewer / same GPUs over {hours:g} h",
                 f"{c.more_intervals} / {c.fewer_intervals} / {c.same_intervals}",
                 "; ".join(f"{pool}: {p.more_intervals} / {p.fewer_intervals} / {p.same_intervals} "
                           f"({p.advisory_gpu_hours:.2f} vs {p.autoscaler_gpu_hours:.2f} GPU-h)"
                           for pool, p in c.pools.items())))
    for what, query in queries:
        rows.append((f"read back: {what}", "PromQL", query))
    return rows


def advisory_summary(c: AdvisoryComparison, *, autoscaler: str) -> str:
    """A markdown paragraph naming the comparison: now, then over the window."""
    now = ", ".join(f"{pool} {c.advisory_now[pool]} vs {c.autoscaler_now[pool]} ({_signed(c.now_difference[pool])})"
                    for pool in POOLS)
    hours = c.window_s / 3600.0
    if c.intervals <= 1:
        window = (f"Over the last {hours:g} h only this run has both sides (the advisory's history is its "
                  f"published gauges, which start with its first run).")
    else:
        window = (f"Over the last {hours:g} h ({_span(c)}): ours {c.advisory_gpu_hours:.2f} GPU-h, {autoscaler} "
                  f"{c.autoscaler_gpu_hours:.2f} GPU-h ({_gpu_hours_delta(c.advisory_gpu_hours, c.autoscaler_gpu_hours)}); "
                  f"ours had more GPUs in {c.more_intervals} intervals, fewer in {c.fewer_intervals}, "
                  f"as many in {c.same_intervals}.")
    return f"**Advisory vs {autoscaler}** (ours vs theirs now): {now}. {window}"

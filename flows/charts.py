"""Pictures for the Prefect UI: a planner run's chart and the data: URL an image artifact carries.

The chart is rebuilt from what the run read (the load history from Prometheus,
the connector's recommendation and applied-decision histories) and what it
decided, so it needs no store of its own. It is drawn with matplotlib's object
API on the Agg canvas (no pyplot, no display, no global figure state).
"""

from __future__ import annotations

import base64
import importlib
import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.advisory import ReplicaRow
from planner.pipeline import PlanResult
from planner.types import DecisionRecord

CHART_SIZE_PX = (960, 540)
_DPI = 96

# Importing matplotlib takes ~0.4 s, longer than drawing (~0.1 s): start it when the flow's module is
# loaded, so it overlaps the run's network reads instead of adding to the run's end. Nothing else is kept.
threading.Thread(target=importlib.import_module, args=("matplotlib.backends.backend_agg",),
                 name="import-matplotlib", daemon=True).start()


@dataclass(frozen=True)
class AdvisoryLines:
    """A recommend-only run's lines: the running autoscaler's name, and the advisory's targets as rows
    (t_s, prefill, decode), this run's last."""

    autoscaler: str
    targets: Sequence[ReplicaRow]


def png_data_url(png: bytes | str | Path) -> str:
    """A data: URL of a PNG (its bytes, or a file's path), for `create_image_artifact`."""
    data = png if isinstance(png, bytes) else Path(png).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _steps(points: list[tuple[float, int]], *, start_s: float, end_s: float) -> tuple[list[float], list[int]]:
    """A step series over [start_s, end_s] from (t_s, value) changes, oldest first: the value in
    effect at start_s (the newest change at or before it) is carried in from the left edge."""
    before = [p for p in points if p[0] <= start_s]
    inside = [p for p in points if start_s < p[0] <= end_s]
    kept = ([(start_s, before[-1][1])] if before else []) + inside
    if not kept:
        return [], []
    kept.append((end_s, kept[-1][1]))
    return [t for t, _ in kept], [v for _, v in kept]


def planner_chart_png(
    result: PlanResult, *, now_s: float, record: DecisionRecord | None, window_s: float = 3 * 3600.0,
    title: str = "", advisory: AdvisoryLines | None = None,
) -> bytes:
    """PNG (CHART_SIZE_PX) of planner_chart_figure (the same arguments)."""
    fig = planner_chart_figure(result, now_s=now_s, record=record, window_s=window_s, title=title, advisory=advisory)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def planner_chart_figure(
    result: PlanResult, *, now_s: float, record: DecisionRecord | None, window_s: float = 3 * 3600.0,
    title: str = "", advisory: AdvisoryLines | None = None,
):
    """The chart as a matplotlib Figure (Agg canvas) of the last window_s seconds up to one interval past now_s.

    Top: observed requests/s per interval and this run's forecast for the next
    interval (mean, p90 as a bar), the observed mean TTFT against its target in
    the legend when known. Bottom, per pool: the applied targets (the
    connector's decision history, this run's decision when it applied one),
    the recommendations of recent runs (stabilization history plus this run's)
    and the replicas the fleet reported now. Times are minutes relative to now (hours past a 6 h window).
    advisory: a recommend-only run's two lines per pool instead of the applied one: the running
    autoscaler's replicas (the fleet's applied targets) and the advisory's targets.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    obs, fc = result.observation, result.forecast
    interval_s = obs.interval_s
    start_s, end_s = now_s - window_s, now_s + interval_s

    # Minutes up to a few hours; an advisory run's window of days reads in hours.
    unit_s, unit = (3600.0, "hours") if window_s > 6 * 3600.0 else (60.0, "minutes")

    def minutes(ts) -> list[float]:
        return [(t - now_s) / unit_s for t in ts]

    fig = Figure(figsize=(CHART_SIZE_PX[0] / _DPI, CHART_SIZE_PX[1] / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)
    load_ax, rep_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (1, 1)})

    hist = obs.history
    if hist is not None and hist.t_s:
        pts = [(t, n / hist.interval_s) for t, n in zip(hist.t_s, hist.num_requests) if start_s <= t <= now_s]
        if pts:
            load_ax.plot(minutes([t for t, _ in pts]), [r for _, r in pts], color="0.35", lw=1.2,
                         label="observed, req/s")
    if obs.num_requests is not None and obs.num_requests == obs.num_requests:
        label = "this interval"
        if obs.avg_ttft_ms is not None and obs.avg_ttft_ms == obs.avg_ttft_ms:
            label += f" (mean TTFT {obs.avg_ttft_ms:.0f} ms)"
        load_ax.plot([0.0], [obs.num_requests / interval_s], "o", color="0.2", ms=4, label=label)
    if fc is not None:
        mean, p90 = fc.num_requests / interval_s, fc.num_requests_p90 / interval_s
        x = interval_s / unit_s
        load_ax.errorbar([x], [mean], yerr=[[0.0], [max(0.0, p90 - mean)]], fmt="D", color="tab:purple", ms=5,
                         capsize=3, label=f"forecast next interval ({fc.predictor}), bar to p90")
    load_ax.set_ylabel("requests/s")
    load_ax.set_ylim(bottom=0)
    if load_ax.get_legend_handles_labels()[0]:
        load_ax.legend(loc="upper left", fontsize=7)
    load_ax.grid(alpha=0.3)

    applied, recommended = _draw_replicas(rep_ax, result, now_s=now_s, record=record, start_s=start_s, end_s=end_s,
                                          minutes=minutes, advisory=advisory, unit=unit)
    # The window shrinks to the data there is (a new deployment has minutes of it, not hours).
    seen = [t for t in (*(hist.t_s if hist is not None else ()), *(a[0] for a in applied),
                        *(r[0] for r in recommended)) if start_s <= t <= now_s]
    left_s = min(seen, default=now_s - 10 * interval_s) - interval_s / 2
    left_min, right_min = (left_s - now_s) / unit_s, (end_s - now_s) / unit_s
    for ax in (load_ax, rep_ax):
        ax.axvline(0.0, color="0.6", lw=0.8, ls="--")
        ax.set_xlim(left_min, right_min + 0.03 * (right_min - left_min))
    if title:
        load_ax.set_title(title, fontsize=9)
    # Fixed margins: tight_layout would measure every label first, a third of the drawing time.
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.09, top=0.94 if title else 0.98, hspace=0.08)
    return fig


def _draw_replicas(ax, result: PlanResult, *, now_s: float, record: DecisionRecord | None, start_s: float,
                   end_s: float, minutes, advisory: AdvisoryLines | None = None,
                   unit: str = "minutes") -> tuple[list, list]:
    """Per pool: applied targets as steps (advisory: the running autoscaler's, and the advisory's targets
    beside them), recent recommendations as dots, the replicas set now; returns (applied, recommended) as
    (t_s, prefill, decode) rows."""
    fleet, d = result.fleet, result.decision
    applied = list(fleet.applied_targets)
    if record is not None:
        applied.append((record.decided_at_s, record.prefill_replicas, record.decode_replicas))
    recommended = list(fleet.recent_targets) + [
        (now_s, d.recommended_prefill_replicas if d.recommended_prefill_replicas is not None else d.prefill_replicas,
         d.recommended_decode_replicas if d.recommended_decode_replicas is not None else d.decode_replicas)]
    for i, (pool, color) in enumerate((("prefill", "tab:blue"), ("decode", "tab:orange"))):
        ts, vs = _steps([(t, v[i]) for t, *v in applied], start_s=start_s, end_s=end_s)
        if ts:
            ax.step(minutes(ts), vs, where="post", color=color, lw=1.6,
                    label=f"{pool} {advisory.autoscaler} (actual)" if advisory else f"{pool} applied")
        if advisory is not None:
            ours = [(t, v[i]) for t, *v in advisory.targets if v[i] is not None]
            ts, vs = _steps(ours, start_s=start_s, end_s=end_s)
            if ts:
                # Dashed on top of the actual lines, the pools' dashes out of phase: where the advisory's
                # pools hold the same count, both colours still show.
                ax.step(minutes(ts), vs, where="post", color=color, lw=2.2, ls=(4 * i, (4, 4)), zorder=3,
                        label=f"{pool} ours (advisory)")
        # An advisory run's window may hold a week of recommendations: only this run's is drawn.
        rec = [(t, v[i]) for t, *v in (recommended[-1:] if advisory else recommended) if start_s <= t <= end_s]
        ax.plot(minutes([t for t, _ in rec]), [v for _, v in rec], ".", color=color, ms=5,
                label=f"{pool} recommended")
        state = getattr(fleet, pool)
        ax.plot([0.0], [state.current_replicas], "s", mfc="none", color=color, ms=7,
                label=f"{pool} set now {state.current_replicas} (ready {state.ready_replicas})")
    ax.set_ylabel("replicas")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(f"{unit} from this run")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return applied, recommended

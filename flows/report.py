"""What a planner run shows in the Prefect UI: its name, its final message, a table of
inputs → decision and a summary.

Pure builders (no Prefect imports) so tests can check the content directly.
"""

from __future__ import annotations

import math
import re
import textwrap
import time

from planner.config import SloTarget
from planner.pipeline import PlanResult
from planner.signals.slo_attainment import TargetShare, share_within
from planner.types import POOLS, DecisionRecord, LatencyHistogram, LatencyWindow, Observation, ReasonCode

# The UI draws table cells on one line and cuts them at the column's edge; cells are
# Markdown, so a hard line break ("  \n") every this many characters shows all of a detail.
CELL_WIDTH_CHARS = 90


def artifact_key(kind: str, namespace: str, *, what_if: bool = False) -> str:
    """A stable artifact key (lowercase letters, digits, dashes) so the UI keeps the history.

    what_if: a run that applies nothing (dry run or what-if) writes to its own key,
    sla-planner-what-if-<kind>-<namespace>, so a live key's history holds applied runs only.
    """
    slug = re.sub(r"[^a-z0-9-]+", "-", f"sla-planner-{'what-if-' if what_if else ''}{kind}-{namespace}".lower())
    return re.sub(r"-{2,}", "-", slug.strip("-"))


def wrap_cell(text: str, width: int = CELL_WIDTH_CHARS) -> str:
    """text with Markdown hard line breaks so no line is longer than width (words are never split)."""
    if len(text) <= width:
        return text
    return "  \n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False))


def _change(before: int, after: int) -> str:
    return f"{before}→{after}" if before != after else str(after)


def run_name(result: PlanResult, *, now_s: float, applying: bool, what_if: bool = False,
             advisory: bool = False) -> str:
    """The flow run's name: the interval's end (UTC, HH:MM) and the targets, e.g. `12:05 prefill 2→3 decode 4`.

    now_s: the run's clock, Unix seconds. A run that applies nothing says so at the end (advisory: a
    recommend-only run, planner.mode advisory).
    """
    fleet, d = result.fleet, result.decision
    name = (f"{time.strftime('%H:%M', time.gmtime(now_s))} "
            f"prefill {_change(fleet.prefill.current_replicas, d.prefill_replicas)} "
            f"decode {_change(fleet.decode.current_replicas, d.decode_replicas)}")
    if not applying:
        name += " (what-if)" if what_if else " (advisory)" if advisory else " (dry run)"
    return name


_HOLDS = {
    ReasonCode.HOLD_STALE_METRICS: "stale data",
    ReasonCode.HOLD_MISSING_METRICS: "no load data",
    ReasonCode.HOLD_PARTIAL_METRICS: "partial metrics",
    ReasonCode.HOLD_PREVIOUS_NOT_DONE: "previous decision not done",
    ReasonCode.TRANSITION_IN_PROGRESS: "replicas still starting",
    ReasonCode.FAST_PATH_COOLDOWN: "fast-path cooldown",
}
# What moved a pool's target, strongest first; the SLA sizing is named by the latency it sizes for.
_CAUSES = {
    ReasonCode.SCALE_TO_ZERO: "scale to zero",  # overrides the scale-down holds after it in this list
    ReasonCode.WAKE_FROM_ZERO: "wake from zero",
    ReasonCode.FAST_PATH_SCALE_UP: "fast path",
    ReasonCode.SATURATION_SCALE_UP: "saturation",
    ReasonCode.SATURATION_VETO_SCALE_DOWN: "saturation veto",
    ReasonCode.CLAMPED_MIN: "min replicas",
    ReasonCode.CLAMPED_MAX: "max replicas",
    ReasonCode.GPU_BUDGET: "GPU budget",
    ReasonCode.MAX_STEP: "step limit",
    ReasonCode.STABILIZATION_WINDOW: "stabilization window",
    ReasonCode.SCALE_DOWN_FLOOR: "scale-down floor",
    ReasonCode.WARMUP_NO_SCALE_DOWN: "warm-up",
    ReasonCode.WARMUP_START_FLOOR: "warm-up floor",
    ReasonCode.SCALE_UP_PAST_PENDING: "scale-up past a pending decision",
    ReasonCode.KEPT_ABOVE_ZERO: "kept above zero",
}
_SIZED_ON = {"prefill": "TTFT forecast", "decode": "ITL forecast"}


def _holds(reasons) -> list[str]:
    """The holds a run's reasons name, in _HOLDS order.

    A pool missing load data has no SLA sizing; a missing-metrics hold on a pool
    that was sized comes from the guardrail: its saturation metrics are missing.
    """
    codes = {r.code for r in reasons}
    sized = {r.pool for r in reasons if r.code == ReasonCode.SLA_SIZING}
    out = []
    for code, why in _HOLDS.items():
        if code != ReasonCode.HOLD_MISSING_METRICS:
            out += [why] if code in codes else []
            continue
        missing = {r.pool for r in reasons if r.code == code}
        out += [why] if missing - sized else []
        out += ["saturation metrics missing"] if missing & sized else []
    return out


def run_message(result: PlanResult, *, record: DecisionRecord | None, applying: bool, what_if: bool = False,
                advisory: bool = False) -> str:
    """The run's final state message: what it did and why, in a few words.

    e.g. "scaled up: TTFT forecast", "held: stale data", "dry run, would scale down: ITL forecast".
    """
    d, fleet = result.decision, result.fleet
    moved = {p: (getattr(fleet, p).current_replicas, d.prefill_replicas if p == "prefill" else d.decode_replicas)
             for p in POOLS}
    codes = [r.code for r in d.reasons]
    holds = _holds(d.reasons)
    changed = [p for p, (a, b) in moved.items() if a != b]
    if changed:
        ups = [p for p in changed if moved[p][1] > moved[p][0]]
        verb = ("scaled up" if len(ups) == len(changed) else "scaled down" if not ups else "rebalanced")
        whys = []
        for pool in changed:
            pool_codes = [r.code for r in d.reasons if r.pool in (pool, None)]
            cause = next((why for code, why in _CAUSES.items() if code in pool_codes), _SIZED_ON[pool])
            if cause not in whys:
                whys.append(cause)
        text = f"{verb}: {', '.join(whys + holds)}"
    elif holds:
        text = "held: " + ", ".join(holds)
    else:
        limits = [why for code, why in _CAUSES.items() if code in codes]
        text = "unchanged: " + (", ".join(limits) if limits else "sizing matches what is set")
    start_note = getattr(result, "start_note", "")  # a plan's; tests hand a decision and fleet alone
    if start_note:
        # A first run says how it started: warm from the collected history (or the warm-up trace), or cold.
        text += f" ({start_note.split(':')[0]})"
    if not applying:
        mode = "what-if" if what_if else "advisory" if advisory else "dry run"
        return f"{mode}, would have {text}" if changed else f"{mode}, {text}"
    if changed and record is None:
        return text + " (not written)"
    return text


def _fmt(x: float | int | None, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, int):
        return str(x)
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}f}"


def _ttft_met(obs: Observation, slo: SloTarget, *, reachable: float | None = None) -> tuple[str, str]:
    """(value, detail) of the collect row: the share of the interval's requests with TTFT <= the target.

    reachable: the share of requests prefill sizing counts as able to meet the target at all (its
    single-request TTFT within it); said beside the share when below 1.
    """
    return _ttft_share(obs.ttft_histogram, obs.ttft_note, slo, reachable=reachable)


def _itl_met(obs: Observation, slo: SloTarget) -> tuple[str, str]:
    """(value, detail) of the collect row: the share of the interval's token gaps within the ITL target."""
    return _gap_share(obs.itl_histogram, obs.itl_note, slo)


def _slo_rows(result: PlanResult, slo: SloTarget) -> list[tuple[str, str, str]]:
    """(item, value, detail) of the collect rows on the targets: the interval's shares, then the SLO window's."""
    obs, prefill = result.observation, result.sizing.get("prefill")
    reachable = None if prefill is None else prefill.numbers.get("reachable_frac")
    return [
        ("TTFT target met", *_ttft_met(obs, slo, reachable=reachable)),
        ("ITL target met (token gaps)", *_itl_met(obs, slo)),
        *(() if obs.slo_window is None else _window_rows(obs.slo_window, slo, reachable=reachable)),
    ]


def _window_rows(w: LatencyWindow, slo: SloTarget, *, reachable: float | None = None) -> list[tuple[str, str, str]]:
    """(item, value, detail) of the trailing-window rows: the TTFT and ITL target shares over the SLO window.

    reachable: as for the interval's row (prefill sizing's share of requests able to meet the target).
    """
    span = f"last {w.window_s / 60:g} min"
    notes = {n.split(":")[0]: n for n in w.notes}
    return [
        (f"TTFT target met, {span}",
         *_ttft_share(w.ttft, notes.get("ttft_window_buckets"), slo, reachable=reachable, over="window")),
        (f"ITL target met (token gaps), {span}",
         *_gap_share(w.itl, notes.get("itl_window_buckets"), slo, over="window")),
    ]


def _ttft_share(h: LatencyHistogram | None, note: str | None, slo: SloTarget, *, reachable: float | None = None,
                over: str = "interval") -> tuple[str, str]:
    if h is None:
        return "not read", note or "no TTFT histogram"
    met = share_within(h, slo.ttft_ms / 1e3)
    if met is None:
        return "n/a", f"no request reached its first token in the {over}"
    can = (f"; prefill sizing counts {100 * reachable:.1f}% of requests able to meet it on any fleet"
           if reachable is not None and reachable < 1.0 else "")
    return (f"{100 * met.share:.1f}%",
            f"{met.requests:.0f} first tokens, TTFT <= {slo.ttft_ms:g} ms ({_where_read(met)}){can}")


def _gap_share(h: LatencyHistogram | None, note: str | None, slo: SloTarget, *,
               over: str = "interval") -> tuple[str, str]:
    if h is None:
        return "not read", note or "no ITL histogram"
    met = share_within(h, slo.itl_ms / 1e3)
    if met is None:
        return "n/a", f"no second token in the {over}"
    return (f"{100 * met.share:.1f}%",
            f"{met.requests:.0f} token gaps (one per output token after the first), each <= {slo.itl_ms:g} ms "
            f"({_where_read(met)}); the SLA holds each request's mean gap to the target")


def _where_read(met: TargetShare) -> str:
    lo, hi = met.bucket_s
    if hi == float("inf"):
        return f"below {lo:g} s, the last finite bucket bound: at least this share"
    return (f"read on a curve through the frontend's buckets; between {100 * met.at_least:.1f}% "
            f"within {lo:g} s and {100 * met.at_most:.1f}% within {hi:g} s, its {lo:g}-{hi:g} s bucket")


def _forecast_rows(fc) -> list[tuple[str, str, str]]:
    """(item, value, detail) of the predict step's rows: the forecast, the sizing basis, lengths and bursts."""
    if fc is None:
        return [("requests next interval (mean / p90)", "n/a", "no load data: sizing skipped, decision holds")]
    basis_notes = [n for n in fc.notes if n.startswith(("clumping:", "sized on the"))]
    other_notes = [n for n in fc.notes if n not in basis_notes]
    rows = [("requests next interval (mean / p90)", f"{_fmt(fc.num_requests, 1)} / {_fmt(fc.num_requests_p90, 1)}",
             fc.predictor + ("; " + "; ".join(other_notes) if other_notes else ""))]
    if basis_notes:
        rows.append(("arrival clumping (sizing basis)",
                     "n/a" if fc.clumping_index is None else f"{fc.clumping_index:.2f}", "; ".join(basis_notes)))
    rows.append(("ISL / OSL tokens next interval", f"{_fmt(fc.avg_isl_tokens, 0)} / {_fmt(fc.avg_osl_tokens, 0)}", ""))
    if fc.length_shape is not None:
        rows.append(("length CV (ISL / decode context)",
                     f"{fc.length_shape.isl_cv:.2f} / {fc.length_shape.decode_context_cv:.2f}",
                     "measured from the length histograms; sizing uses it unless sizing.length_cv is configured"))
    if fc.peak_ratio is not None:
        recent = ", ".join(f"{n:.0f} req peak {p:.2f}/s" for n, p in fc.recent_peaks)
        rows.append(("burst ratio next interval", f"{fc.peak_ratio:.2f}",
                     f"peak {fc.peak_window_s or 0:.0f} s rate over the mean rate" + (f"; from {recent}" if recent else "")))
    return rows


def decision_table(
    result: PlanResult, *, record: DecisionRecord | None, dry_run: bool, ttft_source: tuple[str, str] | None = None,
    slo: SloTarget | None = None, advisory: list[tuple[str, str, str]] | None = None,
) -> list[dict]:
    """One row per input, forecast, factor and pool, each with its value and detail.

    ttft_source: (what prefill's TTFT came from, why), when the run chose it (tasks.latency_model).
    slo: the run's targets: with them, the shares of the interval's requests (token gaps) within the TTFT (ITL) target.
    advisory: a recommend-only run's comparison rows (item, value, detail) with the running autoscaler
    (flows.advisory), in place of the apply step's.
    """
    obs, fc, corr, d = result.observation, result.forecast, result.corrections, result.decision
    rows: list[dict] = []

    def row(step: str, item: str, value: str, detail: str = "") -> None:
        rows.append({"step": step, "item": item, "value": value, "detail": wrap_cell(detail)})

    stale = "; ".join(obs.stale_reasons)
    row("collect", "requests in interval", _fmt(obs.num_requests, 1), f"interval {obs.interval_s:.0f} s")
    row("collect", "avg ISL / OSL tokens", f"{_fmt(obs.avg_isl_tokens, 0)} / {_fmt(obs.avg_osl_tokens, 0)}")
    row("collect", "avg TTFT / ITL ms", f"{_fmt(obs.avg_ttft_ms, 1)} / {_fmt(obs.avg_itl_ms, 2)}")
    row("collect", "history points", str(len(obs.history) if obs.history is not None else 0), stale or "fresh")
    row("collect", "pods reporting", str(len(obs.pods)))
    for item, value, detail in () if slo is None else _slo_rows(result, slo):
        row("collect", item, value, detail)
    for c in obs.coverage:
        row("collect", f"{c.source} reporting", f"{c.present} of {c.expected}" if c.expected else "not checked",
            c.detail)
    source = [n for n in obs.notes if n.startswith("metrics source ")]
    notes = [n for n in obs.notes if n not in source]
    for note in source:
        name, _, detail = note.removeprefix("metrics source ").partition(": ")
        row("collect", "metrics source", name, detail)
    if obs.peak_rps is not None or notes:
        peak = "n/a" if obs.peak_rps is None else f"{obs.peak_rps:.2f} req/s"
        window = f"busiest {obs.peak_window_s:.0f} s window" if obs.peak_window_s else "not measured"
        row("collect", "peak arrival rate", peak, "; ".join((window, *notes)))
    if obs.isl_histogram is not None or obs.length_notes:
        h = obs.isl_histogram
        counted = "not read" if h is None else f"{h.count:.0f} prompts in {h.window_s:.0f} s"
        row("collect", "length histograms", counted, "; ".join(obs.length_notes) or "frontend ISL / OSL buckets")
    if ttft_source is not None:
        row("correct", "prefill TTFT source", ttft_source[0], ttft_source[1])
    row("correct", "prefill / decode factor", f"{corr.prefill:.3f} / {corr.decode:.3f}",
        ("enabled" if corr.enabled else "disabled") + ("; " + "; ".join(corr.notes) if corr.notes else ""))
    for item, value, detail in _forecast_rows(fc):
        row("predict", item, value, detail)
    for pool in POOLS:
        sizing = result.sizing.get(pool)
        if sizing is not None:
            row("interpolate", f"{pool} replicas for SLA", str(sizing.replicas), sizing.message)
        if result.saturation is not None:
            sat = result.saturation[pool]
            row("saturation", f"{pool} guardrail", sat.signal, sat.message)
        state = getattr(result.fleet, pool)
        target = d.prefill_replicas if pool == "prefill" else d.decode_replicas
        row("decide", f"{pool} replicas", f"{state.current_replicas} → {target}",
            f"ready {state.ready_replicas}")
    for reason in d.reasons:
        numbers = ", ".join(f"{k}={_fmt(v)}" for k, v in reason.numbers.items())
        row("decide", f"reason {reason.code.value}", reason.pool or "both", reason.message + (f" [{numbers}]" if numbers else ""))
    if advisory is not None:
        for item, value, detail in advisory:
            row("advisory", item, value, detail)
    elif dry_run:
        row("apply", "result", "dry run", "nothing applied")
    elif record is None:
        row("apply", "result", "not written", "targets unchanged or held")
    else:
        row("apply", "result", f"decision {record.decision_id}",
            f"prefill {record.prefill_replicas}, decode {record.decode_replicas}")
    return rows


def decision_summary(
    result: PlanResult, *, record: DecisionRecord | None, dry_run: bool, what_if: str = "",
    ttft_source: tuple[str, str] | None = None, advisory: str | None = None,
) -> str:
    """A short markdown paragraph: what changed and why (ttft_source: as decision_table's; advisory: a
    recommend-only run's comparison with the running autoscaler, flows.advisory, as its outcome)."""
    d, fleet = result.decision, result.fleet
    head = (
        f"**prefill {fleet.prefill.current_replicas} → {d.prefill_replicas}, "
        f"decode {fleet.decode.current_replicas} → {d.decode_replicas}**"
    )
    if advisory is not None:
        outcome = "advisory: nothing applied"
    elif dry_run:
        outcome = "dry run: nothing applied" + (f" ({what_if})" if what_if else "")
    elif record is None:
        outcome = "nothing written"
    else:
        outcome = f"applied as decision {record.decision_id}"
    lines = [f"### Planner decision\n\n{head} — {outcome}.\n"] + ([advisory, ""] if advisory else [])
    fc = result.forecast
    if fc is None:
        lines.append("No load data to forecast from: the decision holds.")
    else:
        lines.append(
            f"Forecast ({fc.predictor}): {_fmt(fc.num_requests, 1)} requests next interval "
            f"(p90 {_fmt(fc.num_requests_p90, 1)}), ISL {_fmt(fc.avg_isl_tokens, 0)}, OSL {_fmt(fc.avg_osl_tokens, 0)}."
        )
    if ttft_source is not None:
        lines.append(f"Prefill TTFT from {ttft_source[0]} ({ttft_source[1]}).")
    if result.start_note:
        lines.append(result.start_note[0].upper() + result.start_note[1:] + ".")
    lines.append("")
    for reason in d.reasons:
        lines.append(f"- `{reason.code.value}`{' (' + reason.pool + ')' if reason.pool else ''}: {reason.message}")
    if result.observation.stale_reasons:
        lines.append("")
        lines.append("Metrics problems: " + "; ".join(result.observation.stale_reasons))
    return "\n".join(lines)

"""Value types passed between the planner's steps.

Every step of a planner run (collect, correct, predict, interpolate, analyze
saturation, decide, apply) takes and returns these plain, immutable values, so
the Prefect tasks, the simulator and the benchmarks all share one vocabulary.
Nothing here does I/O.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Literal

Pool = Literal["prefill", "decode"]
POOLS: tuple[Pool, ...] = ("prefill", "decode")


def is_number(x: float | None) -> bool:
    """True for a finite float (not None, NaN or inf)."""
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class LoadHistory:
    """Per-interval load series, oldest first, as the collect step rebuilds it.

    t_s: interval end times, seconds (Unix or simulated clock).
    num_requests: requests that arrived in each interval (count, not rate).
    avg_isl_tokens / avg_osl_tokens: mean input / output length per interval;
        NaN where the interval had no requests.
    interval_s: the bin width, seconds.
    peak_rps: optional, per interval: the highest arrival rate over any
        `peak_window_s` sub-window of it, requests/s (see Observation.peak_rps);
        NaN where unknown. None: the signal is not collected at all.
    peak_window_s: the sub-window those peaks were measured over, seconds.
    """

    t_s: tuple[float, ...]
    num_requests: tuple[float, ...]
    avg_isl_tokens: tuple[float, ...]
    avg_osl_tokens: tuple[float, ...]
    interval_s: float
    peak_rps: tuple[float, ...] | None = None
    peak_window_s: float | None = None

    def __post_init__(self) -> None:
        n = len(self.t_s)
        names = ("num_requests", "avg_isl_tokens", "avg_osl_tokens")
        if self.peak_rps is not None:
            names += ("peak_rps",)
            if not (self.peak_window_s is not None and self.peak_window_s > 0):
                raise ValueError(f"LoadHistory: peak_rps needs peak_window_s > 0, got {self.peak_window_s!r}")
        for name in names:
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"LoadHistory: {name} has {len(getattr(self, name))} points, t_s has {n}"
                )
        if not self.interval_s > 0:
            raise ValueError(f"LoadHistory: interval_s must be > 0, got {self.interval_s}")

    def __len__(self) -> int:
        return len(self.t_s)

    def upto(self, n: int) -> "LoadHistory":
        """The oldest n intervals: the history as it stood n intervals in."""
        return LoadHistory(
            t_s=self.t_s[:n], num_requests=self.num_requests[:n], avg_isl_tokens=self.avg_isl_tokens[:n],
            avg_osl_tokens=self.avg_osl_tokens[:n], interval_s=self.interval_s,
            peak_rps=None if self.peak_rps is None else self.peak_rps[:n], peak_window_s=self.peak_window_s,
        )


@dataclass(frozen=True)
class PodMetrics:
    """One serving replica's saturation signals (vLLM metrics)."""

    pod: str
    pool: Pool
    kv_usage_frac: float | None  # 0..1, max over the last minute
    queue_length: float | None  # requests waiting
    variant: str = "default"  # model variant (accelerator/config) for cost-aware choice


@dataclass(frozen=True)
class ScrapeCoverage:
    """How many of the metric sources behind a signal reported, for one kind of source.

    source: what was counted, e.g. "frontend targets" or "decode workers".
    expected: how many should report: scrape targets Prometheus knows or knew
        within its lookback; ready replicas the fleet reports. 0: not checked
        (`detail` says why).
    present: how many reported.
    detail: which are missing and why (instances down, targets gone), for the run's reason.

    Frontend metrics are sums over frontends: with one of two missing, the
    load looks halved. The decide step never scales down on such data.
    """

    source: str
    expected: int
    present: int
    detail: str = ""

    @property
    def missing(self) -> int:
        return max(0, self.expected - self.present)

    @property
    def missing_frac(self) -> float:
        """Missing share of the expected sources, 0..1 (0 when none are expected)."""
        return self.missing / self.expected if self.expected > 0 else 0.0


def _check_buckets(what: str, b: tuple[float, ...], c: tuple[float, ...]) -> None:
    """Raise ValueError naming `what` unless b are finite bounds rising from >= 0 and c has one count more."""
    if len(c) != len(b) + 1 or not b:
        raise ValueError(f"{what}: need one count per bound and the total, got {len(c)} counts for {len(b)} bounds")
    if not all(math.isfinite(x) for x in b) or b[0] < 0 or any(not hi > lo for lo, hi in zip(b, b[1:])):
        raise ValueError(f"{what}: finite bounds must rise from >= 0, got {list(b)}")


@dataclass(frozen=True)
class LengthHistogram:
    """A request-length histogram's increase over a trailing window, as cumulative buckets.

    upper_bounds_tokens: the finite `le` bounds, ascending from >= 0 (the +Inf
        bucket is implied, so the value survives JSON).
    cumulative_counts: observations <= each bound, then the total (+Inf):
        one more than the bounds.
    sum_tokens: the increase of the histogram's _sum; None: not read.
    window_s: the window, seconds.
    """

    upper_bounds_tokens: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum_tokens: float | None
    window_s: float

    def __post_init__(self) -> None:
        _check_buckets("length histogram", self.upper_bounds_tokens, self.cumulative_counts)

    @property
    def count(self) -> float:
        return float(self.cumulative_counts[-1])


@dataclass(frozen=True)
class LatencyHistogram:
    """A latency histogram's increase over one interval, as cumulative buckets.

    upper_bounds_s: the finite `le` bounds, seconds, ascending from >= 0 (+Inf implied).
    cumulative_counts: observations <= each bound, then the total (+Inf).
    """

    upper_bounds_s: tuple[float, ...]
    cumulative_counts: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_buckets("latency histogram", self.upper_bounds_s, self.cumulative_counts)

    @property
    def count(self) -> float:
        return float(self.cumulative_counts[-1])


@dataclass(frozen=True)
class LatencyWindow:
    """The frontend's TTFT and ITL histograms over a trailing window: the SLO's view beside the interval's.

    window_s: the window, seconds. ttft / itl: the histograms, None where not
    read (`notes` says why).
    """

    window_s: float
    ttft: LatencyHistogram | None
    itl: LatencyHistogram | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LengthShape:
    """How spread request lengths were over a trailing window (planner.signals.length_shape).

    isl_cv: coefficient of variation of prompt lengths. decode_context_cv: of the
    KV context a decoding request holds (ISL + OSL / 2). requests: prompts the
    window counted. window_s: the window, seconds.
    """

    isl_cv: float
    decode_context_cv: float
    requests: float
    window_s: float


@dataclass(frozen=True)
class Observation:
    """What the collect step saw for one adjustment interval.

    Averages are over the last interval; None means "no data". `stale` lists
    why the data can't be trusted (e.g. "prometheus: newest sample 340 s old").

    peak_rps: the highest arrival rate over any `peak_window_s` sub-window of the
    interval, requests/s (e.g. max over the interval of a 15 s rate). Bursts
    shorter than the interval hide in its mean rate; the ratio of the two is
    the interval's burst ratio (planner.signals.burst). None: not measured, and the
    planner behaves as without it. `notes` says why a signal that does not
    make the observation stale was missing. `coverage`: per kind of metric
    source (frontend scrape targets, each pool's workers), how many reported of
    how many should have; empty when not measured. isl_histogram /
    osl_histogram: the frontend's prompt / output length histograms over a
    trailing window (planner.signals.length_shape); None: not read, and `length_notes`
    says why. ttft_histogram: the frontend's TTFT histogram over the interval
    (planner.signals.slo_attainment: the share that met the TTFT target); None: not
    read, and `ttft_note` says why. itl_histogram / itl_note: the same for its
    inter-token latency histogram (one observation per token gap). slo_window:
    both histograms over a trailing window; None: not read.
    """

    taken_at_s: float
    interval_s: float
    num_requests: float | None
    avg_isl_tokens: float | None
    avg_osl_tokens: float | None
    avg_ttft_ms: float | None
    avg_itl_ms: float | None
    history: LoadHistory | None = None
    pods: tuple[PodMetrics, ...] = ()
    stale_reasons: tuple[str, ...] = ()
    peak_rps: float | None = None
    peak_window_s: float | None = None
    notes: tuple[str, ...] = ()
    coverage: tuple[ScrapeCoverage, ...] = ()
    isl_histogram: LengthHistogram | None = None
    osl_histogram: LengthHistogram | None = None
    length_notes: tuple[str, ...] = ()
    ttft_histogram: LatencyHistogram | None = None
    ttft_note: str | None = None
    itl_histogram: LatencyHistogram | None = None
    itl_note: str | None = None
    slo_window: LatencyWindow | None = None

    @property
    def is_stale(self) -> bool:
        return bool(self.stale_reasons)


@dataclass(frozen=True)
class PoolState:
    """Current state of one pool, as read from the connector."""

    current_replicas: int
    ready_replicas: int
    gpus_per_replica: int = 1


@dataclass(frozen=True)
class DecisionRecord:
    """A decision previously applied, as read back from the connector."""

    decision_id: int
    decided_at_s: float
    prefill_replicas: int
    decode_replicas: int
    done: bool  # the deployment environment reports the targets reached


@dataclass(frozen=True)
class FleetState:
    """Everything about the fleet a run needs, read fresh each run.

    recent_targets: (t_s, prefill, decode) recommendations of recent runs
    (Decision.recommended_*, recorded by every run that acts, whether or not it
    changed the targets), oldest first; used for the scale-down stabilization
    window.
    applied_targets: (t_s, prefill, decode) of the recorded applied decisions,
    oldest first; shown (the run's chart), and with correction.replicas "served"
    the replicas that served the last interval are rebuilt from them
    (planner.latency.served).
    ready_history: (t_s, prefill_ready, decode_ready) samples, oldest first, when
    the connector has them; with applied_targets they measure each pool's
    startup time (planner.signals.startup_time). Empty: not known.
    """

    prefill: PoolState
    decode: PoolState
    last_decision: DecisionRecord | None = None
    recent_targets: tuple[tuple[float, int, int], ...] = ()
    applied_targets: tuple[tuple[float, int, int], ...] = ()
    ready_history: tuple[tuple[float, int, int], ...] = ()


@dataclass(frozen=True)
class Corrections:
    """Observed / expected latency ratios, bounded (see planner.latency.correct)."""

    prefill: float = 1.0
    decode: float = 1.0
    enabled: bool = True
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Forecast:
    """Next-interval load forecast: mean and upper (p90) for each quantity."""

    num_requests: float
    avg_isl_tokens: float
    avg_osl_tokens: float
    num_requests_p90: float
    predictor: str
    notes: tuple[str, ...] = ()
    # Sub-interval burstiness expected next interval (planner.signals.burst): the peak
    # `peak_window_s` arrival rate over the interval's mean rate, >= 1. None: unknown,
    # sizing treats arrivals as Poisson within the interval.
    peak_ratio: float | None = None
    peak_window_s: float | None = None
    # (requests, peak rps) of the recent intervals that ratio came from, oldest first.
    recent_peaks: tuple[tuple[float, float], ...] = ()
    # How clumped recent arrivals were (planner.signals.clumping): about 1-2 for independent
    # arrivals. None: not measured (predictor.size_on is not auto, or too little history).
    clumping_index: float | None = None
    # Length spread measured from the collect step's length histograms (planner.signals.length_shape),
    # which sizing uses instead of the configured CVs (SizingConfig.length_cv). None: not measured.
    length_shape: LengthShape | None = None
    # The forecast sizing takes (the predict step decides it once, from predictor.size_on and, for auto,
    # the clumping index): the mean, or the p90 (also when the basis is not known yet).
    sized_on: Literal["mean", "p90"] = "p90"
    # Prompt tokens next interval, mean and upper quantile (predictor.forecast_prompt_tokens); None: not
    # forecast, prefill is sized on num_requests x avg_isl_tokens.
    prompt_tokens: float | None = None
    prompt_tokens_p90: float | None = None


class ReasonCode(str, enum.Enum):
    """Machine-readable reasons a decision carries."""

    SLA_SIZING = "sla_sizing"
    SATURATION_SCALE_UP = "saturation_scale_up"
    SATURATION_VETO_SCALE_DOWN = "saturation_veto_scale_down"
    TRANSITION_IN_PROGRESS = "transition_in_progress"
    CLAMPED_MIN = "clamped_min"
    CLAMPED_MAX = "clamped_max"
    GPU_BUDGET = "gpu_budget"
    FLEET_BUDGET = "fleet_budget"  # the fleet's shared GPU budget (planner.fleet.arbitrate)
    MAX_STEP = "max_step"
    STABILIZATION_WINDOW = "stabilization_window"
    SCALE_DOWN_FLOOR = "scale_down_floor"
    WARMUP_NO_SCALE_DOWN = "warmup_no_scale_down"
    WARMUP_START_FLOOR = "warmup_start_floor"
    HOLD_MISSING_METRICS = "hold_missing_metrics"
    HOLD_STALE_METRICS = "hold_stale_metrics"
    HOLD_PARTIAL_METRICS = "hold_partial_metrics"
    HOLD_PREVIOUS_NOT_DONE = "hold_previous_not_done"
    PREVIOUS_DECISION_TIMED_OUT = "previous_decision_timed_out"
    SCALE_UP_PAST_PENDING = "scale_up_past_pending"
    FAST_PATH_SCALE_UP = "fast_path_scale_up"
    FAST_PATH_COOLDOWN = "fast_path_cooldown"
    FAST_PATH_NOTHING_TO_ADD = "fast_path_nothing_to_add"
    SCALE_TO_ZERO = "scale_to_zero"  # planner.decision.scale_to_zero
    KEPT_ABOVE_ZERO = "kept_above_zero"
    WAKE_FROM_ZERO = "wake_from_zero"  # planner.saturation.wake
    UNCHANGED = "unchanged"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    PROFILE_CLAMPED = "profile_clamped"
    PREDICTOR_FALLBACK = "predictor_fallback"


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    pool: Pool | None
    message: str
    numbers: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "code": self.code.value,
            "pool": self.pool,
            "message": self.message,
            "numbers": dict(self.numbers),
        }


@dataclass(frozen=True)
class SizingLoad:
    """The load one pool is sized for, as each sizing mode reads it.

    rps: requests/s sized for (the mean or upper forecast at the horizon);
    basis: which of the two, for messages. isl_tokens / osl_tokens: mean
    lengths, tokens. correction: the pool's latency correction factor (1: none).
    gpus_per_engine: GPUs one replica uses. interval_s: the forecast's interval, s.
    length_cv_source: where the length CVs sizing uses came from, for messages
        ("measured": the frontend's histograms, planner.signals.length_shape; "configured").
    """

    rps: float
    basis: str
    isl_tokens: float
    osl_tokens: float
    correction: float
    gpus_per_engine: int
    interval_s: float
    length_cv_source: str = "configured"


@dataclass(frozen=True)
class PoolSizing:
    """Replicas one pool needs for the SLA at the forecast load, with its numbers."""

    pool: Pool
    replicas: int
    numbers: dict[str, float] = field(default_factory=dict)
    message: str = ""


# Per-pool replica targets, and one decision rule's output: new targets and why.
Targets = dict[Pool, int]
Step = tuple[Targets, list[Reason]]


@dataclass(frozen=True)
class StartFloor:
    """What the warm-up trace's last intervals needed: the fleet a planner started on it keeps until its own
    recommendations fill the stabilization window (planner.steps.size_warmup_floor).

    targets: the most replicas any of those intervals was sized for, per pool (with a scale-down floor, at
        least its share of the most over the floor's window).
    intervals: how many warm-up intervals counted (the longest window's, less those the planner has collected).
    window_s: the longest window they stand in for, s.
    floor_frac: the scale-down floor's share (planner.decision.stabilization.floor_share) when its window counted;
        None: not. floor_why: why that share (floor_share's words); "": not said.
    source: what stood in for the planner's runs: the warm-up trace, or the collected (Prometheus) history.
    """

    targets: Targets
    intervals: int
    window_s: float
    floor_frac: float | None = None
    source: str = "the warm-up trace"
    floor_why: str = ""


@dataclass(frozen=True)
class Decision:
    """Targets for both pools and why. `apply` is False when nothing should be written.

    recommended_*_replicas: the run's recommendation before the scale-down
    stabilization window, step limit and GPU budget; store it with the decision
    so later runs can rebuild `FleetState.recent_targets` from it. None when the
    run held without recommending.
    """

    prefill_replicas: int
    decode_replicas: int
    apply: bool
    reasons: tuple[Reason, ...]
    recommended_prefill_replicas: int | None = None
    recommended_decode_replicas: int | None = None
    # (prefill, decode) replicas in effect when the run decided; a connector refuses to write
    # the decision over different ones (another writer changed them: the decision is stale).
    based_on: tuple[int, int] | None = None

    def codes(self) -> list[str]:
        return [r.code.value for r in self.reasons]

    def as_dict(self) -> dict:
        return {
            "prefill_replicas": self.prefill_replicas,
            "decode_replicas": self.decode_replicas,
            "apply": self.apply,
            "reasons": [r.as_dict() for r in self.reasons],
            "recommended_prefill_replicas": self.recommended_prefill_replicas,
            "recommended_decode_replicas": self.recommended_decode_replicas,
            "based_on": None if self.based_on is None else list(self.based_on),
        }

"""Typed planner configuration: one pydantic model per kind of YAML file.

Every model forbids unknown fields, so a misspelt key is an error that names
it. Units are in field names. The flows take `PlannerConfig` as a parameter,
so the Prefect UI renders it as a form. Parsing YAML text is here; reading the
file is the caller's job.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.predictors.registry import make_predictor, predictor_names
from planner.strict import StrictModel, error_message


class SloTarget(StrictModel):
    ttft_ms: float = Field(200.0, gt=0, description="target time to first token, ms")
    itl_ms: float = Field(10.0, gt=0, description="target inter-token latency, ms")


class ProfileConfig(StrictModel):
    """Where the pre-deployment profiling data lives.

    Either `dir` (profiler layout: selected_prefill_interpolation/raw_data.npz and
    selected_decode_interpolation/raw_data.npz) or `pre_swept_dir` (a folder with
    prefill.npz and decode.npz, one row per parallel config) with `tp` and
    optionally `gpu_type` to pick the row.
    """

    dir: str | None = Field(None, description="profiler output folder")
    pre_swept_dir: str | None = Field(None, description="pre-swept folder with prefill.npz/decode.npz")
    prefill_tp: int | None = Field(None, ge=1, description="pre-swept row: prefill tensor parallel size")
    decode_tp: int | None = Field(None, ge=1, description="pre-swept row: decode tensor parallel size")
    gpu_type: str | None = Field(None, description="pre-swept row: GPU type, e.g. h200_sxm")
    out_of_range: Literal["clip", "raise"] = Field(
        "clip", description="inputs outside the profiled range: clamp (with a warning) or raise"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "ProfileConfig":
        if (self.dir is None) == (self.pre_swept_dir is None):
            raise ValueError("profile: set exactly one of `dir` or `pre_swept_dir`")
        return self


class PredictorConfig(StrictModel):
    """Load predictor choice and its settings (see docs/predictors.md)."""

    name: str = Field(
        "auto",
        description="load predictor: constant, arima, kalman, prophet, seasonal_naive, ets, auto",
    )
    size_on: Literal["mean", "p90", "auto"] = Field(
        "auto",
        description="size replicas on the mean forecast, its upper (p90) quantile, or (auto) on the mean while "
        "arrivals look independent and on the p90 while they clump (planner.signals.clumping)",
    )
    clumping_lookback_intervals: int = Field(
        10, ge=1, le=1440, description="size_on auto: intervals of peak-rate history the clumping index is read "
        "over",
    )
    clumping_quantile: float = Field(
        0.4, gt=0, lt=1, description="size_on auto: the clumping index is this quantile of the intervals' "
        "readings (0.4: clumping in most of them, as synchronised copies do; a run of sub-minute bursts, as "
        "independent tenants make, does not count)",
    )
    clumping_min_intervals: int = Field(
        4, ge=1, le=1440, description="size_on auto: intervals with requests and a peak rate the index needs; "
        "fewer: the p90",
    )
    clumping_max_index: float = Field(
        1.7, gt=0, le=1e6, description="size_on auto: below this clumping index the mean is sized on (about 1.2 "
        "for independent arrivals, 2-3 for pairs of synchronised copies, 3-7 for eight at 40 rps)",
    )
    clumping_runs: int = Field(2, ge=1, le=100, description="size_on auto: the p90 only once the index reads at or "
        "above clumping_max_index on this many runs in a row (each read from the history as it stood then; 2: one "
        "clumpy reading among independent tenants' does not switch the basis); 1: this run's alone")
    upper_quantile: float = Field(
        0.9, gt=0.5, lt=1.0, description="quantile of next-interval requests reported as the upper forecast (p90)"
    )
    min_history_points: int = Field(5, ge=1, description="points a model needs before it forecasts; constant until then")
    log1p: bool = Field(False, description="ARIMA: fit on log1p(load)")
    history_intervals: int = Field(288, ge=1, le=20_000, description="intervals of history the collect step reads back")
    burst_lookback_intervals: int = Field(
        1, ge=0, le=1440,
        description="intervals of peak-rate history (Observation.peak_rps) the burst forecast comes from "
        "(planner.signals.burst; sizing.burst_basis says how it is used); 1: the last interval; 0: no burst forecast",
    )
    length_shape_min_requests: int = Field(
        200, ge=1,
        description="prompts the collect step's length histograms must count (over metrics.length_window_s) "
        "before sizing uses the spread they measure (sizing.length_cv: measured); fewer: the configured CVs",
    )
    length_predictor: str | None = Field(None, description="predictor for mean ISL/OSL; None: the same as `name`")
    forecast_prompt_tokens: bool = Field(
        False,
        description="also forecast the prompt-token series (requests x mean ISL per interval; Prometheus: the "
        "frontend's input-sequence-token counters) with `name`, mean and upper quantile, and size prefill on it "
        "(its requests: the forecast tokens over the forecast mean ISL), so a minute of few but long prompts "
        "is sized for its prefill work and the upper band holds the prompt lengths' swings too; False: prefill "
        "sized on the request-count forecast x the mean ISL forecast (docs/control.md)",
    )
    params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per-predictor hyperparameters keyed by predictor name, e.g. {kalman: {min_points: 8}}; "
        "auto's candidate_params maps its candidates to theirs, e.g. {auto: {candidate_params: {ets: {season_s: 86400}}}}; "
        "each value is checked when the configuration is loaded",
    )
    cache_dir: str | None = Field(
        None,
        description="private directory where fitted predictor state is kept between runs (speed only: "
        "a lost cache means a slower, not a different, forecast); None: fit from scratch every run",
    )
    warmup_trace_path: str | None = Field(
        None,
        description="request trace (Mooncake JSONL or Azure CSV, plain or gzip) binned at the adjustment interval "
        "and put before the collected history while that holds fewer than history_intervals intervals, so a new "
        "deployment forecasts from its first run (Dynamo's load_predictor_warmup_trace), and keeps what its last "
        "stabilization window needed until the planner's own fill it (planner.steps.size_warmup_floor); relative to the "
        "config file; None: no warm-up",
    )

    @model_validator(mode="after")
    def _known_names(self) -> "PredictorConfig":
        names = predictor_names()
        for field_name in ("name", "length_predictor"):
            value = getattr(self, field_name)
            if value is not None and value not in names:
                raise ValueError(f"predictor.{field_name}: unknown predictor {value!r}; valid: {', '.join(names)}")
        for key, params in self.params.items():
            try:
                make_predictor(key, **params).check_params()
            except ValueError as exc:
                raise ValueError(f"predictor.params.{key}: {exc}") from None
        if self.clumping_min_intervals > self.clumping_lookback_intervals:
            raise ValueError(
                f"predictor.clumping_min_intervals ({self.clumping_min_intervals}) must not exceed "
                f"predictor.clumping_lookback_intervals ({self.clumping_lookback_intervals})"
            )
        return self


class CorrectionConfig(StrictModel):
    enabled: bool = Field(True, description="apply observed/expected latency correction factors")
    min_factor: float = Field(0.5, gt=0, description="lower bound on a correction factor")
    max_factor: float = Field(3.0, gt=0, description="upper bound on a correction factor")
    min_requests: float = Field(
        10.0, ge=0, description="fewer requests than this in the interval: factor = 1 (cold start)"
    )
    burst_aware: bool = Field(
        True,
        description="with a peak-rate signal, expect the queueing of the interval's burst (planner.signals.burst) "
        "so it is not read as slow engines; False or no signal: the flat-rate queue model",
    )
    replicas: Literal["served", "current"] = Field(
        "current",
        description="the replicas the interval's load is divided by: served, the time-weighted ready replicas over "
        "the interval rebuilt from the applied decisions and sizing.replica_startup_s (planner.latency.served); "
        "current, the replicas the fleet has when the run reads it (a scale-up's replicas count for the interval "
        "they were still starting in; the default until a default that holds every scenario comes with served: "
        "served alone loses 1.6 points on azure2023_code x8 from a running start, docs/control.md)",
    )
    prefill_expected: Literal["mean_prompt", "mean_prompt_extrapolated", "length_mix"] = Field(
        "mean_prompt",
        description="the prefill TTFT the prefill factor holds the observed one against: mean_prompt, the "
        "single-request TTFT of the mean prompt, clamped to the profiled lengths (the factor then also carries the "
        "length mix and any prompt longer than the profile, which sizing charges again); mean_prompt_extrapolated, the mean prompt's, lengths past the profile "
        "extrapolated as sizing does; length_mix, the mean over "
        "the prompt-length mix sizing uses (sizing.isl_cv or the measured CV, lengths past the profile extrapolated "
        "as sizing does), so the factor holds only what sizing does not already count (docs/control.md)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "CorrectionConfig":
        if self.min_factor > 1.0 or self.max_factor < 1.0:
            raise ValueError(
                f"correction: need min_factor <= 1 <= max_factor, got {self.min_factor}..{self.max_factor}"
            )
        return self


class SizingConfig(StrictModel):
    """How forecast load becomes replicas (see docs/sizing.md and docs/control.md)."""

    mode: Literal["sla", "dynamo-1.0.2"] = Field(
        "sla",
        description="sla: each pool sized so a share of requests meets its latency target (queueing-aware "
        "prefill, ITL-quantile decode); dynamo-1.0.2: Dynamo 1.0.2's throughput formulas (100% of profiled "
        "throughput), not Dynamo 1.6.1's capacity search (docs/sizing.md); dynamo: a deprecated alias of dynamo-1.0.2",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _dynamo_alias(cls, value):
        # Deprecated: "dynamo" named Dynamo 1.0.2's formulas, which Dynamo 1.6.1 no longer uses.
        return "dynamo-1.0.2" if value == "dynamo" else value
    gpus_per_prefill_engine: int | None = Field(
        None, ge=1, description="GPUs one prefill replica uses; None: what the profile says (meta.json), else 1"
    )
    gpus_per_decode_engine: int | None = Field(
        None, ge=1, description="GPUs one decode replica uses; None: what the profile says (meta.json), else 1"
    )
    ttft_quantile: float = Field(
        0.99, gt=0, lt=1,
        description="share of the requests that can meet slo.ttft_ms (their own prefill fits in it) that must "
        "meet it (sla mode); 0.99: at most 1% of them miss",
    )
    itl_quantile: float = Field(
        0.99, gt=0.5, lt=1, description="per-request ITL quantile kept within slo.itl_ms (sla mode; 0.99 = p99)"
    )
    length_cv: Literal["measured", "configured"] = Field(
        "measured",
        description="measured: the prompt-length and context CVs come from the frontend's length histograms "
        "over the collect step's window (planner.signals.length_shape), isl_cv / decode_context_cv only while too few "
        "requests were counted or the histograms are not read; configured: always isl_cv / decode_context_cv",
    )
    isl_cv: float = Field(
        1.0, ge=0, le=10,
        description="coefficient of variation of prompt lengths around the forecast mean (Gamma-distributed); "
        "0: every prompt at the mean. Measured: 0.96 Azure 2023, 1.2 Mooncake, 3.15 ServeGen m-mid "
        "(length_cv: measured replaces it with the fleet's own)",
    )
    decode_context_cv: float = Field(
        1.0, ge=0, le=10,
        description="coefficient of variation of the KV context a decoding request holds (isl + osl/2). "
        "Measured: 0.87-0.96 Azure 2023, 1.2 Mooncake, 2.96 ServeGen m-mid (length_cv: measured replaces it)",
    )
    prefill_arrival_cv: float = Field(
        1.0, ge=0, le=10,
        description="coefficient of variation of request inter-arrival times (1 = Poisson); also sets the "
        "decode pool's peakedness (1 + cv^2)/2",
    )
    prefill_service_cv: float = Field(
        1.0, ge=0, le=10,
        description="coefficient of variation of prefill service times (0 = deterministic, M/D/c) in the "
        "Allen-Cunneen wait; on the H200 Llama-8B profile 0.45-0.64 for Azure 2023, 1.1 for ServeGen",
    )
    prefill_max_utilization_frac: float = Field(
        0.9, gt=0, le=1, description="cap on prefill utilisation (sla mode), whatever the queueing model says"
    )
    decode_headroom_frac: float = Field(
        0.0, ge=0, lt=1,
        description="decode throughput kept free on top of the ITL-quantile sizing (sla mode); 0: the quantile "
        "sizing alone",
    )
    decode_max_kv_usage_frac: float = Field(
        0.8, gt=0, le=1, description="highest average KV-cache usage a decode replica is sized for (sla mode)"
    )
    replica_startup_s: float = Field(
        60.0, ge=0, le=86_400,
        description="time from adding a replica to it serving, s; the upper forecast is widened to cover the "
        "intervals until then",
    )
    unreachable_slack_frac: float = Field(
        0.25, ge=0, le=10,
        description="target below the best achievable latency: size for that latency x (1 + this) instead",
    )
    burst_basis: Literal["history", "mean", "upper", "off"] = Field(
        "history",
        description="prefill sized also for sub-interval bursts (planner.signals.burst), never below the flat sizing at "
        "the upper forecast: history = the recent intervals' peak and off-peak traffic as they came; mean / "
        "upper = the forecast burst ratio applied to the mean / upper forecast; off: arrivals flat within an "
        "interval",
    )
    independent_burst_basis: Literal["history", "mean", "upper", "off"] | None = Field("off", description="burst_basis "
        "while sized on the mean (size_on auto: arrivals look independent; off: flat, the scale-down floor holding "
        "recurring bursts); None: burst_basis always")


class SaturationThresholds(StrictModel):
    """llm-d WVA saturation analyzer settings; every field defaults to WVA's recommended value.

    Field names also accept WVA's ConfigMap spelling (kvCacheThreshold, ...), so a
    WVA entry can be pasted as is. A field left out takes the recommended value,
    never zero (WVA falls back to zeros, which marks every replica saturated).
    """

    model_config = ConfigDict(populate_by_name=True)

    kv_cache_threshold: float = Field(
        0.80,
        gt=0,
        le=1,
        validation_alias=AliasChoices("kv_cache_threshold", "kvCacheThreshold"),
        description="KV-cache usage (fraction 0-1) at or above which a replica is saturated",
    )
    queue_length_threshold: float = Field(
        5.0,
        gt=0,
        validation_alias=AliasChoices("queue_length_threshold", "queueLengthThreshold"),
        description="waiting requests at or above which a replica is saturated",
    )
    kv_spare_trigger: float = Field(
        0.1,
        ge=0,
        lt=1,
        validation_alias=AliasChoices("kv_spare_trigger", "kvSpareTrigger"),
        description="scale up when the average spare KV (threshold - usage, fraction) is below this",
    )
    queue_spare_trigger: float = Field(
        3.0,
        ge=0,
        validation_alias=AliasChoices("queue_spare_trigger", "queueSpareTrigger"),
        description="scale up when the average spare queue (threshold - waiting requests) is below this",
    )

    @model_validator(mode="after")
    def _triggers_below_thresholds(self) -> "SaturationThresholds":
        # spare = threshold - usage <= threshold, so a trigger at or above its
        # threshold would call for a scale-up on every run.
        for trigger, threshold in (
            ("kv_spare_trigger", "kv_cache_threshold"),
            ("queue_spare_trigger", "queue_length_threshold"),
        ):
            if getattr(self, trigger) >= getattr(self, threshold):
                raise ValueError(
                    f"{trigger} ({getattr(self, trigger)}) must be < {threshold} "
                    f"({getattr(self, threshold)}), or every run scales up"
                )
        return self


class SaturationConfig(StrictModel):
    """Saturation guardrail settings: a `default` entry plus per-model overrides.

    An override is looked up by the key 'modelID#namespace' and replaces the
    default wholly (no field-by-field merge, as in WVA); fields it leaves out take
    the recommended values, not the default entry's.
    """

    enabled: bool = Field(True, description="use the saturation guardrail")
    default: SaturationThresholds = Field(
        default_factory=SaturationThresholds, description="thresholds for models without an override"
    )
    overrides: dict[str, SaturationThresholds] = Field(
        default_factory=dict,
        description="per-model thresholds keyed 'modelID#namespace'; an override replaces the default wholly",
    )

    @field_validator("overrides", mode="before")
    @classmethod
    def _keys(cls, value: object) -> object:
        if isinstance(value, dict):
            for key in value:
                parts = str(key).split("#")
                if len(parts) != 2 or not parts[0] or not parts[1]:
                    raise ValueError(
                        f"override key {key!r} must be 'modelID#namespace' (one '#', both parts non-empty)"
                    )
        return value

    def for_model(self, model_id: str, namespace: str) -> SaturationThresholds:
        """Thresholds for one model: its override if present, else the default."""
        return self.overrides.get(f"{model_id}#{namespace}", self.default)


class PoolBounds(StrictModel):
    min_replicas: int = Field(1, ge=0, description="fewest replicas")
    max_replicas: int = Field(16, ge=1, description="most replicas")

    @model_validator(mode="after")
    def _order(self) -> "PoolBounds":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self


class ScaleToZeroConfig(StrictModel):
    """When a pool with min_replicas 0 may idle to zero, and what wakes it (docs/scale-to-zero.md)."""

    quiet_s: float = Field(
        600.0, ge=0, le=86_400,
        description="no pool goes to zero before this long without a request, s (whole intervals of the history)",
    )
    late_request_cost_gpu_h: float = Field(
        0.1, ge=0,
        description="GPU-hours one request that misses its TTFT target behind a cold start is worth: a pool goes to "
        "zero only when the upper forecast's late requests times this is below the GPU-hours saved until the "
        "next decision",
    )
    wake_min_requests: float = Field(
        1.0, gt=0,
        description="at zero, wake (a scale-up at once) when the frontend counted at least this many requests "
        "(started, or answered with an error for want of workers) or queued at least this many",
    )
    wake_replicas: int = Field(1, ge=1, description="replicas each pool at zero wakes to")


class DecisionConfig(StrictModel):
    """How SLA sizing and the saturation guardrail become replica targets."""

    prefill: PoolBounds = Field(default_factory=PoolBounds, description="prefill pool replica bounds")
    decode: PoolBounds = Field(default_factory=PoolBounds, description="decode pool replica bounds")
    max_gpu_budget: int | None = Field(None, ge=1, description="total GPUs both pools may use; None: unlimited")
    max_step_replicas: int | None = Field(
        None, ge=1, description="largest change per pool per interval, up or down; None: unlimited"
    )
    scale_down_stabilization_s: float = Field(
        300.0, ge=0, description="scale down only to the highest target recommended over this window, s"
    )
    independent_stabilization_s: float | None = Field(
        None, gt=0, le=86_400,
        description="when sizing took the mean forecast (predictor.size_on auto: arrivals look independent), "
        "scale down only to the largest target that independent_stabilization_rank recommendations of this "
        "window reached, instead of the highest over scale_down_stabilization_s, s; a one-interval burst is then "
        "not held, a recurring one is. None: off (the highest, always)",
    )
    independent_stabilization_rank: int = Field(
        2, ge=1, le=100,
        description="with independent_stabilization_s: how many recommendations of its window must reach a target "
        "for a scale-down to hold at it (1: the highest, as scale_down_stabilization_s)",
    )
    scale_down_floor_s: float | None = Field(
        3600.0, gt=0, le=86_400,
        description="scale down no lower than scale_down_floor_frac of the highest target recommended over this "
        "window, s: bursty tenants come back after quiet spells longer than the stabilization window; None: HPA's "
        "window alone",
    )
    scale_down_floor_frac: float = Field(0.5, gt=0, le=1, description="with scale_down_floor_s: the share of the "
                                         "window's highest target kept")
    scale_down_floor_quiet_share: float | None = Field(
        0.25, gt=0, le=1,
        description="with scale_down_floor_burst_frac: a floor window's arrivals had quiet spells when its "
        "10th-percentile interval is at or below this share of its busiest (planner.signals.quiet_spells; 0-1% on "
        "Azure code x8, 49-78% on conv and Mooncake); None together with scale_down_floor_burst_frac",
    )
    scale_down_floor_burst_frac: float | None = Field(
        1.0, gt=0, le=1,
        description="with scale_down_floor_quiet_share: the share of the window's highest target kept instead of "
        "scale_down_floor_frac while arrivals come in synchronised bursts: the window had quiet spells and sizing "
        "took the upper forecast (predictor.size_on auto: arrivals clump), the bursts that come back largest after "
        "quiet minutes (1: the hour's highest, as a static fleet would hold; chosen by its worst case over every "
        "scenario, docs/control.md); None: scale_down_floor_frac always (the default before)",
    )
    wait_for_previous_s: float = Field(1800.0, ge=0, description="make no new decision while the previous one is "
                                       "not done, for at most this long, s")
    scale_up_past_pending_s: float = Field(
        600.0, ge=0,
        description="while the previous decision is not done, scale up past it (never down) once it is this old, "
        "s: replicas that never become ready do not freeze scale-up for wait_for_previous_s",
    )
    max_observation_age_s: float | None = Field(
        None, gt=0, description="hold when the observation is older than this, s; None: two adjustment intervals"
    )
    allow_scale_to_zero: bool = Field(False, description="permit 0 replicas (needs min_replicas 0 too)")
    scale_to_zero: ScaleToZeroConfig = Field(
        default_factory=ScaleToZeroConfig,
        description="with allow_scale_to_zero: the quiet period and cold-start cost before a pool goes to zero, "
        "and the wake signal",
    )
    partial_metrics_max_missing_frac: float = Field(
        0.0, ge=0, lt=1,
        description="no scale-down when more than this share of a kind of metric source (frontend scrape targets, "
        "a pool's workers) is missing: sums over the rest understate the load; 0: any one missing",
    )
    scale_down_min_history_intervals: int = Field(
        5,
        ge=0,
        description="no scale-down while the load history holds fewer intervals than this (a planner that has "
        "just started forecasts from too little); 0: off",
    )

    @property
    def recommendation_window(self) -> tuple[str, float]:
        """The longest scale-down window, (its field name, s): what the decision history must keep."""
        names = ("scale_down_stabilization_s", "independent_stabilization_s", "scale_down_floor_s")
        name = max(names, key=lambda n: getattr(self, n) or 0.0)
        return name, getattr(self, name)

    @model_validator(mode="after")
    def _zero(self) -> "DecisionConfig":
        if (self.scale_down_floor_burst_frac is None) != (self.scale_down_floor_quiet_share is None):
            raise ValueError("decision.scale_down_floor_burst_frac and scale_down_floor_quiet_share go together: "
                             f"got {self.scale_down_floor_burst_frac!r} and {self.scale_down_floor_quiet_share!r}")
        for name in ("prefill", "decode"):
            b: PoolBounds = getattr(self, name)
            if b.min_replicas == 0 and not self.allow_scale_to_zero:
                raise ValueError(
                    f"decision.{name}.min_replicas is 0 but allow_scale_to_zero is false"
                )
        return self


class FastPathConfig(StrictModel):
    """Scale-up between adjustment intervals when the saturation guardrail or the router's shedding fires.

    A watcher polls the guardrail's per-pod queue and KV-cache series (and the
    routing service's shed counter) every poll_s and emits a Prefect event; the
    planner deployment's trigger starts a scale-up-only run at once (see
    docs/control.md, Fast path).
    """

    enabled: bool = Field(
        False,
        description="scale-up-only runs on the watcher's saturation event (and in the simulator), and scheduled "
        "runs scale up past a pending decision at once; off by default: on azure_code x8 it changed attainment and "
        "GPU-hours within seed noise (docs/control.md, Fast path)",
    )
    poll_s: float = Field(5.0, gt=0, le=600, description="how often the watcher reads the saturation signal, s")
    cooldown_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="no fast-path scale-up within this long of the last applied decision (either kind), s; "
        "the watcher also emits at most one event per this long",
    )
    shed_min_requests: float = Field(
        1.0,
        gt=0,
        description="fire when the routing service shed at least this many requests over the window of "
        "metrics.queries.shed_requests",
    )


class PlannerConfig(StrictModel):
    """The whole planner configuration (configs/planner.yaml)."""

    namespace: str = Field("default", description="Kubernetes namespace / virtual etcd prefix")
    model_id: str = Field("default", description="served model id (saturation overrides key)")
    mode: Literal["apply", "advisory"] = Field(
        "apply",
        description="apply: every scheduled run writes its decision; advisory: recommend only, next to the "
        "autoscaler already running (each run decides and publishes under the live keys, writes nothing to the "
        "cluster, and compares itself with what that autoscaler set; docs/advisory.md)",
    )
    adjustment_interval_s: float = Field(60.0, gt=0, description="seconds between planner runs")
    slo: SloTarget = Field(default_factory=SloTarget)
    profile: ProfileConfig
    predictor: PredictorConfig = Field(default_factory=PredictorConfig)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    sizing: SizingConfig = Field(default_factory=SizingConfig)
    saturation: SaturationConfig = Field(default_factory=SaturationConfig)
    decision: DecisionConfig = Field(default_factory=DecisionConfig)
    fast_path: FastPathConfig = Field(default_factory=FastPathConfig,
                                      description="scale-up-only runs between intervals on a saturation signal")


def parse_yaml(text: str, model: type[BaseModel], *, source: str) -> BaseModel:
    """Parse YAML text into `model`; errors name the source, field and value.

    source: where the text came from (a file path), used in error messages.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, source=source)) from None


def format_validation_error(exc: ValidationError, *, source: str) -> str:
    """One line per problem: `source: field.path: message (got value)`."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown field {loc!r}")
        else:
            lines.append(f"{source}: {loc}: {error_message(err)} (got {got!r})")
    return "\n".join(lines)

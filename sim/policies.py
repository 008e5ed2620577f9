"""Scaling policies the simulator compares, all behind one small interface.

Names (`make_policy`):
  planner              the planner core with the given configuration (default sizing "sla")
  planner:<predictor>  the same with another load predictor (constant, kalman, ...)
  dynamo               the planner with Dynamo's seed sizing formulas (sizing.mode = "dynamo-1.0.2")
  saturation           the saturation guardrail alone, WVA-style: +1 replica when a pool
                       runs out of spare KV/queue, -1 when the N/(N-1) check says it is safe
  static:<P>x<D>       a fixed fleet of P prefill and D decode workers
  oracle               see sim.oracle (needs the whole trace; built by make_oracle_policy)
  dynamo-peer          NVIDIA Dynamo's own planner classes (only with the optional extra)

A policy has `name`, `initial_fleet(first_obs) -> (prefill, decode)` and
`decide(PolicyInput) -> PolicyOutput`. Dynamic policies start from the fleet the
default planner would size for the first interval's load (see sim.replay).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

from connectors.base import recommendation_of
from planner.config import PlannerConfig, ProfileConfig
from planner.decision.wake import at_zero, decide_wake, wake_signal
from planner.saturation.fast_path import SaturationSignal, saturation_signal
from planner.pipeline import plan_interval
from planner.predictors.registry import predictor_names
from planner.latency.profile import EngineProfile
from planner.latency.profile_checks import ProfileRangeWarning
from planner.saturation.guardrail import analyze_fleet
from planner.latency.ttft_view import TtftView
from planner.types import Decision, FleetState, Observation, PodMetrics, Pool, ReasonCode
from sim.replay import PolicyInput, PolicyOutput
from workloads.traces import bin_trace, load_warmup_trace
from sim.warm_start import clamp, warm_start_fleet

_STATIC = re.compile(r"^static:(\d+)x(\d+)$")


class PlannerPolicy:
    """The planner core, exactly as the planner flow runs it, one interval at a time."""

    def __init__(
        self, cfg: PlannerConfig, profile: EngineProfile, *, name: str = "planner", initial: tuple[int, int] | None = None,
        ttft_view: TtftView | None = None, peak_step_s: float = 5.0,
    ):
        """ttft_view: prefill's single-request TTFT for sizing and correction (planner.latency.ttft_view); None: the profile's.
        peak_step_s: the replay's peak-rate step (ReplaySettings.peak_step_s), for the warm-up's peak rates."""
        self.name = name
        self.cfg = cfg
        self.profile = profile
        self.initial = initial
        self.ttft_view = ttft_view
        self.stabilization_window_s = cfg.decision.recommendation_window[1]
        # The replay polls the fast path's trigger between intervals when it is on.
        self.fast_path = cfg.fast_path if cfg.fast_path.enabled else None
        self._cache: dict = {}
        self._fast_cache: dict = {}  # fast-path runs fit on windows off the scheduled grid
        self.last_plan = None
        # The warm-up trace, read once; each run puts it before a short history, as the flow does, with its
        # peak rates over the live history's window (binned once per window).
        path = cfg.predictor.warmup_trace_path
        self._warmup_trace = load_warmup_trace(path) if path else None
        self._warmup: dict = {}  # per history window: (the binned warm-up, each of its intervals' sizing)
        # Runs whose targets the warm-up's floor raised, and the most it asked per pool (the what-if reports it).
        self.floor_raised = {"runs": 0, "prefill": 0, "decode": 0}
        self.peak_step_s = peak_step_s

    def initial_fleet(self, first: Observation) -> tuple[int, int]:
        return self.initial or warm_start_fleet(self.cfg, self.profile, first, ttft_view=self.ttft_view)

    def _warmup_for(self, obs: Observation):
        """The warm-up's per-interval load, with peak rates over the observation's history window."""
        return self._warmup_entry(obs)[0]

    def _warmup_entry(self, obs: Observation) -> tuple:
        """(the warm-up binned for obs's history window, the store of its intervals' sizings); (None, None)
        without a warm-up."""
        if self._warmup_trace is None:
            return None, None
        window = None if obs.history is None else obs.history.peak_window_s
        if window not in self._warmup:
            self._warmup[window] = (bin_trace(self._warmup_trace, bin_s=self.cfg.adjustment_interval_s,
                                              peak_window_s=window, peak_step_s=self.peak_step_s), {})
        return self._warmup[window]

    def decide(self, step: PolicyInput) -> PolicyOutput:
        return self._plan(step, fast_path=False)

    def fast_path_signal(self, pods: Sequence[PodMetrics]) -> SaturationSignal:
        """The watcher's trigger on the workers' metrics (the simulated router never sheds)."""
        return saturation_signal(
            pods=pods, thresholds=self.cfg.saturation.for_model(self.cfg.model_id, self.cfg.namespace),
            cfg=self.cfg.fast_path,
        )

    def decide_fast_path(self, step: PolicyInput) -> PolicyOutput:
        """The scale-up-only run the trigger starts between intervals."""
        return self._plan(step, fast_path=True)

    @property
    def allows_zero(self) -> bool:
        """Scale to zero is on: the replay accepts 0 targets and wakes the fleet on a held request."""
        return self.cfg.decision.allow_scale_to_zero

    def at_zero(self, fleet: FleetState) -> tuple[Pool, ...]:
        return at_zero(fleet, self.cfg.decision)

    def decide_wake(self, step: PolicyInput, *, waiting_requests: float) -> PolicyOutput:
        """The wake run a held request starts (planner.decision.wake), as the watcher's run decides live."""
        signal = wake_signal(pools_at_zero=self.at_zero(step.fleet), waiting_requests=waiting_requests,
                             min_requests=self.cfg.decision.scale_to_zero.wake_min_requests)
        return _output(decide_wake(fleet=step.fleet, cfg=self.cfg.decision, signal=signal))

    def _plan(self, step: PolicyInput, *, fast_path: bool) -> PolicyOutput:
        warmup, sized = self._warmup_entry(step.observation)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            # The pipeline's warm-up floor step, as the flow runs it (none on a fast-path run).
            plan = plan_interval(
                step.observation, step.fleet, self.cfg, self.profile, now_s=step.now_s,
                predictor_cache=self._fast_cache if fast_path else self._cache, fast_path=fast_path,
                ttft_view=self.ttft_view, warmup=warmup, warmup_sized=sized,
            )
        self.last_plan = plan
        d = plan.decision
        raised = {r.pool for r in d.reasons if r.code == ReasonCode.WARMUP_START_FLOOR}
        if raised:
            self.floor_raised["runs"] += 1
            for pool in raised:
                self.floor_raised[pool] = max(self.floor_raised[pool], plan.start_floor.targets[pool])
        return _output(d)


def _output(d: Decision) -> PolicyOutput:
    """A planner decision as the replay applies it."""
    reason = "; ".join(f"{r.code.value}: {r.message}" for r in d.reasons)
    details = {"code": d.reasons[0].code.value if d.reasons else ""}
    # Every run's recommendation is stored, applied or not, as the connectors do.
    rec_p, rec_d = recommendation_of(d)
    if not d.apply:
        return PolicyOutput(None, None, reason, recommended_prefill=rec_p, recommended_decode=rec_d,
                            details=details)
    return PolicyOutput(
        d.prefill_replicas, d.decode_replicas, reason, recommended_prefill=rec_p, recommended_decode=rec_d,
        details=details,
    )


class SaturationPolicy:
    """The saturation guardrail alone (llm-d WVA style): one replica up or down at a time."""

    def __init__(
        self, cfg: PlannerConfig, profile: EngineProfile, *, name: str = "saturation",
        initial: tuple[int, int] | None = None,
    ):
        self.name = name
        self.cfg = cfg
        self.profile = profile
        self.initial = initial
        self.stabilization_window_s = 0.0

    def initial_fleet(self, first: Observation) -> tuple[int, int]:
        return self.initial or warm_start_fleet(self.cfg, self.profile, first)

    def decide(self, step: PolicyInput) -> PolicyOutput:
        verdicts = analyze_fleet(
            obs=step.observation,
            fleet=step.fleet,
            saturation_cfg=self.cfg.saturation,
            decision_cfg=self.cfg.decision,
            model_id=self.cfg.model_id,
            namespace=self.cfg.namespace,
            now_s=step.now_s,
        )
        if verdicts is None:
            return PolicyOutput(None, None, "saturation guardrail disabled")
        targets = {}
        for pool, v in verdicts.items():
            b = getattr(self.cfg.decision, pool)
            targets[pool] = clamp(v.target_replicas, max(1, b.min_replicas), b.max_replicas)
        reason = "; ".join(v.message for v in verdicts.values())
        return PolicyOutput(targets["prefill"], targets["decode"], reason)


class StaticPolicy:
    """A fixed fleet: P prefill and D decode workers, never scaled."""

    def __init__(self, prefill: int, decode: int):
        if prefill < 1 or decode < 1:
            raise ValueError(f"static policy: need >= 1 worker per pool, got {prefill}x{decode}")
        self.name = f"static:{prefill}x{decode}"
        self.prefill = prefill
        self.decode = decode
        self.stabilization_window_s = 0.0

    def initial_fleet(self, first: Observation) -> tuple[int, int]:
        return self.prefill, self.decode

    def decide(self, step: PolicyInput) -> PolicyOutput:
        return PolicyOutput(None, None, "static")


class ScheduledPolicy:
    """Targets fixed in advance per control step (the oracle's plan)."""

    def __init__(self, prefill: list[int], decode: list[int], *, initial: tuple[int, int], name: str = "oracle"):
        if len(prefill) != len(decode):
            raise ValueError(f"scheduled policy: {len(prefill)} prefill targets vs {len(decode)} decode targets")
        self.name = name
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.initial = initial
        self.stabilization_window_s = 0.0

    def initial_fleet(self, first: Observation) -> tuple[int, int]:
        return self.initial

    def decide(self, step: PolicyInput) -> PolicyOutput:
        k = step.interval_index
        if k >= len(self.prefill):
            return PolicyOutput(self.prefill[-1], self.decode[-1], "schedule: past the end, holding")
        return PolicyOutput(self.prefill[k], self.decode[k], "schedule")


def peer_available() -> bool:
    """True when NVIDIA Dynamo's planner package (the optional benchmark extra) is importable."""
    import importlib.util

    try:
        return importlib.util.find_spec("dynamo.planner") is not None
    except (ImportError, ValueError):
        return False


def policy_names() -> list[str]:
    """Policy names the CLI accepts (parametrised ones shown with their pattern)."""
    names = ["planner", *(f"planner:{p}" for p in predictor_names()), "dynamo", "saturation", "static:<P>x<D>", "oracle"]
    if peer_available():
        names.append("dynamo-peer")
    return names


def check_policy_name(name: str) -> str:
    """The name if it is a policy this build knows (oracle and dynamo-peer included); else ValueError."""
    if name in ("planner", "dynamo", "saturation", "oracle"):
        return name
    if name.startswith("planner:"):
        predictor = name.split(":", 1)[1]
        if predictor not in predictor_names():
            raise ValueError(f"policy {name!r}: unknown predictor {predictor!r}; valid: {', '.join(predictor_names())}")
        return name
    if name.startswith("static"):
        m = _STATIC.match(name)
        if not m:
            raise ValueError(f"policy {name!r}: expected static:<P>x<D>, e.g. static:4x2")
        if int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ValueError(f"policy {name!r}: need >= 1 worker per pool")
        return name
    if name == "dynamo-peer":
        if not peer_available():
            raise ValueError(
                "policy 'dynamo-peer' needs the optional extra: pip install --no-deps ai-dynamo==1.0.2 "
                "ai-dynamo-runtime==1.0.2"
            )
        return name
    raise ValueError(f"unknown policy {name!r}; valid: {', '.join(policy_names())}")


def make_policy(name: str, *, cfg: PlannerConfig, profile: EngineProfile, ttft_view: TtftView | None = None):
    """A policy by name (all but `oracle`, which needs the trace: see sim.oracle).

    ttft_view: the planner policies' prefill TTFT (planner.latency.ttft_view); None: the profile's.
    """
    if name == "planner":
        return PlannerPolicy(cfg, profile, name="planner", ttft_view=ttft_view)
    if name.startswith("planner:"):
        predictor = name.split(":", 1)[1]
        if predictor not in predictor_names():
            raise ValueError(f"policy {name!r}: unknown predictor {predictor!r}; valid: {', '.join(predictor_names())}")
        pcfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"name": predictor})})
        return PlannerPolicy(pcfg, profile, name=name, ttft_view=ttft_view)
    if name == "dynamo":
        # Dynamo's formulas on the p90 forecast, as this comparison row has always been measured.
        dcfg = cfg.model_copy(update={"sizing": cfg.sizing.model_copy(update={"mode": "dynamo-1.0.2"}),
                                      "predictor": cfg.predictor.model_copy(update={"size_on": "p90"})})
        return PlannerPolicy(dcfg, profile, name="dynamo", ttft_view=ttft_view)
    if name == "saturation":
        return SaturationPolicy(cfg, profile)
    m = _STATIC.match(name)
    if m:
        return StaticPolicy(int(m.group(1)), int(m.group(2)))
    if name.startswith("static"):
        raise ValueError(f"policy {name!r}: expected static:<P>x<D>, e.g. static:4x2")
    if name == "dynamo-peer":
        if not peer_available():
            raise ValueError(
                "policy 'dynamo-peer' needs the optional extra: pip install --no-deps ai-dynamo==1.0.2 "
                "ai-dynamo-runtime==1.0.2"
            )
        from sim.dynamo_peer import DynamoPeerPolicy

        return DynamoPeerPolicy(cfg, profile)
    if name == "oracle":
        raise ValueError("policy 'oracle' needs the whole trace: build it with sim.oracle.make_oracle_policy")
    raise ValueError(f"unknown policy {name!r}; valid: {', '.join(policy_names())}")


def default_planner_config(*, profile_dir: str, ttft_ms: float, itl_ms: float, interval_s: float) -> PlannerConfig:
    """The planner's default configuration for a what-if run."""
    return PlannerConfig(
        adjustment_interval_s=interval_s,
        slo={"ttft_ms": ttft_ms, "itl_ms": itl_ms},
        profile=ProfileConfig(dir=str(profile_dir)),
    )

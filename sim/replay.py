"""Replay a trace through the simulated fleet with a scaling policy in the loop.

Every `interval_s` of virtual time the replay does what the planner flow does
against a real deployment: it collects the interval's frontend averages and
per-worker KV usage and queue (as `planner.types.Observation`, with the load
history the collect step would rebuild from Prometheus range queries), reads the
fleet state and the previously applied decisions (as `FleetState`), asks the
policy for targets and applies them to the simulated fleet. The simulator is the
metrics source and the connector; the planner policy runs the same
`planner.pipeline.plan_interval` as the flow.

A policy with a `fast_path` setting (the planner with fast_path.enabled) is
also polled between intervals, as the watcher would poll Prometheus; a
firing trigger runs its scale-up-only decision (sim.fast_path), and the result
lists each such event: saturation onset, decision, replicas ready.

GPU-hours are billed for every allocated worker (starting, ready or draining)
from 0 to the end of the interval in which the last request finished.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from planner.signals.burst import peak_rates
from planner.config import SloTarget
from planner.signals.length_shape import DEFAULT_LENGTH_WINDOW_S
from planner.signals.slo_attainment import DEFAULT_SLO_WINDOW_S
from planner.types import DecisionRecord, FleetState, LoadHistory, Observation, PoolState
from sim.config import SimConfig
from sim.engine import FleetSim
from sim.fast_path import ArrivalWindows, FastPathEvent, Trigger
from sim.wake import WakeEvent, ready_after, wake_until
from sim.lookup import ProfileTables
from sim.observation import LengthWindow, SloWindow, interval_observation
from sim.results import RequestResults
from sim.routing import Router, make_router
from workloads.traces import Trace, lead_in


@dataclass(frozen=True)
class ReplaySettings:
    """What a replay holds fixed: SLA, control interval, engine and fleet settings.

    history_intervals: intervals of load history handed to the policy each run.
    max_drain_s: after the last arrival, give up if requests are still running this long.
    lead_in_s: the trace's first lead_in_s seconds run the fleet and the policy but are not scored:
        results, GPU-hours, the timeline and the scale log count from there, on a clock that starts
        there (a policy started against a running fleet, with its history; workloads.traces.lead_in builds
        such a trace). A whole number of intervals; 0: none.
    lead_in_restart: the planner starts at lead_in_s: its first run there finds no recommendation or decision
        recorded (the simulated connector forgets the lead-in's) against the fleet the lead-in left, with the
        lead-in as its collected history (the warm start from Prometheus history, planner.steps.history_warm_start);
        False: the policy that ran the lead-in goes on (a running planner).
    """

    slo: SloTarget = field(default_factory=SloTarget)
    interval_s: float = 60.0
    sim: SimConfig = field(default_factory=SimConfig)
    router: str = "least-loaded"
    history_intervals: int = 288
    max_drain_s: float = 6 * 3600.0
    # The frontend's peak arrival rate per interval, as the collect step's default
    # query reads it: the max over the interval, every peak_step_s, of the rate over
    # the last peak_window_s. None: not measured (the planner then assumes flat arrivals).
    peak_window_s: float | None = 15.0
    peak_step_s: float = 5.0
    # The frontend's length histograms are read over this trailing window (the collect
    # step's metrics.length_window_s), for the measured length spread. None: not read.
    length_window_s: float | None = DEFAULT_LENGTH_WINDOW_S
    # ... and its TTFT and ITL histograms over this one (metrics.slo_window_s). None: not read.
    slo_window_s: float | None = DEFAULT_SLO_WINDOW_S
    # From the fast path's trigger firing to its run deciding, s: the automation creates the
    # run, a process worker picks it up (it asks every 10 s by default), starts it and collects.
    fast_path_dispatch_s: float = 10.0
    lead_in_s: float = 0.0
    lead_in_restart: bool = False

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"ReplaySettings: interval_s must be > 0, got {self.interval_s}")
        whole = self.lead_in_s / self.interval_s
        if not (self.lead_in_s >= 0 and math.isfinite(self.lead_in_s) and abs(whole - round(whole)) < 1e-9):
            raise ValueError(f"ReplaySettings: lead_in_s must be a whole number of intervals ({self.interval_s:g} s) "
                             f">= 0, got {self.lead_in_s}")
        if self.peak_window_s is not None and not (0 < self.peak_window_s and 0 < self.peak_step_s <= self.interval_s):
            raise ValueError(
                f"ReplaySettings: need peak_window_s > 0 and 0 < peak_step_s <= interval_s, got "
                f"{self.peak_window_s}, {self.peak_step_s}"
            )
        for name in ("length_window_s", "slo_window_s"):
            if getattr(self, name) is not None and not getattr(self, name) >= self.interval_s:
                raise ValueError(f"ReplaySettings: {name} must be >= interval_s, got {getattr(self, name)}")
        if self.history_intervals < 1:
            raise ValueError(f"ReplaySettings: history_intervals must be >= 1, got {self.history_intervals}")


@dataclass(frozen=True)
class PolicyInput:
    """What a policy sees at one control step (all on the simulated clock)."""

    now_s: float
    observation: Observation
    fleet: FleetState
    interval_index: int


@dataclass(frozen=True)
class PolicyOutput:
    """Targets (None: leave the fleet as it is), and why, for the timeline."""

    prefill_replicas: int | None
    decode_replicas: int | None
    reason: str = ""
    recommended_prefill: int | None = None
    recommended_decode: int | None = None
    details: dict = field(default_factory=dict)


@dataclass
class Timeline:
    """Per-interval series of a replay (all lists of equal length)."""

    t_s: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    avg_isl_tokens: list[float] = field(default_factory=list)
    avg_osl_tokens: list[float] = field(default_factory=list)
    avg_ttft_ms: list[float] = field(default_factory=list)
    avg_itl_ms: list[float] = field(default_factory=list)
    prefill_ready: list[int] = field(default_factory=list)
    decode_ready: list[int] = field(default_factory=list)
    prefill_allocated: list[int] = field(default_factory=list)
    decode_allocated: list[int] = field(default_factory=list)
    prefill_target: list[int] = field(default_factory=list)
    decode_target: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list]:
        return {k: list(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ReplayResult:
    """Everything a replay produced."""

    trace_name: str
    policy: str
    scenario: ReplaySettings
    requests: RequestResults
    timeline: Timeline
    gpu_seconds: dict[str, float]
    scale_log: tuple[tuple[float, str, int, int], ...]
    end_s: float
    wall_s: float
    policy_wall_s: float = 0.0  # of wall_s, time spent in the policy (the planner core)
    fast_path_events: tuple[FastPathEvent, ...] = ()  # empty when the policy has no fast path
    wake_events: tuple[WakeEvent, ...] = ()  # empty unless the policy allows scale to zero

    @property
    def gpu_hours(self) -> float:
        return sum(self.gpu_seconds.values()) / 3600.0

    def sla_met(self) -> np.ndarray:
        return self.requests.sla_met(ttft_ms=self.scenario.slo.ttft_ms, itl_ms=self.scenario.slo.itl_ms)


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else float(x)


class _DecisionLog:
    """What the simulated connector remembers of applied decisions (like the DGD annotations)."""

    def __init__(self, window_s: float, initial: tuple[int, int]):
        self.window_s = window_s
        self.initial = initial  # the fleet the replay started with, ready at t = 0
        self.records: list[DecisionRecord] = []
        self.recommended: list[tuple[float, int, int]] = []

    def add(self, t_s: float, prefill: int, decode: int) -> None:
        """A decision that changed the targets."""
        self.records.append(DecisionRecord(len(self.records) + 1, t_s, prefill, decode, done=False))

    def restart(self, sim: FleetSim) -> None:
        """A planner started now: nothing recorded, the fleet as it is (its allocated workers) the initial one."""
        self.initial = (len(sim.live_workers("prefill")), len(sim.live_workers("decode")))
        self.records, self.recommended = [], []

    def recommend(self, t_s: float, prefill: int, decode: int) -> None:
        """Every run's recommendation (applied or not), for the stabilization window."""
        self.recommended.append((t_s, prefill, decode))

    def fleet_state(self, sim: FleetSim, now_s: float) -> FleetState:
        p_live, d_live = len(sim.live_workers("prefill")), len(sim.live_workers("decode"))
        p_ready, d_ready = sim.ready_count("prefill"), sim.ready_count("decode")
        last = None
        if self.records:
            r = self.records[-1]
            done = p_ready == r.prefill_replicas == p_live and d_ready == r.decode_replicas == d_live
            last = DecisionRecord(r.decision_id, r.decided_at_s, r.prefill_replicas, r.decode_replicas, done)
        recent = tuple(x for x in self.recommended if now_s - x[0] <= self.window_s)
        return FleetState(
            prefill=PoolState(p_live, p_ready, sim.cfg.gpus_per_prefill),
            decode=PoolState(d_live, d_ready, sim.cfg.gpus_per_decode),
            last_decision=last,
            recent_targets=recent,
            applied_targets=((0.0, *self.initial),
                             *((r.decided_at_s, r.prefill_replicas, r.decode_replicas) for r in self.records)),
            # The ready counts' recent changes, as a connector's readiness history would show them.
            ready_history=tuple(sim.ready_log[-512:]),
        )


def replay(
    trace: Trace,
    tables: ProfileTables,
    policy,
    *,
    scenario: ReplaySettings,
    router: Router | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Run `trace` through a simulated fleet controlled by `policy`.

    policy: has `name`, `initial_fleet(first: Observation) -> (prefill, decode)` and
        `decide(PolicyInput) -> PolicyOutput`; with a `fast_path` setting (not None)
        also `fast_path_signal(pods)` and `decide_fast_path(PolicyInput)`.
    progress: called as progress(requests_arrived, total) after every interval.
    """
    run = ReplayRun(trace, tables, policy, scenario=scenario, router=router)
    k = 0
    while True:
        t = (k + 1) * scenario.interval_s
        finished = run.interval(k, t)
        if progress is not None:
            progress(run.sim.next_arrival, len(trace))
        if finished:
            break
        if t > trace.duration_s + scenario.max_drain_s:
            raise RuntimeError(
                f"replay {trace.name} with {policy.name}: {len(trace) - run.sim.completed} requests still running "
                f"{scenario.max_drain_s:g} s after the last arrival"
            )
        k += 1
    return run.result(end_s=t)


@dataclass(frozen=True)
class IntervalStep:
    """One interval's scheduled run, decided but not yet applied: what `ReplayRun.settle` applies.

    fleet and out are None once every request has finished (finished: True).
    """

    k: int
    t_s: float
    observation: Observation
    fleet: FleetState | None
    out: PolicyOutput | None
    finished: bool


class ReplayRun:
    """One replay's state: the simulated fleet, its decision log, the load history and the timeline.

    `interval` runs an interval whole; a fleet of replays under one budget (sim.fleet_replay) runs each
    one's `decide`, arbitrates, then `settle`s each with its grant.
    """

    def __init__(self, trace: Trace, tables: ProfileTables, policy, *, scenario: ReplaySettings,
                 router: Router | None):
        self.wall0 = time.perf_counter()
        self.trace, self.policy, self.scenario = trace, policy, scenario
        p0, d0 = policy.initial_fleet(first_interval_observation(trace, scenario))
        self.sim = FleetSim(trace, tables, config=scenario.sim, router=router or make_router(scenario.router),
                            initial_prefill=p0, initial_decode=d0)
        self.log = _DecisionLog(getattr(policy, "stabilization_window_s", 0.0), (p0, d0))
        self.tl = Timeline()
        self.hist: dict[str, list[float]] = {"t": [], "n": [], "isl": [], "osl": [], "peak": []}
        self.arrivals_s = np.asarray(trace.arrival_s, dtype=float)
        self.lengths = None if scenario.length_window_s is None else LengthWindow(
            trace.isl_tokens, trace.osl_tokens, interval_s=scenario.interval_s,
            window_intervals=max(1, round(scenario.length_window_s / scenario.interval_s)))
        self.slo_window = None if scenario.slo_window_s is None else SloWindow(
            interval_s=scenario.interval_s, window_intervals=max(1, round(scenario.slo_window_s / scenario.interval_s)))
        self.policy_wall = 0.0
        self.trigger = None
        fast = getattr(policy, "fast_path", None)
        if fast is not None:
            self.trigger = Trigger(poll_s=fast.poll_s, cooldown_s=fast.cooldown_s,
                                   dispatch_s=scenario.fast_path_dispatch_s)
            self.windows = ArrivalWindows(self.arrivals_s, trace.isl_tokens, trace.osl_tokens)
        self.events: list[tuple[FastPathEvent, list]] = []
        self.wake_events: list[WakeEvent] = []  # a policy that allows scale to zero: its wakes (sim.wake)
        self.last_obs: Observation | None = None
        self.gpu_s_at_lead_in = {"prefill": 0.0, "decode": 0.0}

    def interval(self, k: int, t: float) -> bool:
        """Interval k, ending at t: fast-path runs inside it, then the scheduled run; True once all finished."""
        step = self.decide(k, t)
        self.settle(step)
        return step.finished

    def decide(self, k: int, t: float) -> IntervalStep:
        """Interval k up to its scheduled run's decision, not yet applied (`settle` applies it)."""
        if self.trigger is not None:
            self.fast_path_until(t, k)
        if getattr(self.policy, "allows_zero", False):
            self.wake_events += wake_until(
                self, t, dispatch_s=self.scenario.fast_path_dispatch_s,
                step=lambda now, fleet: PolicyInput(now_s=now, observation=self.last_obs, fleet=fleet, interval_index=k))
        self.sim.run_until(t)
        if self.scenario.lead_in_s and abs(t - self.scenario.lead_in_s) < 1e-6:
            self.gpu_s_at_lead_in = self.sim.gpu_seconds(t)  # billing is scored from here
            if self.scenario.lead_in_restart:
                self.log.restart(self.sim)
        obs = self.observe(t)
        if self.sim.done:
            return IntervalStep(k, t, obs, None, None, finished=True)
        fleet = self.log.fleet_state(self.sim, t)
        w0 = time.perf_counter()
        out = self.policy.decide(PolicyInput(now_s=t, observation=obs, fleet=fleet, interval_index=k))
        self.policy_wall += time.perf_counter() - w0
        return IntervalStep(k, t, obs, fleet, out, finished=False)

    def settle(self, step: IntervalStep, out: PolicyOutput | None = None) -> None:
        """Apply the step's decision (or `out` in its place: the fleet's grant) and record the interval."""
        out = step.out if out is None else out
        if out is not None:
            self.act(out, step.fleet, step.t_s)
        self.last_obs = step.observation
        _record(self.tl, step.t_s, step.observation, self.sim, "" if out is None else out.reason)

    def observe(self, t: float) -> Observation:
        """The interval's observation as the collect step would build it, with the load history."""
        scenario, hist = self.scenario, self.hist
        stats = self.sim.take_interval_stats()
        pods = self.sim.pod_metrics(t)
        hist["t"].append(t)
        hist["n"].append(float(stats.arrivals))
        hist["isl"].append(stats.isl_sum / stats.arrivals if stats.arrivals else math.nan)
        hist["osl"].append(stats.osl_sum / stats.completions if stats.completions else math.nan)
        peak = peak_rate_rps(self.arrivals_s, end_s=t, scenario=scenario)
        hist["peak"].append(math.nan if peak is None else peak)
        h0 = max(0, len(hist["t"]) - scenario.history_intervals)
        history = LoadHistory(
            t_s=tuple(hist["t"][h0:]),
            num_requests=tuple(hist["n"][h0:]),
            avg_isl_tokens=tuple(hist["isl"][h0:]),
            avg_osl_tokens=tuple(hist["osl"][h0:]),
            interval_s=scenario.interval_s,
            peak_rps=None if scenario.peak_window_s is None else tuple(hist["peak"][h0:]),
            peak_window_s=scenario.peak_window_s,
        )
        obs = interval_observation(stats, taken_at_s=t, interval_s=scenario.interval_s, history=history, pods=pods)
        isl_h = osl_h = None
        if self.lengths is not None:
            self.lengths.add_interval(self.sim.next_arrival)
            isl_h, osl_h = self.lengths.histograms()
        return dataclasses.replace(obs, peak_rps=peak, peak_window_s=scenario.peak_window_s,
                                   isl_histogram=isl_h, osl_histogram=osl_h,
                                   slo_window=None if self.slo_window is None else self.slo_window.add_interval(stats))

    def act(self, out: PolicyOutput, fleet: FleetState, now_s: float) -> list:
        """Apply a policy's output as the connector would; the workers it added."""
        sim, log = self.sim, self.log
        if out.recommended_prefill is not None and out.recommended_decode is not None:
            log.recommend(now_s, out.recommended_prefill, out.recommended_decode)
        if out.prefill_replicas is None and out.decode_replicas is None:
            return []
        p = out.prefill_replicas if out.prefill_replicas is not None else fleet.prefill.current_replicas
        d = out.decode_replicas if out.decode_replicas is not None else fleet.decode.current_replicas
        lowest = 0 if getattr(self.policy, "allows_zero", False) else 1
        if p < lowest or d < lowest:
            raise ValueError(f"policy {self.policy.name}: targets must keep >= {lowest} worker per pool, got {p}x{d}")
        if (p, d) == (fleet.prefill.current_replicas, fleet.decode.current_replicas):
            return []
        before = len(sim.prefill_workers), len(sim.decode_workers)
        sim.set_target("prefill", p, now_s)
        sim.set_target("decode", d, now_s)
        log.add(now_s, p, d)
        return sim.prefill_workers[before[0]:] + sim.decode_workers[before[1]:]

    def fast_path_until(self, end_s: float, k: int) -> None:
        """Polls and fast-path runs strictly before end_s (the next scheduled run)."""
        sim, trigger = self.sim, self.trigger
        while not sim.done and trigger.next_time_s() < end_s:
            now = trigger.next_time_s()
            sim.run_until(now)
            due = trigger.take_due(now)
            if due is not None:
                self.fast_path_run(now, k, due)
            if now >= trigger.next_poll_s:
                signal = self.policy.fast_path_signal(sim.pod_metrics(now, reset_peaks=False))
                trigger.poll(now, fire=signal.fire, message=signal.message)

    def fast_path_run(self, now: float, k: int, due: tuple[float, float, str]) -> None:
        """A fired trigger's scale-up-only run, recorded as a fast-path event."""
        onset, fired, message = due
        scenario, last_obs = self.scenario, self.last_obs
        pods = self.sim.pod_metrics(now, reset_peaks=False)
        o = self.windows.observation(
            now_s=now, interval_s=scenario.interval_s, history_intervals=scenario.history_intervals,
            peak_window_s=scenario.peak_window_s, peak_step_s=scenario.peak_step_s, pods=pods,
            avg_ttft_ms=None if last_obs is None else last_obs.avg_ttft_ms,
            avg_itl_ms=None if last_obs is None else last_obs.avg_itl_ms,
        )
        if last_obs is not None:  # the length window hardly moves in less than an interval
            o = dataclasses.replace(o, isl_histogram=last_obs.isl_histogram, osl_histogram=last_obs.osl_histogram)
        fleet = self.log.fleet_state(self.sim, now)
        w0 = time.perf_counter()
        out = self.policy.decide_fast_path(PolicyInput(now_s=now, observation=o, fleet=fleet, interval_index=k))
        self.policy_wall += time.perf_counter() - w0
        added = self.act(out, fleet, now)
        base = (fleet.prefill.current_replicas, fleet.decode.current_replicas)
        to = (out.prefill_replicas or base[0], out.decode_replicas or base[1])
        self.events.append((FastPathEvent(onset, fired, now, out.details.get("code", ""), base, to,
                                          to != base, None, message), added))

    def result(self, *, end_s: float) -> ReplayResult:
        """The replay's result; after a lead-in, only the trace's part, on a clock that starts with it."""
        sim, lead = self.sim, self.scenario.lead_in_s
        events = tuple(dataclasses.replace(e, ready_s=max(w.ready_at_s for w in added))
                       if added and all(w.ready for w in added) else e for e, added in self.events)
        keep = [i for i, t in enumerate(self.tl.t_s) if t > lead]
        timeline = Timeline(**{name: [(v[i] - lead if name == "t_s" else v[i]) for i in keep]
                               for name, v in vars(self.tl).items()}) if lead else self.tl
        return ReplayResult(
            trace_name=self.trace.name,
            policy=self.policy.name,
            scenario=self.scenario,
            requests=sim.results().arriving_from(lead),
            timeline=timeline,
            gpu_seconds={pool: s - self.gpu_s_at_lead_in[pool] for pool, s in sim.gpu_seconds(end_s).items()},
            scale_log=tuple((t - lead, *rest) for t, *rest in sim.scale_log if t >= lead),
            end_s=end_s - lead,
            wall_s=time.perf_counter() - self.wall0,
            policy_wall_s=self.policy_wall,
            fast_path_events=tuple(
                dataclasses.replace(e, onset_s=e.onset_s - lead, fired_s=e.fired_s - lead,
                                    decided_s=e.decided_s - lead,
                                    ready_s=None if e.ready_s is None else e.ready_s - lead)
                for e in events if e.decided_s >= lead),
            wake_events=tuple(
                dataclasses.replace(e, held_s=e.held_s - lead, decided_s=e.decided_s - lead,
                                    ready_s=None if ready is None else ready - lead)
                for e in self.wake_events if e.decided_s >= lead
                for ready in [ready_after(sim.ready_log, e.decided_s, e.to_replicas)]),
        )


def after_lead_in(lead: Trace, trace: Trace, scenario: ReplaySettings) -> tuple[Trace, ReplaySettings]:
    """`lead` before `trace`, the lead-in rounded up to whole intervals, and the settings that score only
    `trace` (ReplaySettings.lead_in_s): a replay of a policy started against a running fleet."""
    lead_s = (math.floor(lead.duration_s / scenario.interval_s) + 1) * scenario.interval_s
    return lead_in(lead, trace, lead_s=lead_s), dataclasses.replace(scenario, lead_in_s=lead_s)


def peak_rate_rps(arrival_s: np.ndarray, *, end_s: float, scenario: ReplaySettings) -> float | None:
    """Highest arrival rate over a `peak_window_s` window ending in the interval that ends at end_s, requests/s
    (planner.signals.burst.peak_rates, the collect step's signal); None when the scenario does not measure it."""
    if scenario.peak_window_s is None:
        return None
    return float(peak_rates(arrival_s, ends_s=[end_s], interval_s=scenario.interval_s,
                            window_s=scenario.peak_window_s, step_s=scenario.peak_step_s)[0])


def _record(tl: Timeline, t: float, obs: Observation, sim: FleetSim, reason: str) -> None:
    tl.t_s.append(t)
    tl.arrivals.append(_nan_if_none(obs.num_requests))
    tl.avg_isl_tokens.append(_nan_if_none(obs.avg_isl_tokens))
    tl.avg_osl_tokens.append(_nan_if_none(obs.avg_osl_tokens))
    tl.avg_ttft_ms.append(_nan_if_none(obs.avg_ttft_ms))
    tl.avg_itl_ms.append(_nan_if_none(obs.avg_itl_ms))
    tl.prefill_ready.append(sim.ready_count("prefill"))
    tl.decode_ready.append(sim.ready_count("decode"))
    tl.prefill_allocated.append(sim.allocated_count("prefill"))
    tl.decode_allocated.append(sim.allocated_count("decode"))
    tl.prefill_target.append(len(sim.live_workers("prefill")))
    tl.decode_target.append(len(sim.live_workers("decode")))
    tl.reasons.append(reason)


def first_interval_observation(trace: Trace, scenario: ReplaySettings) -> Observation:
    """The load a policy's initial fleet must carry, for warm-starting it.

    No decision can add a serving worker before interval 1 + ceil(startup/interval),
    so the initial fleet alone serves intervals 0..m. Every dynamic policy starts
    from the busiest of those intervals (count, with its mean lengths): the same
    knowledge the oracle's initial fleet uses, and what a planner that had been
    running before the trace began would roughly have. This keeps the comparison
    about control, not about a cold start.
    """
    from workloads.traces import bin_trace

    interval_s, startup_s, peak_window_s = scenario.interval_s, scenario.sim.startup_s, scenario.peak_window_s
    m = max(0, math.ceil(startup_s / interval_s - 1e-9))
    h = bin_trace(trace, bin_s=interval_s, end_s=interval_s * (m + 1))
    i = int(np.argmax(h.num_requests))
    n = h.num_requests[i]
    isl = h.avg_isl_tokens[i]
    osl = h.avg_osl_tokens[i]
    peak = None
    if peak_window_s is not None:
        peak = peak_rate_rps(np.asarray(trace.arrival_s, dtype=float), end_s=float(h.t_s[i]), scenario=scenario)
    first = LoadHistory(
        t_s=(h.t_s[i],), num_requests=(n,), avg_isl_tokens=(isl,), avg_osl_tokens=(osl,), interval_s=interval_s,
        peak_rps=None if peak is None else (peak,), peak_window_s=peak_window_s,
    )
    return Observation(
        peak_rps=peak,
        peak_window_s=peak_window_s,
        taken_at_s=0.0,
        interval_s=interval_s,
        num_requests=n,
        avg_isl_tokens=None if math.isnan(isl) else isl,
        avg_osl_tokens=None if math.isnan(osl) else osl,
        avg_ttft_ms=None,
        avg_itl_ms=None,
        history=first,
    )

"""`sla-planner plan`: the planner flow, interval by interval, on this machine.

No cluster needed: a real trace is replayed through the fleet simulator, which
plays both Prometheus (it hands each interval's metrics to the flow) and the
deployment environment (it follows the targets the local connector holds,
with the startup delay). Every interval is a real planner flow run against
Prefect's ephemeral API, with its artifacts; the command prints each decision.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
from pathlib import Path

from planner_cli.command import add_config_option, command_parser

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = PROJECT_ROOT / "data" / "traces" / "azure2023_conv.csv.gz"


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "plan", doc=__doc__,
                       help="run the planner flow for several intervals against a simulated fleet (no cluster)")
    add_config_option(p)
    p.add_argument("--trace", default=str(DEFAULT_TRACE), help="trace to replay (Azure CSV or Mooncake JSONL)")
    p.add_argument("--intervals", type=int, default=15, help="planner runs to make (default: %(default)s)")
    p.add_argument("--load-multiplier", type=float, default=8.0,
                   help="superpose this many copies of the trace (default: %(default)s)")
    p.add_argument("--jitter-s", type=float, default=30.0,
                   help="shift each copied request by up to +-this many seconds (default: %(default)s: independent "
                        "tenants; 1: synchronised copies, the stress case)")
    p.add_argument("--startup-s", type=float, default=60.0, help="worker startup delay, s (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for the load multiplier's offsets")
    p.add_argument("--state-dir", default=None, help="where the local fleet state goes (default: a temp dir)")
    p.add_argument("--verbose", action="store_true", help="show Prefect's run logs too")


def run(args: argparse.Namespace) -> int:
    if args.intervals < 1:
        print("sla-planner plan: --intervals must be >= 1", file=sys.stderr)
        return 2
    from planner_cli.local_prefect import prefect_env

    prefect_env(verbose=args.verbose)
    from connectors.profiles import load_profile
    from flows.config import load_run_config
    from workloads.traces import load_trace, multiply_load

    # Every input is read before Prefect starts: a bad one is one line at once.
    try:
        cfg = load_run_config(args.config)
        try:
            profile = load_profile(cfg.planner.profile)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{args.config}: planner.profile: {exc}") from None
        trace = load_trace(args.trace)
        trace_name = trace.name  # the file's, before the copies rename it
        if args.load_multiplier != 1.0:
            trace = multiply_load(trace, args.load_multiplier, seed=args.seed, jitter_s=args.jitter_s)
    except (ValueError, OSError) as exc:
        print(f"sla-planner plan: {exc}", file=sys.stderr)
        return 2

    if args.state_dir:
        return _plan(args, cfg, profile, trace, trace_name, Path(args.state_dir))
    # Without --state-dir the fleet's state lives as long as the command: nothing is left behind.
    with tempfile.TemporaryDirectory(prefix="sla-planner-plan-") as state_dir:
        return _plan(args, cfg, profile, trace, trace_name, Path(state_dir))


def _plan(args: argparse.Namespace, cfg, profile, trace, trace_name: str, state_dir: Path) -> int:
    """The replay, one planner flow run per interval, with the fleet's state in state_dir."""
    from connectors.config import LocalConnectorConfig
    from connectors.local import LocalConnector
    from planner_cli.local_prefect import prefect_api
    from sim.config import SimConfig
    from sim.engine import FleetSim
    from sim.lookup import ProfileTables
    from sim.observation import LengthWindow, SloWindow, interval_observation
    from sim.whatif.scenario import load_model

    state_dir.mkdir(parents=True, exist_ok=True)
    connector_cfg = LocalConnectorConfig(
        state_path=str(state_dir / "fleet.json"),
        apply_delay_s=args.startup_s,
        initial_prefill_replicas=cfg.planner.decision.prefill.min_replicas or 1,
        initial_decode_replicas=cfg.planner.decision.decode.min_replicas or 1,
    )
    cfg = cfg.model_copy(update={"connector": connector_cfg})
    interval_s = cfg.planner.adjustment_interval_s
    sim = FleetSim(
        trace,
        ProfileTables(profile),
        config=SimConfig(startup_s=args.startup_s),
        initial_prefill=connector_cfg.initial_prefill_replicas,
        initial_decode=connector_cfg.initial_decode_replicas,
    )
    environment = LocalConnector(connector_cfg)
    history = _History(interval_s=interval_s, arrival_s=trace.arrival_s)
    # The frontend's length histograms over the collect step's window (metrics.length_window_s).
    lengths = LengthWindow(trace.isl_tokens, trace.osl_tokens, interval_s=interval_s,
                           window_intervals=max(1, round(cfg.metrics.length_window_s / interval_s)))
    # ... and its TTFT and ITL histograms over the SLO window (metrics.slo_window_s).
    slo_window = SloWindow(interval_s=interval_s, window_intervals=max(1, round(cfg.metrics.slo_window_s / interval_s)))

    print(
        f"replaying {trace_name} x{args.load_multiplier:g} ({load_model(args.load_multiplier, args.jitter_s)}; "
        f"{len(trace.arrival_s)} requests) "
        f"through {profile.name}; SLA TTFT {cfg.planner.slo.ttft_ms:g} ms, ITL {cfg.planner.slo.itl_ms:g} ms; "
        f"interval {interval_s:g} s" + (f"; state in {state_dir}" if args.state_dir else ""),
        flush=True,
    )
    with prefect_api("plan", verbose=args.verbose, debug=args.debug):
        from flows.config import ReplayInputs
        from flows.planner_flow import planner_flow

        print(f"{'t':>6}  {'req':>6}  {'forecast':>8}  {'prefill':>9}  {'decode':>9}  reasons", flush=True)
        for i in range(1, args.intervals + 1):
            t = i * interval_s
            sim.run_until(t)
            stats = sim.take_interval_stats()
            history.add(t, stats)
            obs = interval_observation(
                stats, taken_at_s=t, interval_s=interval_s, history=history.series(), pods=sim.pod_metrics(t)
            )
            lengths.add_interval(sim.next_arrival)
            isl_histogram, osl_histogram = lengths.histograms()
            obs = dataclasses.replace(obs, isl_histogram=isl_histogram, osl_histogram=osl_histogram,
                                      slo_window=slo_window.add_interval(stats), peak_rps=history.peak[-1],
                                      peak_window_s=history.peaks.peak_window_s)
            out = planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=t))
            # The "deployment environment": the simulator follows the targets the planner wrote.
            fleet = environment.read_fleet(now_s=t)
            sim.set_target("prefill", fleet.prefill.current_replicas, t)
            sim.set_target("decode", fleet.decode.current_replicas, t)
            print(_line(t, obs.num_requests, out), flush=True)
    sim.run_until(args.intervals * interval_s + 600)
    _print_outcome(sim, cfg.planner.slo, until_s=args.intervals * interval_s)
    return 0


class _History:
    """The load series a Prometheus range query would return, built as the replay goes."""

    def __init__(self, *, interval_s: float, arrival_s):
        import numpy as np

        from sim.replay import ReplaySettings

        self.interval_s = interval_s
        self.arrival_s = np.asarray(arrival_s, dtype=float)
        # The frontend's peak 15 s arrival rate per interval, as the collect step's peak query reads it.
        self.peaks = ReplaySettings(interval_s=interval_s)
        self.peak: list[float] = []
        self.t_s: list[float] = []
        self.n: list[float] = []
        self.isl: list[float] = []
        self.osl: list[float] = []

    def add(self, t_s: float, stats) -> None:
        self.t_s.append(t_s)
        self.n.append(float(stats.arrivals))
        self.isl.append(stats.isl_sum / stats.arrivals if stats.arrivals else math.nan)
        self.osl.append(stats.osl_sum / stats.completions if stats.completions else math.nan)
        from sim.replay import peak_rate_rps

        self.peak.append(peak_rate_rps(self.arrival_s, end_s=t_s, scenario=self.peaks))

    def series(self):
        from planner.types import LoadHistory

        return LoadHistory(
            t_s=tuple(self.t_s),
            num_requests=tuple(self.n),
            avg_isl_tokens=tuple(self.isl),
            avg_osl_tokens=tuple(self.osl),
            interval_s=self.interval_s,
            peak_rps=tuple(self.peak),
            peak_window_s=self.peaks.peak_window_s,
        )


def _line(t: float, requests: float | None, out: dict) -> str:
    d, cur = out["decision"], out["current"]
    fc = out["forecast"]
    forecast = "n/a"
    if fc is not None:
        # The count sizing used: the mean while arrivals look independent, else the upper quantile.
        forecast = f"{fc['num_requests']:.0f}" if fc["sized_on"] == "mean" else f"{fc['num_requests_p90']:.0f}"
    # Each reason once, with the pools it applies to: "sla_sizing, scale_up" rather than every code per pool.
    pools: dict[str, list[str]] = {}
    for r in d["reasons"]:
        pools.setdefault(r["code"], [])
        if r.get("pool") and r["pool"] not in pools[r["code"]]:
            pools[r["code"]].append(r["pool"])
    codes = ", ".join(code if len(p) != 1 else f"{code} ({p[0]})" for code, p in pools.items())
    return (
        f"{t:>6.0f}  {requests or 0:>6.0f}  {forecast:>8}  "
        f"{cur['prefill']:>3} -> {d['prefill_replicas']:<3}  {cur['decode']:>3} -> {d['decode_replicas']:<3}  {codes}"
    )


def _print_outcome(sim, slo, *, until_s: float) -> None:
    import numpy as np

    res = sim.results()
    mask = res.arrival_s < until_s
    met = res.sla_met(ttft_ms=slo.ttft_ms, itl_ms=slo.itl_ms)[mask]
    ttft = res.ttft_ms[mask]
    gpu_h = sum(sim.gpu_seconds(until_s).values()) / 3600
    print(
        f"\n{int(mask.sum())} requests: {100 * met.mean():.1f}% met both SLAs; "
        f"TTFT p50 {np.nanpercentile(ttft, 50):.0f} ms, p99 {np.nanpercentile(ttft, 99):.0f} ms; "
        f"{gpu_h:.2f} GPU-hours"
    )

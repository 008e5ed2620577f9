"""`sla-planner what-if`: replay a trace through a simulated fleet under a scaling policy.

The trace format is detected from the content (Azure CSV, Mooncake JSONL, plain or
gzip; ServeGen .tar.gz archives are synthesised into a request stream). Prints the
headline figures; --json writes them (requests, slo_attainment, ttft_ms and itl_ms
p50/p90/p99, gpu_hours, oracle_gpu_hours, scale_events, wall_s, ...).

Policies: planner, planner:<predictor>, dynamo, saturation, static:<P>x<D>, oracle
(and dynamo-peer when NVIDIA Dynamo's planner package is installed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner_cli.command import command_parser


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "what-if", doc=__doc__,
                       help="replay a trace through a simulated fleet under a policy (SLA attainment, GPU-hours)")
    p.add_argument("--trace", required=True, help="trace file (Azure CSV, Mooncake JSONL, ServeGen .tar.gz)")
    p.add_argument("--profile", required=True, help="profiler output folder (selected_*_interpolation/raw_data.npz)")
    p.add_argument("--ttft-ms", type=float, required=True, help="TTFT target, ms")
    p.add_argument("--itl-ms", type=float, required=True, help="ITL target, ms")
    p.add_argument("--policy", default="planner", help="scaling policy (default: %(default)s)")
    p.add_argument("--startup-s", type=float, default=60.0, help="worker startup delay, s (default: %(default)s)")
    p.add_argument("--interval-s", type=float, default=60.0, help="adjustment interval, s (default: %(default)s)")
    p.add_argument("--load-multiplier", type=float, default=1.0,
                   help="superpose this many copies of the trace, each a tenant (default: %(default)s)")
    p.add_argument("--jitter-s", type=float, default=30.0,
                   help="shift each copied request by up to +- this many seconds: 30 models independent tenants, "
                        "1 synchronised copies, a stress case (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for load multiplication and synthesis (default: 0)")
    p.add_argument("--router", default="least-loaded", choices=["least-loaded", "round-robin", "picker"],
                   help="request router (default: %(default)s)")
    p.add_argument("--with-oracle", action="store_true", help="also compute the oracle's GPU-hours (slower)")
    p.add_argument("--skip-malformed", action="store_true", help="skip malformed trace lines instead of failing")
    p.add_argument("--max-replicas", type=int, default=16, help="most workers per pool (default: %(default)s)")
    p.add_argument("--servegen-start-s", type=float, default=86_400.0,
                   help="ServeGen: offset into the archive, s (default: %(default)s)")
    p.add_argument("--servegen-duration-s", type=float, default=3_600.0,
                   help="ServeGen: duration to synthesise, s (default: %(default)s)")
    p.add_argument("--servegen-rate-scale", type=float, default=0.005,
                   help="ServeGen: multiply every client's rate (default: %(default)s)")
    p.add_argument("--latency-model", default=None, metavar="FILE",
                   help="a published latency-model document (JSON): the planner takes prefill TTFT from it "
                   "instead of the profile")
    p.add_argument("--warmup-trace", default=None, metavar="FILE",
                   help="planner policies: seed the load predictor with this trace's load while the replay's own "
                   "history is short (predictor.warmup_trace_path; Dynamo's --load-predictor-warmup-trace)")
    p.add_argument("--lead-in", default=None, metavar="FILE",
                   help="a trace of the time before this one, replayed through the fleet and the policy first and "
                   "not scored: a planner started against a running fleet (multiplied as the trace)")
    p.add_argument("--recurrence-hold-s", type=float, default=None, metavar="S",
                   help="planner policies: turn on the recurrence hold with this window, s "
                   "(decision.independent_stabilization_s; docs/control.md)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                   help="planner policies: set a planner configuration field by its dotted name, e.g. "
                   "decision.scale_down_stabilization_s=420 (repeatable; a JSON value, else the text)")
    p.add_argument("--engine-model", default="profile", choices=["profile", "dynamo_mocker"],
                   help="how simulated engines are timed: the profile's curves, or as Dynamo 1.6.1's mocker times "
                   "them (default: %(default)s)")
    p.add_argument("--json", dest="json_out", default=None, help="write the summary JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _scenario(args: argparse.Namespace):
    from sim.whatif.scenario import WhatIfScenario

    return WhatIfScenario(
        trace=args.trace,
        profile_dir=args.profile,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        policy=args.policy,
        startup_s=args.startup_s,
        interval_s=args.interval_s,
        load_multiplier=args.load_multiplier,
        jitter_s=args.jitter_s,
        seed=args.seed,
        router=args.router,
        with_oracle=args.with_oracle,
        skip_malformed=args.skip_malformed,
        servegen_start_s=args.servegen_start_s,
        servegen_duration_s=args.servegen_duration_s,
        servegen_rate_scale=args.servegen_rate_scale,
        max_replicas=args.max_replicas,
        latency_model_path=args.latency_model,
        warmup_trace_path=args.warmup_trace,
        lead_in_trace_path=args.lead_in,
        recurrence_hold_s=args.recurrence_hold_s,
        planner_settings=planner_settings(args.settings),
        engine_model=args.engine_model,
    )


def planner_settings(items: list[str]) -> dict:
    """--set FIELD=VALUE arguments as {field: value}: the value parsed as JSON (numbers, true, null, quoted
    text), else kept as text."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE, e.g. decision.scale_down_stabilization_s=420")
        try:
            out[key.strip()] = json.loads(text)
        except ValueError:
            out[key.strip()] = text
    return out


def _print_summary(s: dict) -> None:
    from sim.whatif.report import floor_words

    def p(d):
        return " / ".join("n/a" if d[k] is None else f"{d[k]:.1f}" for k in ("p50", "p90", "p99"))

    print(f"trace            {s['trace']} ({s['requests']:,} requests)")
    print(f"load             {s.get('load_model') or 'the trace as recorded'}")
    warm = f"; predictor warmed from {s['warmup_trace_path']}" if s.get("warmup_trace_path") else ""
    warm += f"; {floor_words(s['warmup_floor'])}" if s.get("warmup_floor") else ""
    warm += f"; started after {s['lead_in_trace_path']}" if s.get("lead_in_trace_path") else ""
    warm += f"; recurrence hold {s['recurrence_hold_s']:g} s" if s.get("recurrence_hold_s") else ""
    warm += "".join(f"; {k} = {v}" for k, v in (s.get("planner_settings") or {}).items())
    print(f"policy           {s['policy']} (prefill TTFT from {s['ttft_source']}{warm})")
    print(f"engines          timed as {'the profile' if s['engine_model'] == 'profile' else 'Dynamo 1.6.1 mocker'}")
    print(f"SLA attainment   {100 * s['slo_attainment']:.2f}% "
          f"(TTFT {100 * s['ttft_attainment']:.2f}%, ITL {100 * s['itl_attainment']:.2f}%)")
    print(f"TTFT ms          p50/p90/p99 {p(s['ttft_ms'])}")
    print(f"ITL ms           p50/p90/p99 {p(s['itl_ms'])}")
    print(f"GPU-hours        {s['gpu_hours']:.2f}"
          + ("" if s["oracle_gpu_hours"] is None else f" (oracle {s['oracle_gpu_hours']:.2f})"))
    print(f"scale events     {s['scale_events']}")
    print(f"wall             {s['wall_s']:.1f} s")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from planner.config import format_validation_error
    from sim.whatif.scenario import load_scenario_trace, planner_config, run_what_if

    try:
        sc = _scenario(args)
    except ValidationError as exc:
        print(format_validation_error(exc, source="sla-planner what-if"), file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"sla-planner what-if: {exc}", file=sys.stderr)
        return 2
    try:
        planner_config(sc)  # a bad --set fails before the trace is read
        trace = load_scenario_trace(sc)
    except (ValueError, OSError) as exc:
        print(f"sla-planner what-if: {exc}", file=sys.stderr)
        return 2
    bars: dict = {}
    progress = oracle_progress = None
    if not args.no_progress:
        from tqdm import tqdm

        def open_oracle_bar():
            # The oracle replays the trace once per sweep step and verify round, each about as long
            # as the policy's replay: one tick per replay, the step it finished as the postfix.
            bars["oracle"] = tqdm(unit="replay", desc="oracle", file=sys.stderr, dynamic_ncols=True,
                                  bar_format="{desc}: {n} replays [{elapsed}]{postfix}")
            bars["oracle"].refresh()

        def oracle_progress(step: str) -> None:
            if "oracle" not in bars:
                open_oracle_bar()
            bars["oracle"].set_postfix_str(step.removeprefix("oracle "), refresh=False)
            bars["oracle"].update(1)

        if sc.policy == "oracle":
            open_oracle_bar()
        else:
            bars["policy"] = tqdm(total=len(trace), unit="req", desc=f"{sc.policy}", file=sys.stderr,
                                  dynamic_ncols=True)

            def progress(done: int, total: int) -> None:
                bars["policy"].update(done - bars["policy"].n)
                if done >= total and sc.with_oracle and "oracle" not in bars:
                    open_oracle_bar()  # every request has arrived: the oracle starts after the drain

        if not (sc.policy == "oracle" or sc.with_oracle):
            oracle_progress = None

    try:
        summary, _ = run_what_if(sc, trace=trace, progress=progress, oracle_progress=oracle_progress)
    except ValueError as exc:
        for bar in bars.values():  # each bar ends its line where it stopped: the error is a line of its own
            bar.close()
        print(f"sla-planner what-if: {exc}", file=sys.stderr)
        return 2
    finally:
        for bar in bars.values():
            bar.close()
    if trace.skipped_lines:
        print(f"skipped {trace.skipped_lines} malformed lines: {'; '.join(trace.skipped_examples)}", file=sys.stderr)
    _print_summary(summary)
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {out}")
    return 0

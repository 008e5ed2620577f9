"""Control-plane throughput: one Prefect server planning N deployments every 60 s.

A real Prefect server (`prefect server start`, SQLite in a temporary PREFECT_HOME, or
PostgreSQL with `--prefect-db postgres`: Debian's binaries, started as the local stack
starts them) and a real Prometheus (Debian `prometheus`) holding synthetic Dynamo
frontend series for N deployments: the Azure 2023 conversation trace binned to 60 s,
each deployment a copy shifted by a different number of minutes (independent tenants,
x1 each), one prefill and one decode pod's KV and queue gauges, backfilled with
promtool; every run reads it at the same given clock. Connectors are local (one JSON
state file per deployment), so nothing outside this machine is needed.

Shapes (`--shape`):
- runs: today's planner flow, one flow run per deployment, run back to back by one
  process (what a process worker would do minus its per-run process start, measured
  apart as `worker_process_start_s`);
- fleet: the fleet flow, one flow run deciding every deployment, then arbitration,
  then one subflow run per deployment applying and explaining its decision.

For each N, two rounds one interval apart: the first cold (no fitted predictor state, every
fleet at 1 + 1; its wall time is reported), the second measured, as every scheduled round after
the first: decisions per minute (N / round wall time x 60; a round under 60 s keeps up), per-decision latency p50/p95 (runs: each flow run's wall time; fleet: each
deployment's decide task through its subflow's end, from the server's records), the
server's CPU seconds over the round, and where the time goes (cProfile of the
planning process for one round at `--profile-n`, time inside named functions).

Writes benchmarks/results/control_plane[_<shape>][_<db>].json and prints a markdown table.
Run: nice -n 10 .venv/bin/python benchmarks/bench_control_plane.py --shape runs [--n 1,10,50,100,200]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
RESULTS = ROOT / "benchmarks" / "results"
INTERVAL_S = 60.0
HISTORY_INTERVALS = 50  # backfilled per deployment; the run reads at its end
SCRAPE_S = 30.0
# A fixed, 2 h-aligned start, so the series never depend on the wall clock (2023-11-15T00:00:00Z).
ANCHOR_S = 1_700_006_400.0
NOW_S = ANCHOR_S + HISTORY_INTERVALS * INTERVAL_S
# Where the time goes: (module file, function): that function's cumulative time; function None: the module's, counted once.
BUCKETS = {
    "prometheus queries": ("prometheus.py", "collect"),
    "chart PNG": ("charts.py", None),
    "planner core (plan_steps)": ("pipeline.py", None),
    "profile load": ("profiles.py", None),
    "artifacts": ("artifacts.py", None),
    "run rename": (None, "_rename_run"),
    "apply (local connector)": ("local.py", "apply"),
    "decision table and summary": ("report.py", None),
    "decide step (whole, fleet)": ("fleet.py", "plan_deployment"),
    "deployment run (whole, fleet)": ("fleet_flow.py", "deployment_run"),
    "HTTP to the Prefect server and Prometheus": ("_client.py", "send"),
}


def load_histories(n: int):
    """Per deployment, the trace's 60-s bins rotated by 7*i minutes (independent tenants)."""
    from workloads.traces import bin_trace, load_trace

    base = bin_trace(load_trace(TRACE), bin_s=INTERVAL_S)
    k = len(base.num_requests)
    out = []
    for i in range(n):
        shift = (7 * i) % k
        rot = lambda xs: list(xs[shift:]) + list(xs[:shift])  # noqa: E731
        out.append((rot(base.num_requests), rot(base.avg_isl_tokens), rot(base.avg_osl_tokens)))
    return out


def backfill(prometheus, n: int) -> None:
    """N deployments' frontend series (namespace label dep-<i>) and two pods' gauges each."""
    import math

    from tests.support.fixtures_prometheus import FrontendInterval, OpenMetricsWriter, write_frontend_intervals, \
        write_gauge

    w = OpenMetricsWriter()
    start_s = ANCHOR_S
    every = [start_s + SCRAPE_S * j for j in range(int(HISTORY_INTERVALS * INTERVAL_S / SCRAPE_S) + 1)]
    for i, (reqs, isl, osl) in enumerate(load_histories(n)):
        labels = {"namespace": f"dep-{i}"}
        intervals = []
        for j in range(HISTORY_INTERVALS):  # the first round reads at the end of interval HISTORY_INTERVALS - 1
            r, a, b = reqs[j % len(reqs)], isl[j % len(isl)], osl[j % len(osl)]
            intervals.append(FrontendInterval(float(r), 0.08, 0.006, 1000.0 if math.isnan(a) else float(a),
                                              150.0 if math.isnan(b) else float(b)))
        write_frontend_intervals(w, labels=labels, start_s=start_s, interval_s=INTERVAL_S, intervals=intervals,
                                 scrape_s=SCRAPE_S)
        for pool in ("prefill", "decode"):
            pod = {**labels, "pod": f"worker-{pool}-0"}
            write_gauge(w, name="vllm:kv_cache_usage_perc", labels=pod, points=[(t, 0.3) for t in every])
            write_gauge(w, name="vllm:num_requests_waiting", labels=pod, points=[(t, 0.0) for t in every])
    prometheus.backfill(w.render())


def run_configs(n: int, *, prometheus_url: str, state_dir: Path) -> list:
    """One planner run configuration per deployment: its namespace's series, its own local fleet file."""
    from connectors.config import LocalConnectorConfig, MetricsConfig
    from flows.config import PlannerRunConfig
    from planner.config import PlannerConfig, PredictorConfig, ProfileConfig

    out = []
    for i in range(n):
        ns = f"dep-{i}"
        selector = f'namespace="{ns}"'
        out.append(PlannerRunConfig(
            planner=PlannerConfig(namespace=ns, model_id=f"model-{i}", profile=ProfileConfig(dir=str(PROFILE)),
                                  adjustment_interval_s=INTERVAL_S,
                                  predictor=PredictorConfig(cache_dir=str(state_dir / "predictor-cache"))),
            metrics=MetricsConfig(prometheus_url=prometheus_url, frontend_selector=selector,
                                  worker_selector=selector, frontend_targets_selector=""),
            connector=LocalConnectorConfig(state_path=str(state_dir / f"{ns}.json"),
                                           initial_prefill_replicas=1, initial_decode_replicas=1),
        ))
    return out


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children, those it has reaped included (PostgreSQL's
    backends come and go: summing the live ones alone loses an exited backend's time)."""
    import psutil

    proc = psutil.Process(pid)
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


class PrefectServer:
    """`prefect server start` on a free port, SQLite in base_dir or the given database URL."""

    def __init__(self, base_dir: Path, *, database_url: str | None):
        from tests.support.fixtures_net import free_port

        self.base_dir = base_dir
        self.port = free_port()
        self.env = {**os.environ, "PREFECT_HOME": str(base_dir / "prefect-home"), "DO_NOT_TRACK": "1",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
        if database_url:
            self.env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
        self.proc: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        from tests.support.fixtures_net import wait_http_ok

        log = (self.base_dir / "prefect-server.log").open("ab")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("prefect")), "server", "start", "--host", "127.0.0.1",
             "--port", str(self.port)], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        wait_http_ok(f"{self.api_url}/health", timeout_s=180, proc=self.proc,
                     log_path=self.base_dir / "prefect-server.log", what="prefect server")

    def cpu_s(self) -> float:
        return process_tree_cpu_s(self.proc.pid)

    def stop(self) -> None:
        from tests.support.fixtures_net import stop_process

        if self.proc is not None:
            stop_process(self.proc, timeout_s=30.0)
            self.proc = None


def plan_round(shape: str, configs: list, fleet_path: Path | None, *, now_s: float = NOW_S,
               deployment_runs: str = "task") -> tuple[float, list[float], dict]:
    """Plan every deployment once at now_s; (wall s, per-decision latencies s, what the round returned)."""
    from flows.config import ReplayInputs

    if shape == "runs":
        from flows.planner_flow import planner_flow

        latencies = []
        t0 = time.perf_counter()
        for cfg in configs:
            t1 = time.perf_counter()
            planner_flow(config=cfg, replay=ReplayInputs(now_s=now_s))
            latencies.append(time.perf_counter() - t1)
        return time.perf_counter() - t0, latencies, {}
    from flows.fleet_flow import fleet_flow

    t0 = time.perf_counter()
    out = fleet_flow(fleet_path=str(fleet_path), now_s=now_s, deployment_runs=deployment_runs)
    wall = time.perf_counter() - t0
    return wall, [d["latency_s"] for d in out["deployments"]], out


def write_fleet_file(configs: list, state_dir: Path) -> Path:
    """The deployments' run configurations as files and a fleet file (flows.fleet_config) listing them, with a
    budget none of them can reach (every deployment at its max_replicas), so the arbitration cuts nothing."""
    import yaml

    deployments, most = [], 0
    for cfg in configs:
        p = state_dir / f"{cfg.planner.namespace}.yaml"
        p.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True), sort_keys=False))
        deployments.append({"name": cfg.planner.namespace, "priority": 1, "config": p.name})
        most += cfg.planner.decision.prefill.max_replicas + cfg.planner.decision.decode.max_replicas
    path = state_dir / "fleet.yaml"
    path.write_text(yaml.safe_dump({"budget": {"gpus": most}, "deployments": deployments}, sort_keys=False))
    return path


def profile_round(shape: str, configs: list, fleet_path: Path | None) -> dict:
    """One round under cProfile, in every thread (the fleet flow decides and explains in thread pools): seconds
    inside each bucket of BUCKETS, summed over threads (wall time, waits included), and the round's wall time."""
    import threading

    profiles = []

    def start_thread_profile(frame, event, arg):
        sys.setprofile(None)
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(start_thread_profile)
    t0 = time.perf_counter()
    main.enable()
    try:
        plan_round(shape, configs, fleet_path)
    finally:
        main.disable()
        threading.setprofile(None)
    wall = time.perf_counter() - t0
    stats = pstats.Stats(main)
    for prof in profiles[1:]:
        prof.create_stats()
        if prof.stats:
            stats.add(prof)
    out = {}
    for bucket, (file_name, fn) in BUCKETS.items():
        if fn is None:
            out[bucket] = round(_file_cumulative(stats, file_name), 3)
            continue
        # The outermost frame of that function: its largest cumulative time.
        out[bucket] = round(max((ct for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
                                 if name == fn and (file_name is None or Path(file).name == file_name)),
                                default=0.0), 3)
    out["round_wall_s (under cProfile)"] = round(wall, 3)
    return out


def _file_cumulative(stats: pstats.Stats, file_name: str) -> float:
    """Time inside a module's functions, counted once: the cumulative time of its functions that no
    other function of the same module called."""
    total = 0.0
    for (file, _line, _fn), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
        if Path(file).name != file_name:
            continue
        if any(Path(c[0]).name == file_name for c in callers):
            continue
        total += ct
    return total


def worker_process_start_s() -> float:
    """What a process worker pays per flow run before the flow starts: a Python process importing the flow."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import flows.planner_flow"], cwd=ROOT, check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("runs", "fleet"), default="fleet")
    parser.add_argument("--n", default="1,10,50,100,200", help="deployment counts, comma-separated")
    parser.add_argument("--prefect-db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--deployment-runs", choices=("task", "subflow"), default="task",
                        help="fleet: each deployment's apply-and-explain as a task run or a subflow run")
    parser.add_argument("--profile-n", type=int, default=10, help="N of the cProfile round (0: none)")
    parser.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/control_plane_<shape>_<db>.json)")
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.n.split(",")]
    base = Path(tempfile.mkdtemp(prefix="bench-control-plane-"))
    base.chmod(0o711)  # PostgreSQL runs as its own user (as root: postgres), which must reach its folder
    load_before = os.getloadavg()

    from tests.support.fixtures_prometheus import PrometheusServer

    prometheus = PrometheusServer(base_dir=base / "prometheus")
    postgres = None
    database_url = None
    if args.prefect_db == "postgres":
        from planner_cli.stack_postgres import PostgresServer

        postgres = PostgresServer(base / "postgres")
        postgres.start()
        database_url = postgres.database_url
    server = PrefectServer(base, database_url=database_url)
    rows = []
    try:
        t0 = time.perf_counter()
        backfill(prometheus, max(ns))
        prometheus.start(timeout_s=120)
        server.start()
        setup_s = time.perf_counter() - t0
        os.environ.update({"PREFECT_API_URL": server.api_url, "PREFECT_HOME": server.env["PREFECT_HOME"],
                           "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "WARNING",
                           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        warm = run_configs(1, prometheus_url=prometheus.url, state_dir=base / "warm")
        (base / "warm").mkdir()
        plan_round(args.shape, warm, write_fleet_file(warm, base / "warm")
                   if args.shape == "fleet" else None)  # imports, first API calls
        for n in ns:
            state = base / f"n{n}"
            state.mkdir()
            configs = run_configs(n, prometheus_url=prometheus.url, state_dir=state)
            fleet_path = write_fleet_file(configs, state) if args.shape == "fleet" else None
            # The first round starts cold (no fitted predictor state, every fleet at 1 + 1); the measured one is
            # the next interval's, as every scheduled round after the first.
            cold_wall, _, _ = plan_round(args.shape, configs, fleet_path, now_s=NOW_S - INTERVAL_S,
                                         deployment_runs=args.deployment_runs)
            cpu0, load0 = server.cpu_s(), os.getloadavg()[0]
            db0 = process_tree_cpu_s(postgres.proc.pid) if postgres is not None else None
            wall, lat, out = plan_round(args.shape, configs, fleet_path, deployment_runs=args.deployment_runs)
            cpu1 = server.cpu_s()
            db1 = process_tree_cpu_s(postgres.proc.pid) if postgres is not None else None
            lat_sorted = sorted(lat)
            phases = out.get("phases_s") if out else None
            row = {
                "n": n, "round_wall_s": round(wall, 2), "first_round_wall_s": round(cold_wall, 2),
                "decisions_per_min": round(60.0 * n / wall, 1),
                "keeps_up_at_60s": wall <= INTERVAL_S,
                "latency_p50_s": round(statistics.median(lat_sorted), 3),
                "latency_p95_s": round(lat_sorted[min(len(lat_sorted) - 1, int(0.95 * len(lat_sorted)))], 3),
                "server_cpu_s": round(cpu1 - cpu0, 1),
                "server_cpu_frac_of_round": round((cpu1 - cpu0) / wall, 2),
                "load_average_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }
            if phases:
                row["phases_s"] = phases
            if db0 is not None:
                row["postgres_cpu_s"] = round(db1 - db0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
        breakdown = None
        if args.profile_n:
            state = base / "profile"
            state.mkdir()
            configs = run_configs(args.profile_n, prometheus_url=prometheus.url, state_dir=state)
            fleet_path = write_fleet_file(configs, state) if args.shape == "fleet" else None
            plan_round(args.shape, configs, fleet_path, now_s=NOW_S - INTERVAL_S)
            breakdown = profile_round(args.shape, configs, fleet_path)
            print(json.dumps({"where_the_time_goes": breakdown}), flush=True)
    finally:
        server.stop()
        prometheus.stop()
        if postgres is not None:
            postgres.stop()

    result = {
        "what": f"one Prefect server ({args.prefect_db}) planning N deployments once (shape {args.shape}), "
                "reading a real Prometheus (synthetic frontend series: Azure 2023 conversation trace, x1 per "
                "deployment, copies shifted by 7 min: independent tenants), local connectors",
        "shape": args.shape,
        "deployment_runs": args.deployment_runs if args.shape == "fleet" else None,
        "prefect_db": args.prefect_db,
        "rows": rows,
        "where_the_time_goes_s": breakdown,
        "profile_n": args.profile_n,
        "worker_process_start_s": round(worker_process_start_s(), 2),
        "setup_s": round(setup_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_start": [round(x, 2) for x in load_before],
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out) if args.out else RESULTS / f"control_plane_{args.shape}_{args.prefect_db}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = ["| N | round s | decisions/min | keeps up (60 s) | p50 s | p95 s | server CPU s | load 1m |",
             "|---:|---:|---:|:---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['n']} | {r['round_wall_s']} | {r['decisions_per_min']} | "
                     f"{'yes' if r['keeps_up_at_60s'] else 'no'} | {r['latency_p50_s']} | {r['latency_p95_s']} | "
                     f"{r['server_cpu_s']} | {r['load_average_1m'][0]}-{r['load_average_1m'][1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

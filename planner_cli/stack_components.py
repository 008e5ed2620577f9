"""What each process of the stack runs: its command line, environment, generated configuration files.

The options of `sla-planner stack up` decide them; every generated file is written to
the state folder, pointed at the stack's own services.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path

from planner_cli.stack_processes import DATA_TOKEN_ENV, PROJECT_ROOT, TOKEN_ENV, Component, StackError

DEFAULT_STATE_DIR = PROJECT_ROOT / ".stack"
DEFAULT_TRACE = PROJECT_ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
DEFAULT_PROFILE = PROJECT_ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
DEFAULT_PLANNER_CONFIG = PROJECT_ROOT / "configs" / "planner.yaml"
ROUTER_TEMPLATE = PROJECT_ROOT / "stack" / "routing.yaml"
STACK_DEPLOYMENTS = ("planner", "retrain", "what-if")  # prefect.yaml's process work-pool deployments
ETCD_BIN = "/usr/bin/etcd"
PROMETHEUS_BIN = "/usr/bin/prometheus"
PUSHGATEWAY_BIN = "/usr/bin/prometheus-pushgateway"
PROMETHEUS_RULES = PROJECT_ROOT / "stack" / "prometheus-rules.yml"
# Start order; `down` stops them all at once.
COMPONENTS = ("prefect-server", "etcd", "router", "fleet", "pushgateway", "prometheus", "prefect-worker")
FLEETS = ("sim", "dynamo", "vllm")
PREFECT_DBS = ("sqlite", "postgres")  # the Prefect server's database (postgres: planner_cli.stack_postgres)
# Flow runs send a heartbeat this often (Prefect's minimum is 30 s): the stack's zombie-run
# automation marks a run silent for longer Crashed.
HEARTBEAT_S = 30


@dataclass(frozen=True)
class StackOptions:
    """What `stack up` starts. Times in seconds; the interval is wall-clock."""

    state_dir: str = str(DEFAULT_STATE_DIR)
    interval_s: float = 30.0
    planner_config: str = str(DEFAULT_PLANNER_CONFIG)
    stabilization_s: float | None = None
    retrain_interval_s: float = 300.0
    trace: str = str(DEFAULT_TRACE)
    trace_start_s: float = 0.0
    trace_duration_s: float | None = None
    shape: tuple[tuple[float, float], ...] | None = None  # (duration_s, load multiplier) windows
    load_multiplier: float = 6.0
    jitter_s: float = 30.0  # copies shifted by up to ± this: independent tenants (1: synchronised, a stress case)
    time_scale: float = 1.0
    speed: float = 1.0
    startup_s: float = 20.0
    prefill_latency_scale: float = 1.0
    decode_latency_scale: float = 1.0
    scrape_interval_s: float = 2.0
    prefect_port: int = 4200
    prometheus_port: int = 9090
    pushgateway_port: int = 9091  # the planner runs' gauges (each run is a short-lived process)
    etcd_port: int = 2379
    etcd_peer_port: int = 2380
    router_port: int = 8080
    fleet_port: int = 8090
    start_timeout_s: float = 180.0
    fleet: str = "sim"  # sim | dynamo | vllm (FLEETS)
    frontend_port: int = 8000
    worker_port_base: int = 21300  # Dynamo worker k of a role serves metrics here (+100 for decode) + k; < 32768
    mocker_speedup: float = 1.0  # Dynamo mocker: times faster than the profiled engine
    max_workers: int = 6  # --fleet dynamo: most mocker workers per pool (each is a process on this machine)
    vllm_model_config: str = ""  # --fleet vllm: the tiny model's config.json ("": the llm-d kit's beside the project)
    vllm_max_num_seqs: int = 2  # --fleet vllm: requests an engine runs at once (the rest wait in its queue)
    max_in_flight: int | None = None  # --fleet dynamo|vllm: the load generator's requests outstanding (None: no cap)
    prefect_db: str = "sqlite"  # sqlite (in PREFECT_HOME) | postgres (a cluster in the state folder)
    postgres_port: int = 0  # --prefect-db postgres: its port on 127.0.0.1 (0: a free one, chosen by `up`)

    def __post_init__(self) -> None:
        if self.fleet not in FLEETS:
            raise ValueError(f"fleet: expected one of {', '.join(FLEETS)}, got {self.fleet!r}")
        if self.prefect_db not in PREFECT_DBS:
            raise ValueError(f"prefect_db: expected one of {', '.join(PREFECT_DBS)}, got {self.prefect_db!r}")

    def urls(self) -> dict[str, str]:
        return {
            "prefect_ui": f"http://127.0.0.1:{self.prefect_port}",
            "prefect_api": f"http://127.0.0.1:{self.prefect_port}/api",
            "prometheus": f"http://127.0.0.1:{self.prometheus_port}",
            "pushgateway": f"http://127.0.0.1:{self.pushgateway_port}",
            "etcd": f"http://127.0.0.1:{self.etcd_port}",
            "router": f"http://127.0.0.1:{self.router_port}",
            "fleet": f"http://127.0.0.1:{self.fleet_port}",
            "frontend": f"http://127.0.0.1:{self.frontend_port}",
        }

    @classmethod
    def from_dict(cls, data: dict) -> "StackOptions":
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if data.get("shape") is not None:
            data["shape"] = tuple(tuple(s) for s in data["shape"])
        return cls(**data)


def component_names(fleet: str, prefect_db: str = "sqlite") -> tuple[str, ...]:
    database = ("postgres",) if prefect_db == "postgres" else ()
    if fleet == "sim":
        return database + COMPONENTS
    from planner_cli.stack_dynamo import COMPONENTS as DYNAMO
    from planner_cli.stack_vllm import COMPONENTS as VLLM

    return database + tuple(n for n in COMPONENTS if n != "fleet") + (DYNAMO if fleet == "dynamo" else VLLM)


def check_binaries() -> None:
    missing = [b for b in (ETCD_BIN, PROMETHEUS_BIN, PUSHGATEWAY_BIN) if not Path(b).is_file()]
    if missing:
        raise StackError(f"not installed: {', '.join(missing)} (run scripts/setup.sh: Debian prometheus, "
                         "prometheus-pushgateway, etcd-server)")


# -- configuration files ------------------------------------------------------------


def write_planner_config(opts: StackOptions, state_dir: Path):
    """The planner config of this stack: the user's file, pointed at the stack's services."""
    import yaml

    from flows.config import load_run_config

    source = load_run_config(opts.planner_config)  # validates and makes the profile path absolute
    data = source.model_dump(mode="json", exclude_none=True)
    data["planner"]["adjustment_interval_s"] = opts.interval_s
    if opts.stabilization_s is not None:
        # A time-compressed stack holds a scale-down this long: the stabilization window, and the scale-down floor's
        # window no longer (an hour's floor would hold a few minutes' demo at its peak throughout).
        decision = data["planner"]["decision"]
        decision["scale_down_stabilization_s"] = opts.stabilization_s
        if decision.get("scale_down_floor_s"):
            decision["scale_down_floor_s"] = min(decision["scale_down_floor_s"], opts.stabilization_s)
    data.setdefault("metrics", {})["prometheus_url"] = opts.urls()["prometheus"]
    data["planner_metrics"] = {"enabled": True, "pushgateway_url": opts.urls()["pushgateway"]}
    data["connector"] = {"kind": "virtual", "etcd_url": opts.urls()["etcd"]}
    if opts.fleet == "dynamo":
        from planner_cli.stack_dynamo import planner_overrides

        planner_overrides(data, namespace=data["planner"]["namespace"], max_workers=opts.max_workers)
    elif opts.fleet == "vllm":
        from planner_cli import stack_vllm

        stack_vllm.planner_overrides(data, namespace=data["planner"]["namespace"], max_workers=opts.max_workers)
    path = state_dir / "planner.yaml"
    path.write_text("# Generated by `sla-planner stack up` from " + opts.planner_config + "\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return load_run_config(path)


def write_router_config(opts: StackOptions, state_dir: Path) -> Path:
    import yaml

    data = yaml.safe_load(ROUTER_TEMPLATE.read_text()) or {}
    data["profile_dir"] = str(DEFAULT_PROFILE)
    data.setdefault("models", {})["dir"] = str(state_dir / "router-models")
    # Training samples survive a router restart, as models do.
    data.setdefault("samples", {})["path"] = str(state_dir / "router-samples.sqlite")
    data.setdefault("auth", {}).update({"token_env": TOKEN_ENV, "data_token_env": DATA_TOKEN_ENV})
    if opts.fleet == "vllm":
        from planner_cli.stack_vllm import router_overrides

        router_overrides(data)
    path = state_dir / "routing.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_fleet_config(opts: StackOptions, state_dir: Path, planner_cfg) -> Path:
    import yaml

    p = planner_cfg.planner
    from planner_cli.stack_dynamo import trace_fields

    data = {
        **trace_fields(opts),
        "speed": opts.speed,
        "profile_dir": p.profile.dir or str(DEFAULT_PROFILE),
        "startup_s": opts.startup_s,
        "prefill_latency_scale": opts.prefill_latency_scale,
        "decode_latency_scale": opts.decode_latency_scale,
        "port": opts.fleet_port,
        "model": p.model_id,
        "namespace": p.namespace,
        "etcd_url": opts.urls()["etcd"],
        "router_url": opts.urls()["router"],
        "router_token_env": TOKEN_ENV,
        "router_data_token_env": DATA_TOKEN_ENV,
        "ttft_ms": p.slo.ttft_ms,
        "itl_ms": p.slo.itl_ms,
        "status_path": str(state_dir / "fleet-final-status.json"),
    }
    path = state_dir / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    from sim.live.config import load_config
    from workloads.trace_shaping import build_trace

    build_trace(load_config(path))  # fail here, naming the file, not in the background
    return path


def write_prometheus_config(opts: StackOptions, state_dir: Path) -> Path:
    interval = f"{round(opts.scrape_interval_s * 1000)}ms"
    path = state_dir / "prometheus.yml"
    path.write_text(
        "# Generated by `sla-planner stack up`.\n"
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        f"rule_files: ['{PROMETHEUS_RULES}']\n"
        "scrape_configs:\n"
        "  - job_name: fleet\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{opts.fleet_port}']}}]\n"
        "  - job_name: router\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{opts.router_port}']}}]\n"
        "  - job_name: planner\n"
        "    honor_labels: true  # the namespace and model the runs pushed, not the Pushgateway's\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{opts.pushgateway_port}']}}]\n"
    )
    if opts.fleet == "dynamo":
        from planner_cli.stack_dynamo import prometheus_jobs

        path.write_text(path.read_text() + prometheus_jobs(opts, state_dir))
    elif opts.fleet == "vllm":
        from planner_cli import stack_vllm

        path.write_text(path.read_text() + stack_vllm.prometheus_jobs(opts, state_dir))
    return path


def write_deployments(opts: StackOptions, state_dir: Path, state: dict) -> Path:
    """prefect.yaml with this stack's schedule and parameters (the deployments themselves unchanged)."""
    import yaml

    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    # The process-pool deployments only (the Kubernetes work-pool variants run in a cluster).
    spec["deployments"] = [d for d in spec.get("deployments", []) if d.get("name") in STACK_DEPLOYMENTS]
    for dep in spec["deployments"]:
        if dep.get("name") == "planner":
            dep["schedules"] = [{"interval": opts.interval_s}]
            dep["parameters"] = {**(dep.get("parameters") or {}), "config_path": str(state_dir / "planner.yaml")}
        elif dep.get("name") == "retrain":
            dep["schedules"] = [{"interval": opts.retrain_interval_s}]
            dep["parameters"] = _retrain_parameters(dep.get("parameters") or {}, opts)
    path = state_dir / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _retrain_parameters(params: dict, opts: StackOptions) -> dict:
    """Point the retrain flow at this stack's routing service, its profile and its token's variable
    (the token itself is in the worker's environment, never in a parameter)."""
    profile = DEFAULT_PROFILE
    if opts.fleet == "vllm":
        from planner_cli.stack_vllm import PROFILE_DIR as profile
    return {**params, "router_url": opts.urls()["router"], "profile_dir": str(profile), "token_env": TOKEN_ENV}


def work_pool() -> str:
    import yaml

    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    pools = {d["work_pool"]["name"] for d in spec.get("deployments", [])
             if d.get("work_pool") and d.get("name") in STACK_DEPLOYMENTS}
    if len(pools) != 1:
        raise StackError(f"prefect.yaml: expected deployments {', '.join(STACK_DEPLOYMENTS)} to share one work pool, "
                         f"got {sorted(pools)}")
    return pools.pop()


# -- components --------------------------------------------------------------------


def components(opts: StackOptions, state_dir: Path, planner_cfg) -> dict[str, Component]:
    urls = opts.urls()
    py = sys.executable
    bin_dir = Path(py).parent
    etcd_peer = f"http://127.0.0.1:{opts.etcd_peer_port}"
    worker_env = prefect_env(opts, state_dir)
    server_env = {k: v for k, v in worker_env.items() if k != "PREFECT_API_URL"}
    if opts.prefect_db == "postgres":
        from planner_cli import stack_postgres

        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = stack_postgres.database_url(state_dir,
                                                                                       port=opts.postgres_port)
    router_cfg = write_router_config(opts, state_dir)
    fleet_cfg = write_fleet_config(opts, state_dir, planner_cfg) if opts.fleet == "sim" else None
    prom_cfg = write_prometheus_config(opts, state_dir)
    comps = [
        Component("etcd", [
            ETCD_BIN, "--name", "stack", "--data-dir", str(state_dir / "etcd-data"),
            "--listen-client-urls", urls["etcd"], "--advertise-client-urls", urls["etcd"],
            "--listen-peer-urls", etcd_peer, "--initial-advertise-peer-urls", etcd_peer,
            "--initial-cluster", f"stack={etcd_peer}",
            # A one-member cluster elects itself in ~0.05 s with these.
            "--heartbeat-interval", "10", "--election-timeout", "50", "--log-level", "warn",
        ], f"{urls['etcd']}/health"),
        Component("prometheus", [
            PROMETHEUS_BIN, f"--config.file={prom_cfg}", f"--storage.tsdb.path={state_dir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{opts.prometheus_port}", "--storage.tsdb.retention.time=7d",
            "--log.level=warn",
        ], f"{urls['prometheus']}/-/ready"),
        Component("pushgateway", [
            PUSHGATEWAY_BIN, f"--web.listen-address=127.0.0.1:{opts.pushgateway_port}", "--log.level=warn",
        ], f"{urls['pushgateway']}/-/ready"),
        Component("router", [
            str(bin_dir / "sla-planner"), "router", "--host", "127.0.0.1", "--port", str(opts.router_port),
            "--config", str(router_cfg), "--log-level", "warning",
        ], f"{urls['router']}/healthz", needs_token=True, needs_data_token=True),
        Component("prefect-server", [
            str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(opts.prefect_port),
        ], f"{urls['prefect_api']}/health", env=server_env),
        Component("prefect-worker", [
            str(bin_dir / "prefect"), "worker", "start", "--pool", work_pool(), "--name", "stack-worker",
        ], None, env=worker_env, needs_token=True),
    ]
    if opts.prefect_db == "postgres":
        from planner_cli import stack_postgres

        comps.append(Component("postgres", stack_postgres.server_argv(state_dir, port=opts.postgres_port), None))
    if opts.fleet == "sim":
        comps.append(Component("fleet", [py, "-m", "sim.live", "--config", str(fleet_cfg)],
                               f"{urls['fleet']}/healthz", needs_token=True, needs_data_token=True))
    elif opts.fleet == "vllm":
        from planner_cli import stack_vllm

        comps += stack_vllm.components(opts, state_dir, namespace=planner_cfg.planner.namespace,
                                       slo=planner_cfg.planner.slo, component_cls=Component)
    else:
        from planner_cli import stack_dynamo

        comps += stack_dynamo.components(
            opts, state_dir, namespace=planner_cfg.planner.namespace,
            profile_dir=planner_cfg.planner.profile.dir or str(DEFAULT_PROFILE), component_cls=Component,
        )
    return {c.name: c for c in comps}


def prefect_env(opts: StackOptions, state_dir: Path) -> dict[str, str]:
    return {
        "PREFECT_HOME": str(state_dir / "prefect-home"),
        "PREFECT_API_URL": opts.urls()["prefect_api"],
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true",
        # Schedule runs promptly at short intervals and pick them up within a second or two.
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": str(max(2, min(30, int(opts.interval_s // 3)))),
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        # Heartbeats let the zombie automation mark a run whose process died as Crashed.
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    }

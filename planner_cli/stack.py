"""`sla-planner stack up|down|status`: the whole product running on this machine.

`up` starts, each on 127.0.0.1 and in its own process group, with logs and
data in the state folder (default `.stack/`):

- etcd (Debian etcd-server): the virtual connector's keys
- the routing service (`sla-planner router`), models and training samples persisted in the state folder
- the fleet, one of:
  - `--fleet sim` (default, the fast path): the simulated fleet (`python -m sim.live`)
    replaying a real trace in wall-clock time: Dynamo/vLLM metrics on /metrics, routing
    through the routing service, scaling to the planner's etcd decisions after the startup delay
  - `--fleet dynamo`: real Dynamo 1.6.1 on CPU (planner_cli.stack_dynamo): its frontend,
    mocker workers started and drained by the fleet executor on the planner's decisions,
    and a load generator replaying the trace over HTTP
- Prometheus (Debian prometheus) scraping the fleet, the router and a Pushgateway
  (Debian prometheus-pushgateway) the planner runs push their gauges to, with the
  recording rules of stack/prometheus-rules.yml
- the Prefect server with its UI, a process worker, and the deployments of
  prefect.yaml (the planner every adjustment interval, the retrain flow when
  prefect.yaml has one) with this stack's configuration

`down` stops every process the stack started (process groups, then any
process carrying the stack's marker in its environment, such as flow runs
a worker started in their own session) and checks that none is left.
`status` shows each component, its URL and whether it answers.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = PROJECT_ROOT / ".stack"
DEFAULT_TRACE = PROJECT_ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
DEFAULT_PROFILE = PROJECT_ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
DEFAULT_PLANNER_CONFIG = PROJECT_ROOT / "configs" / "planner.yaml"
ROUTER_TEMPLATE = PROJECT_ROOT / "stack" / "routing.yaml"
STATE_FILE = "stack.json"
MARKER_ENV = "SLA_PLANNER_STACK"
TOKEN_ENV = "SLA_ROUTER_TOKEN"
DATA_TOKEN_ENV = "SLA_ROUTER_DATA_TOKEN"
STACK_DEPLOYMENTS = ("planner", "retrain", "what-if")  # prefect.yaml's process work-pool deployments
ETCD_BIN = "/usr/bin/etcd"
PROMETHEUS_BIN = "/usr/bin/prometheus"
PUSHGATEWAY_BIN = "/usr/bin/prometheus-pushgateway"
PROMETHEUS_RULES = PROJECT_ROOT / "stack" / "prometheus-rules.yml"
# Start order; `down` stops them all at once.
COMPONENTS = ("prefect-server", "etcd", "router", "fleet", "pushgateway", "prometheus", "prefect-worker")
FLEETS = ("sim", "dynamo")
# Flow runs send a heartbeat this often (Prefect's minimum is 30 s); one silent for
# ZOMBIE_AFTER_S after its Running event or a heartbeat lost its process and is marked Crashed.
HEARTBEAT_S = 30
ZOMBIE_AFTER_S = 90.0
# The flow engine renews a running deployment run's concurrency slot lease for this long;
# a run killed with its worker holds the planner's single slot until it lapses, or until it
# is marked Crashed. Prefect 3.9.1 hard-codes it in the engine (no setting; the server's
# initial lease duration and a deployment's grace_period_seconds cover only Pending), so
# this only mirrors it for waits (docs/stack.md, "A worker that dies mid-run").
SLOT_LEASE_S = 300.0


class StackError(RuntimeError):
    """A component did not start or stop; the message names it and shows its log."""


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
    fleet: str = "sim"  # sim | dynamo (FLEETS)
    frontend_port: int = 8000
    worker_port_base: int = 21300  # Dynamo worker k of a role serves metrics here (+100 for decode) + k; < 32768
    mocker_speedup: float = 1.0  # Dynamo mocker: times faster than the profiled engine
    max_workers: int = 6  # --fleet dynamo: most mocker workers per pool (each is a process on this machine)

    def __post_init__(self) -> None:
        if self.fleet not in FLEETS:
            raise ValueError(f"fleet: expected one of {', '.join(FLEETS)}, got {self.fleet!r}")

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


@dataclass
class Component:
    """One process of the stack: how to start it and how to tell it is up."""

    name: str
    argv: list[str]
    health_url: str | None
    cwd: str = str(PROJECT_ROOT)
    env: dict[str, str] = field(default_factory=dict)
    needs_token: bool = False  # gets the router's admin token
    needs_data_token: bool = False  # gets the router's data-plane token
    pid: int | None = None
    started_unix_s: float | None = None


# -- public API (the CLI and the tests) ------------------------------------------


def up(opts: StackOptions, *, log=print) -> dict:
    """Start the stack; returns its state. On any failure everything started is stopped."""
    state_dir = Path(opts.state_dir).resolve()
    if _read_state(state_dir, missing_ok=True) is not None and _live_pids(_read_state(state_dir)):
        raise StackError(f"{state_dir}: a stack is already running there; run `sla-planner stack down` first")
    _check_binaries()
    _fresh_dir(state_dir)
    for name in ("router-token", "router-data-token"):
        token_path = state_dir / name
        token_path.write_text(secrets.token_urlsafe(24))
        token_path.chmod(0o600)
    planner_cfg = _write_planner_config(opts, state_dir)
    comps = _components(opts, state_dir, planner_cfg)
    state = {"marker": f"{state_dir}#{uuid.uuid4().hex}", "options": asdict(opts), "urls": opts.urls(),
             "namespace": planner_cfg.planner.namespace, "components": {}}
    _write_state(state_dir, state)
    try:
        # The Prefect server takes longest: start it first and the rest while it boots.
        for name in ("prefect-server", "etcd", "router", "pushgateway", "prometheus"):
            _launch(state_dir, state, comps[name])
        for name in ("etcd", "router", "pushgateway", "prometheus", "prefect-server"):
            _wait_healthy(state_dir, state, name, timeout_s=opts.start_timeout_s)
            log(f"  {name:<15} up   {comps[name].health_url}")
        _deploy(opts, state_dir, state, log=log)
        _create_zombie_automation(opts)
        log(f"  {'automation':<15} flow runs silent for {ZOMBIE_AFTER_S:g} s are marked Crashed")
        _launch(state_dir, state, comps["prefect-worker"])
        if opts.fleet == "dynamo":
            _start_dynamo_fleet(opts, state_dir, state, comps, log=log)
        else:
            _launch(state_dir, state, comps["fleet"])
            _wait_healthy(state_dir, state, "fleet", timeout_s=opts.start_timeout_s)
            log(f"  {'fleet':<15} up   {comps['fleet'].health_url}")
        _check_running(state_dir, state, "prefect-worker")
        log(f"  {'prefect-worker':<15} up   pool {_work_pool()}")
    except BaseException:
        down(str(state_dir), log=lambda *_: None)
        raise
    return state


def _start_dynamo_fleet(opts: StackOptions, state_dir: Path, state: dict, comps: dict, *, log) -> None:
    """Frontend, then the executor's first workers registered, then the load."""
    from planner_cli import stack_dynamo

    _launch(state_dir, state, comps["frontend"])
    _wait_healthy(state_dir, state, "frontend", timeout_s=opts.start_timeout_s)
    log(f"  {'frontend':<15} up   {comps['frontend'].health_url}")
    _launch(state_dir, state, comps["executor"])

    def executor_alive() -> None:
        if _exited(state["components"]["executor"]["pid"]):
            raise StackError(f"executor exited before its workers registered{_log_tail(state['components']['executor'])}")

    try:
        stack_dynamo.wait_model_served(opts.urls()["frontend"], timeout_s=opts.start_timeout_s,
                                       check_alive=executor_alive)
    except TimeoutError as exc:
        raise StackError(f"{exc}{_log_tail(state['components']['executor'])}") from None
    log(f"  {'executor':<15} up   workers registered, model {stack_dynamo.MODEL_NAME!r} served")
    _launch(state_dir, state, comps["loadgen"])
    _check_running(state_dir, state, "loadgen")
    log(f"  {'loadgen':<15} up   replaying {Path(opts.trace).name} against {opts.urls()['frontend']}")


def down(state_dir: str, *, log=print, grace_s: float = 10.0) -> list[int]:
    """Stop every process of the stack and verify none is left; returns the pids stopped.

    Raises StackError naming any process that survived SIGKILL.
    """
    state_path = Path(state_dir).resolve()
    state = _read_state(state_path, missing_ok=True)
    if state is None:
        log(f"no stack state in {state_path}: nothing to stop")
        return []
    groups = [c["pid"] for c in state["components"].values() if c.get("pid")]
    marker = state["marker"]
    stopped = set()
    for pgid in groups:
        stopped.update(_members(pgid, marker))
        _signal_group(pgid, signal.SIGTERM, marker=marker)
    deadline = time.monotonic() + grace_s
    resent = False
    while time.monotonic() < deadline and marked_processes(marker):
        _reap(groups)
        time.sleep(0.1)
        if not resent and time.monotonic() > deadline - grace_s + 1.0:
            # A process worker shuts down on the second SIGTERM (it ignores the first).
            for pgid in groups:
                _signal_group(pgid, signal.SIGTERM, marker=marker)
            resent = True
    # Flow runs a worker started live in their own session: found by the marker alone.
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL, marker=marker)
    for pid in marked_processes(marker):
        stopped.add(pid)
        _signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and marked_processes(marker):
        _reap(groups)
        time.sleep(0.05)
    _reap(groups)
    left = marked_processes(marker)
    for comp in state["components"].values():
        comp["pid"] = None
    _write_state(state_path, state)
    if left:
        raise StackError(f"stack in {state_path}: processes still running after SIGKILL: {left}")
    log(f"stack in {state_path} stopped: {len(stopped)} processes, none left")
    return sorted(stopped)


def status(state_dir: str) -> list[dict]:
    """Each component: pid, whether its process group runs, whether it answers, URL."""
    state_path = Path(state_dir).resolve()
    state = _read_state(state_path)
    out = []
    for name in _component_names(state.get("options", {}).get("fleet", "sim")):
        comp = state["components"].get(name)
        if comp is None:
            out.append({"name": name, "pid": None, "running": False, "healthy": False, "url": None})
            continue
        running = bool(comp.get("pid") and _members(comp["pid"], state["marker"]))
        url = comp.get("health_url")
        healthy = running and (url is None or _http_ok(url))
        out.append({"name": name, "pid": comp.get("pid"), "running": running, "healthy": healthy, "url": url})
    return out


def _component_names(fleet: str) -> tuple[str, ...]:
    if fleet != "dynamo":
        return COMPONENTS
    from planner_cli.stack_dynamo import COMPONENTS as DYNAMO

    return tuple(n for n in COMPONENTS if n != "fleet") + DYNAMO


def stop_component(state_dir: str, name: str, *, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop one component's process group (the fault tests' outage)."""
    state_path = Path(state_dir).resolve()
    state = _read_state(state_path)
    comp = state["components"][name]
    pgid = comp.get("pid")
    if not pgid:
        return
    marker = state["marker"]
    _signal_group(pgid, sig, marker=marker)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _members(pgid, marker):
        _reap([pgid])
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL, marker=marker)
    deadline = time.monotonic() + 10.0
    while _members(pgid, marker):
        if time.monotonic() > deadline:
            raise StackError(f"{name}: processes {_members(pgid, marker)} survived SIGKILL")
        _reap([pgid])
        time.sleep(0.05)
    comp["pid"] = None
    _write_state(state_path, state)


def start_component(state_dir: str, name: str, *, timeout_s: float = 120.0) -> None:
    """Start one stopped component again with the same command, data and ports."""
    state_path = Path(state_dir).resolve()
    state = _read_state(state_path)
    data = dict(state["components"][name])
    comp = Component(**{k: v for k, v in data.items() if k in {f.name for f in fields(Component)}})
    if comp.pid and _members(comp.pid, state["marker"]):
        raise StackError(f"{name} is already running (pid {comp.pid})")
    _launch(state_path, state, comp)
    if comp.health_url:
        _wait_healthy(state_path, state, name, timeout_s=timeout_s)


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment carries this stack's marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != os.getpid() and needle in _environ(int(e)).split(b"\0")
            and not _is_zombie(int(e))]


def read_token(state_dir: str) -> str:
    """The stack's router admin token."""
    return (Path(state_dir).resolve() / "router-token").read_text().strip()


def read_data_token(state_dir: str) -> str:
    """The stack's router data-plane token (routes, lifecycle events, load pushes)."""
    return (Path(state_dir).resolve() / "router-data-token").read_text().strip()


def read_state(state_dir: str) -> dict:
    return _read_state(Path(state_dir).resolve())


# -- configuration files ------------------------------------------------------------


def _write_planner_config(opts: StackOptions, state_dir: Path):
    """The planner config of this stack: the user's file, pointed at the stack's services."""
    import yaml

    from flows.config import load_run_config

    source = load_run_config(opts.planner_config)  # validates and makes the profile path absolute
    data = source.model_dump(mode="json", exclude_none=True)
    data["planner"]["adjustment_interval_s"] = opts.interval_s
    if opts.stabilization_s is not None:
        data["planner"]["decision"]["scale_down_stabilization_s"] = opts.stabilization_s
    data.setdefault("metrics", {})["prometheus_url"] = opts.urls()["prometheus"]
    data["planner_metrics"] = {"enabled": True, "pushgateway_url": opts.urls()["pushgateway"]}
    data["connector"] = {"kind": "virtual", "etcd_url": opts.urls()["etcd"]}
    if opts.fleet == "dynamo":
        from planner_cli.stack_dynamo import planner_overrides

        planner_overrides(data, namespace=data["planner"]["namespace"], max_workers=opts.max_workers)
    path = state_dir / "planner.yaml"
    path.write_text("# Generated by `sla-planner stack up` from " + opts.planner_config + "\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return load_run_config(path)


def _write_router_config(opts: StackOptions, state_dir: Path) -> Path:
    import yaml

    data = yaml.safe_load(ROUTER_TEMPLATE.read_text()) or {}
    data["profile_dir"] = str(DEFAULT_PROFILE)
    data.setdefault("models", {})["dir"] = str(state_dir / "router-models")
    # Training samples survive a router restart, as models do.
    data.setdefault("samples", {})["path"] = str(state_dir / "router-samples.sqlite")
    data.setdefault("auth", {}).update({"token_env": TOKEN_ENV, "data_token_env": DATA_TOKEN_ENV})
    path = state_dir / "routing.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _write_fleet_config(opts: StackOptions, state_dir: Path, planner_cfg) -> Path:
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
        "slo_ttft_ms": p.slo.ttft_ms,
        "slo_tpot_ms": p.slo.itl_ms,
        "status_path": str(state_dir / "fleet-final-status.json"),
    }
    path = state_dir / "fleet.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    from sim.live import build_trace, load_config

    build_trace(load_config(path))  # fail here, naming the file, not in the background
    return path


def _write_prometheus_config(opts: StackOptions, state_dir: Path) -> Path:
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
    return path


def _write_deployments(opts: StackOptions, state_dir: Path, state: dict) -> Path:
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
    return {**params, "router_url": opts.urls()["router"], "profile_dir": str(DEFAULT_PROFILE),
            "token_env": TOKEN_ENV}


def _work_pool() -> str:
    import yaml

    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    pools = {d["work_pool"]["name"] for d in spec.get("deployments", [])
             if d.get("work_pool") and d.get("name") in STACK_DEPLOYMENTS}
    if len(pools) != 1:
        raise StackError(f"prefect.yaml: expected deployments {', '.join(STACK_DEPLOYMENTS)} to share one work pool, "
                         f"got {sorted(pools)}")
    return pools.pop()


# -- components --------------------------------------------------------------------


def _components(opts: StackOptions, state_dir: Path, planner_cfg) -> dict[str, Component]:
    urls = opts.urls()
    py = sys.executable
    bin_dir = Path(py).parent
    etcd_peer = f"http://127.0.0.1:{opts.etcd_peer_port}"
    prefect_env = _prefect_env(opts, state_dir)
    server_env = {k: v for k, v in prefect_env.items() if k != "PREFECT_API_URL"}
    router_cfg = _write_router_config(opts, state_dir)
    fleet_cfg = _write_fleet_config(opts, state_dir, planner_cfg) if opts.fleet == "sim" else None
    prom_cfg = _write_prometheus_config(opts, state_dir)
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
            str(bin_dir / "prefect"), "worker", "start", "--pool", _work_pool(), "--name", "stack-worker",
        ], None, env=prefect_env, needs_token=True),
    ]
    if opts.fleet == "sim":
        comps.append(Component("fleet", [py, "-m", "sim.live", "--config", str(fleet_cfg)],
                               f"{urls['fleet']}/healthz", needs_token=True, needs_data_token=True))
    else:
        from planner_cli import stack_dynamo

        comps += stack_dynamo.components(
            opts, state_dir, namespace=planner_cfg.planner.namespace,
            profile_dir=planner_cfg.planner.profile.dir or str(DEFAULT_PROFILE), component_cls=Component,
        )
    return {c.name: c for c in comps}


def _prefect_env(opts: StackOptions, state_dir: Path) -> dict[str, str]:
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


def _deploy(opts: StackOptions, state_dir: Path, state: dict, *, log) -> None:
    prefect_file = _write_deployments(opts, state_dir, state)
    env = {**os.environ, **_prefect_env(opts, state_dir), MARKER_ENV: state["marker"]}
    prefect = str(Path(sys.executable).with_name("prefect"))
    pool = _work_pool()
    for argv in (
        [prefect, "work-pool", "create", pool, "--type", "process", "--overwrite"],
        # From the project root: the process worker runs the flows from this checkout.
        [prefect, "deploy", "--all", "--prefect-file", str(prefect_file)],
    ):
        done = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=opts.start_timeout_s)
        cli_log = state_dir / "logs" / "prefect-cli.log"
        with cli_log.open("a") as out:
            out.write(f"$ {' '.join(argv[1:])}\n{done.stdout}\n{done.stderr}\n")
        if done.returncode != 0:
            raise StackError(f"deployments: `prefect {' '.join(argv[1:3])}` failed (exit {done.returncode})"
                             f"{_log_pointer(cli_log)}")
    import yaml

    names = [d["name"] for d in yaml.safe_load(prefect_file.read_text()).get("deployments", [])]
    log(f"  {'deployments':<15} {', '.join(names)} on work pool {pool}")


def _create_zombie_automation(opts: StackOptions) -> None:
    """Prefect's zombie-run recipe for self-hosted servers: a run that goes silent is Crashed.

    Without it a run whose worker died stays Running in the UI forever. Unlike
    the recipe, the silence is also counted from the Running event: a run
    killed before its first heartbeat would otherwise never be caught. Prefect
    3.9's triggers hold the state events of scheduler-created runs for up to 15
    minutes (their Scheduled state emits no event, and later events say they
    follow it), so such a run is marked Crashed that late; one whose heartbeat
    arrived, ZOMBIE_AFTER_S after it. A heartbeat that overtakes its run's held
    Completed event makes the action fire on a finished run, where it fails
    harmlessly ("already in terminal state").
    """
    from datetime import timedelta

    from prefect.automations import AutomationCore
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    automation = AutomationCore(
        name="sla-planner: crash silent flow runs",
        description=f"a flow run with no heartbeat for {ZOMBIE_AFTER_S:g} s lost its process: mark it Crashed",
        trigger=EventTrigger(
            after={"prefect.flow-run.Running", "prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=ZOMBIE_AFTER_S),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {ZOMBIE_AFTER_S:g} s: the flow run's process is gone (worker killed?)",
        )],
    )
    req = urllib.request.Request(f"{opts.urls()['prefect_api']}/automations/", method="POST",
                                 data=json.dumps(automation.model_dump(mode="json")).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise StackError(f"creating the zombie-run automation: HTTP {exc.code}: {exc.read()[:500]!r}") from None


# -- processes ------------------------------------------------------------------------


def _launch(state_dir: Path, state: dict, comp: Component) -> None:
    log_path = state_dir / "logs" / f"{comp.name}.log"
    env = {**os.environ, **comp.env, MARKER_ENV: state["marker"]}
    env.pop(TOKEN_ENV, None)
    env.pop(DATA_TOKEN_ENV, None)
    if comp.needs_token:
        env[TOKEN_ENV] = read_token(str(state_dir))
    if comp.needs_data_token:
        env[DATA_TOKEN_ENV] = read_data_token(str(state_dir))
    with log_path.open("ab") as out:
        proc = subprocess.Popen(comp.argv, cwd=comp.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    comp.pid = proc.pid
    comp.started_unix_s = time.time()
    record = asdict(comp)
    record["log"] = str(log_path)
    state["components"][comp.name] = record
    _write_state(state_dir, state)


def _wait_healthy(state_dir: Path, state: dict, name: str, *, timeout_s: float) -> None:
    comp = state["components"][name]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _exited(comp["pid"]):
            raise StackError(f"{name} exited before it answered at {comp['health_url']}{_log_tail(comp)}")
        if _http_ok(comp["health_url"]):
            return
        time.sleep(0.2)
    raise StackError(f"{name} did not answer at {comp['health_url']} within {timeout_s:g} s{_log_tail(comp)}")


def _check_running(state_dir: Path, state: dict, name: str, *, settle_s: float = 2.0) -> None:
    comp = state["components"][name]
    time.sleep(settle_s)
    if _exited(comp["pid"]):
        raise StackError(f"{name} exited right after it started{_log_tail(comp)}")


def _exited(pid: int) -> bool:
    """True when pid is gone or a zombie (reaping it when it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    return _is_zombie(pid) or not Path(f"/proc/{pid}").exists()


def _reap(pids) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of pid, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[2])


def _is_zombie(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] in ("Z", "X")


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group pgid."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def _members(pgid: int, marker: str) -> list[int]:
    """Live members of process group pgid that carry this stack's marker (a recorded
    pgid may since have been reused by someone else's processes)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    return [pid for pid in _group_members(pgid) if needle in _environ(pid).split(b"\0")]


def _signal_group(pgid: int, sig: int, *, marker: str) -> None:
    """Signal a process group, but only while it holds processes of this stack."""
    if not _members(pgid, marker):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _live_pids(state: dict) -> list[int]:
    return [p for c in state["components"].values() if c.get("pid") for p in _members(c["pid"], state["marker"])]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _log_tail(comp: dict) -> str:
    """Where the component's log is and its last line, on the error's one line."""
    return _log_pointer(Path(comp.get("log", "")))


def _log_pointer(path: Path, *, width: int = 160) -> str:
    if not path.is_file():
        return ""
    last = next((line.strip() for line in reversed(path.read_text(errors="replace").splitlines()) if line.strip()),
                "")
    last = last if len(last) <= width else last[: width - 3] + "..."
    return f"; log {path}" + (f", last line: {last}" if last else " (empty)")


def _check_binaries() -> None:
    missing = [b for b in (ETCD_BIN, PROMETHEUS_BIN, PUSHGATEWAY_BIN) if not Path(b).is_file()]
    if missing:
        raise StackError(f"not installed: {', '.join(missing)} (run scripts/setup.sh: Debian prometheus, "
                         "prometheus-pushgateway, etcd-server)")


def _fresh_dir(state_dir: Path) -> None:
    """Empty the state folder (every `up` starts clean) but refuse to wipe a foreign folder."""
    if state_dir.exists() and any(state_dir.iterdir()) and not (state_dir / STATE_FILE).exists():
        raise StackError(f"{state_dir} exists and is not a stack state folder; choose another --state-dir")
    shutil.rmtree(state_dir, ignore_errors=True)
    (state_dir / "logs").mkdir(parents=True)


def _read_state(state_dir: Path, *, missing_ok: bool = False) -> dict | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        if missing_ok:
            return None
        raise StackError(f"no stack state in {state_dir} (start one with `sla-planner stack up`)")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise StackError(f"{path}: unreadable stack state: {exc}") from None


def _write_state(state_dir: Path, state: dict) -> None:
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_dir / STATE_FILE)


# -- CLI ----------------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "stack", help="run the whole product locally: Prefect server+UI, worker, Prometheus, etcd, router, fleet",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="stack_command", metavar="{up,down,status}")
    sub.required = True
    d = StackOptions()
    u = sub.add_parser("up", help="start the stack in the background")
    u.add_argument("--state-dir", default=d.state_dir, help="logs, data and PIDs (default: %(default)s)")
    u.add_argument("--interval-s", type=float, default=d.interval_s,
                   help="planner adjustment interval and schedule, wall seconds (default: %(default)s)")
    u.add_argument("--planner-config", default=d.planner_config, help="planner config to start from (default: %(default)s)")
    u.add_argument("--stabilization-s", type=float, default=None, help="override the scale-down stabilization window, s")
    u.add_argument("--retrain-interval-s", type=float, default=d.retrain_interval_s,
                   help="retrain flow schedule, s (default: %(default)s)")
    u.add_argument("--trace", default=d.trace, help="trace to replay (default: the bundled Azure conversation trace)")
    u.add_argument("--trace-start-s", type=float, default=d.trace_start_s, help="replay from this offset, s")
    u.add_argument("--trace-duration-s", type=float, default=None, help="replay this much of the trace, s")
    u.add_argument("--shape", default=None, metavar="D1xK1,D2xK2,...",
                   help="consecutive trace windows of D seconds with load multiplied by K, e.g. 60x1,90x4,90x1")
    u.add_argument("--load-multiplier", type=float, default=d.load_multiplier,
                   help="superpose this many copies of the trace (default: %(default)s)")
    u.add_argument("--jitter-s", type=float, default=d.jitter_s,
                   help="copies of the trace are shifted by up to ± this many seconds: the default models "
                        "independent tenants; 1 gives synchronised copies (a stress case) (default: %(default)s)")
    u.add_argument("--time-scale", type=float, default=d.time_scale, help="stretch (>1) or compress (<1) the trace")
    u.add_argument("--speed", type=float, default=d.speed,
                   help="simulated seconds per wall second; the planner then sees SPEED x the rate (default: 1)")
    u.add_argument("--startup-s", type=float, default=d.startup_s,
                   help="a new worker serves this long after it is added, simulated s (default: %(default)s)")
    u.add_argument("--prefill-latency-scale", type=float, default=d.prefill_latency_scale,
                   help="simulated engines prefill this many times slower than profiled (default: %(default)s)")
    u.add_argument("--decode-latency-scale", type=float, default=d.decode_latency_scale,
                   help="simulated decode steps take this many times the profile's (default: %(default)s)")
    u.add_argument("--scrape-interval-s", type=float, default=d.scrape_interval_s)
    u.add_argument("--fleet", choices=FLEETS, default=d.fleet,
                   help="sim: the simulated fleet (fast, the default); dynamo: a Dynamo 1.6.1 frontend and "
                        "mocker workers on CPU, scaled by the fleet executor, loaded over HTTP")
    u.add_argument("--mocker-speedup", type=float, default=d.mocker_speedup,
                   help="--fleet dynamo: mocker engines run this many times faster than profiled (default: 1)")
    u.add_argument("--max-workers", type=int, default=d.max_workers,
                   help="--fleet dynamo: the planner's most workers per pool; each is a mocker process on this "
                        "machine (default: %(default)s)")
    for name in ("prefect", "prometheus", "pushgateway", "etcd", "etcd-peer", "router", "fleet", "frontend"):
        attr = f"{name.replace('-', '_')}_port"
        u.add_argument(f"--{name}-port", type=int, default=getattr(d, attr), dest=attr,
                       help=f"default: {getattr(d, attr)}")
    for name, text in (("down", "stop everything the stack started and check nothing is left"),
                       ("status", "show each component and whether it answers")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--state-dir", default=d.state_dir, help="default: %(default)s")


def run(args: argparse.Namespace) -> int:
    try:
        if args.stack_command == "up":
            return _run_up(args)
        if args.stack_command == "down":
            down(args.state_dir)
            return 0
        rows = status(args.state_dir)
        for r in rows:
            state = "up" if r["healthy"] else ("running" if r["running"] else "down")
            print(f"{r['name']:<15} {state:<8} pid {r['pid'] or '-':<8} {r['url'] or ''}")
        return 0 if all(r["healthy"] for r in rows) else 1
    except (StackError, ValueError) as exc:
        print(f"sla-planner stack {args.stack_command}: {exc}", file=sys.stderr)
        return 1


def _run_up(args: argparse.Namespace) -> int:
    shape = None
    if args.shape:
        try:
            shape = tuple((float(a), float(b)) for a, b in (part.split("x") for part in args.shape.split(",")))
        except ValueError:
            raise ValueError(f"--shape {args.shape!r}: expected D1xK1,D2xK2,... e.g. 60x1,90x4,90x1") from None
    opts = StackOptions(
        state_dir=args.state_dir, interval_s=args.interval_s, planner_config=args.planner_config,
        stabilization_s=args.stabilization_s, retrain_interval_s=args.retrain_interval_s, trace=args.trace,
        trace_start_s=args.trace_start_s, trace_duration_s=args.trace_duration_s, shape=shape,
        load_multiplier=args.load_multiplier, jitter_s=args.jitter_s, time_scale=args.time_scale, speed=args.speed,
        startup_s=args.startup_s, prefill_latency_scale=args.prefill_latency_scale,
        decode_latency_scale=args.decode_latency_scale, scrape_interval_s=args.scrape_interval_s,
        prefect_port=args.prefect_port, prometheus_port=args.prometheus_port,
        pushgateway_port=args.pushgateway_port, etcd_port=args.etcd_port,
        etcd_peer_port=args.etcd_peer_port, router_port=args.router_port, fleet_port=args.fleet_port,
        fleet=args.fleet, frontend_port=args.frontend_port, mocker_speedup=args.mocker_speedup,
        max_workers=args.max_workers,
    )
    print(f"starting the stack in {Path(opts.state_dir).resolve()} ...")
    state = up(opts)
    urls = state["urls"]
    print(
        f"\nPrefect UI   {urls['prefect_ui']}   (planner runs every {opts.interval_s:g} s, artifacts per run)\n"
        f"Prometheus   {urls['prometheus']}   (planner gauges and sla_planner:* recording rules)\n"
        f"router       {urls['router']}/v1/models\n"
        + (f"fleet        {urls['fleet']}/status\n" if opts.fleet == "sim" else
           f"frontend     {urls['frontend']}/v1/models (Dynamo 1.6.1; workers in {Path(opts.state_dir).resolve()}"
           f"/executor/workers.json; load results in loadgen/summary.json)\n") +
        f"etcd keys    v1/{state['namespace']}/planner/ (Dynamo's) at {urls['etcd']}\n"
        f"logs         {Path(opts.state_dir).resolve() / 'logs'}\n"
        f"stop with    sla-planner stack down" + ("" if opts.state_dir == str(DEFAULT_STATE_DIR)
                                                 else f" --state-dir {opts.state_dir}")
    )
    return 0

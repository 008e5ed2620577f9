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
  - `--fleet vllm`: real vLLM 0.32 engines on CPU (planner_cli.stack_vllm) started and
    drained by the fleet executor, the routing service in front of them through a
    gateway, and the load generator
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
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, replace
from pathlib import Path

from planner_cli.stack_components import (
    DEFAULT_STATE_DIR, FLEETS, StackOptions, check_binaries, component_names, components, prefect_env,
    work_pool, write_deployments, write_planner_config,
)
from planner_cli.stack_processes import (
    MARKER_ENV, PROJECT_ROOT, StackError, check_running, down, exited, fresh_dir, http_ok, launch, live_pids,
    load_state, log_pointer, log_tail, members, save_state, wait_healthy,
)

# A flow run silent for this long after its Running event or a heartbeat (sent every
# HEARTBEAT_S) lost its process and is marked Crashed.
ZOMBIE_AFTER_S = 90.0
# The flow engine renews a running deployment run's concurrency slot lease for this long;
# a run killed with its worker holds the planner's single slot until it lapses, or until it
# is marked Crashed. Prefect 3.9.1 hard-codes it in the engine (no setting; the server's
# initial lease duration and a deployment's grace_period_seconds cover only Pending), so
# this only mirrors it for waits (docs/stack.md, "A worker that dies mid-run").
SLOT_LEASE_S = 300.0


# -- public API (the CLI and the tests) ------------------------------------------


def up(opts: StackOptions, *, log=print) -> dict:
    """Start the stack; returns its state. On any failure everything started is stopped."""
    state_dir = Path(opts.state_dir).resolve()
    if load_state(state_dir, missing_ok=True) is not None and live_pids(load_state(state_dir)):
        raise StackError(f"{state_dir}: a stack is already running there; run `sla-planner stack down` first")
    check_binaries()
    if opts.prefect_db == "postgres":
        from planner_cli import stack_postgres

        stack_postgres.bin_dir()
        stack_postgres.check_driver()
        if not opts.postgres_port:
            opts = replace(opts, postgres_port=stack_postgres.free_port())
    fresh_dir(state_dir)
    for name in ("router-token", "router-data-token"):
        token_path = state_dir / name
        token_path.write_text(secrets.token_urlsafe(24))
        token_path.chmod(0o600)
    planner_cfg = write_planner_config(opts, state_dir)
    if opts.prefect_db == "postgres":
        stack_postgres.init_cluster(state_dir)
    comps = components(opts, state_dir, planner_cfg)
    state = {"marker": f"{state_dir}#{uuid.uuid4().hex}", "options": asdict(opts), "urls": opts.urls(),
             "namespace": planner_cfg.planner.namespace, "components": {}}
    save_state(state_dir, state)
    try:
        if opts.prefect_db == "postgres":
            _start_postgres(opts, state_dir, state, comps, log=log)
        # The Prefect server takes longest: start it first and the rest while it boots.
        for name in ("prefect-server", "etcd", "router", "pushgateway", "prometheus"):
            launch(state_dir, state, comps[name])
        for name in ("etcd", "router", "pushgateway", "prometheus", "prefect-server"):
            wait_healthy(state_dir, state, name, timeout_s=opts.start_timeout_s)
            log(f"  {name:<15} up   {comps[name].health_url}")
        _deploy(opts, state_dir, state, log=log)
        _create_zombie_automation(opts)
        log(f"  {'automation':<15} flow runs silent for {ZOMBIE_AFTER_S:g} s are marked Crashed")
        launch(state_dir, state, comps["prefect-worker"])
        if opts.fleet == "dynamo":
            _start_dynamo_fleet(opts, state_dir, state, comps, log=log)
        elif opts.fleet == "vllm":
            _start_vllm_fleet(opts, state_dir, state, comps, log=log)
        else:
            launch(state_dir, state, comps["fleet"])
            wait_healthy(state_dir, state, "fleet", timeout_s=opts.start_timeout_s)
            log(f"  {'fleet':<15} up   {comps['fleet'].health_url}")
        check_running(state_dir, state, "prefect-worker")
        log(f"  {'prefect-worker':<15} up   pool {work_pool()}")
    except BaseException:
        down(str(state_dir), log=lambda *_: None)
        raise
    return state


def _start_postgres(opts: StackOptions, state_dir: Path, state: dict, comps: dict, *, log) -> None:
    """PostgreSQL for the Prefect server: started, accepting connections, the prefect database created."""
    from planner_cli import stack_postgres

    launch(state_dir, state, comps["postgres"])

    def alive() -> None:
        if exited(state["components"]["postgres"]["pid"]):
            raise StackError(f"postgres exited before it accepted connections{log_tail(state['components']['postgres'])}")

    stack_postgres.wait_ready_and_create_db(state_dir, port=opts.postgres_port, timeout_s=opts.start_timeout_s,
                                            alive=alive)
    log(f"  {'postgres':<15} up   127.0.0.1:{opts.postgres_port}, database {stack_postgres.DB_NAME} "
        f"(the Prefect server's)")


def _start_dynamo_fleet(opts: StackOptions, state_dir: Path, state: dict, comps: dict, *, log) -> None:
    """Frontend, then the executor's first workers registered, then the load."""
    from planner_cli import stack_dynamo

    launch(state_dir, state, comps["frontend"])
    wait_healthy(state_dir, state, "frontend", timeout_s=opts.start_timeout_s)
    log(f"  {'frontend':<15} up   {comps['frontend'].health_url}")
    launch(state_dir, state, comps["executor"])

    def executor_alive() -> None:
        if exited(state["components"]["executor"]["pid"]):
            raise StackError(f"executor exited before its workers registered{log_tail(state['components']['executor'])}")

    try:
        stack_dynamo.wait_model_served(opts.urls()["frontend"], timeout_s=opts.start_timeout_s,
                                       check_alive=executor_alive)
    except TimeoutError as exc:
        raise StackError(f"{exc}{log_tail(state['components']['executor'])}") from None
    log(f"  {'executor':<15} up   workers registered, model {stack_dynamo.MODEL_NAME!r} served")
    launch(state_dir, state, comps["loadgen"])
    check_running(state_dir, state, "loadgen")
    log(f"  {'loadgen':<15} up   replaying {Path(opts.trace).name} against {opts.urls()['frontend']}")


def _start_vllm_fleet(opts: StackOptions, state_dir: Path, state: dict, comps: dict, *, log) -> None:
    """Executor (its first engine registered with the router), gateway, then the load."""
    from planner_cli import stack_dynamo, stack_vllm

    launch(state_dir, state, comps["executor"])
    launch(state_dir, state, comps["gateway"])
    wait_healthy(state_dir, state, "gateway", timeout_s=opts.start_timeout_s)

    def executor_alive() -> None:
        if exited(state["components"]["executor"]["pid"]):
            raise StackError(f"executor exited before its engines served{log_tail(state['components']['executor'])}")

    try:
        stack_dynamo.wait_model_served(opts.urls()["frontend"], timeout_s=max(opts.start_timeout_s, 600.0),
                                       check_alive=executor_alive, model=stack_vllm.MODEL_NAME)
    except TimeoutError as exc:
        raise StackError(f"{exc}{log_tail(state['components']['executor'])}") from None
    log(f"  {'executor':<15} up   a vLLM engine serves model {stack_vllm.MODEL_NAME!r}, routed by the router")
    log(f"  {'gateway':<15} up   {comps['gateway'].health_url}")
    launch(state_dir, state, comps["loadgen"])
    check_running(state_dir, state, "loadgen")
    log(f"  {'loadgen':<15} up   replaying {Path(opts.trace).name} against {opts.urls()['frontend']}")


def status(state_dir: str) -> list[dict]:
    """Each component: pid, whether its process group runs, whether it answers, URL."""
    state_path = Path(state_dir).resolve()
    state = load_state(state_path)
    out = []
    options = state.get("options", {})
    for name in component_names(options.get("fleet", "sim"), options.get("prefect_db", "sqlite")):
        comp = state["components"].get(name)
        if comp is None:
            out.append({"name": name, "pid": None, "running": False, "healthy": False, "url": None})
            continue
        running = bool(comp.get("pid") and members(comp["pid"], state["marker"]))
        url = comp.get("health_url")
        healthy = running and (url is None or http_ok(url))
        out.append({"name": name, "pid": comp.get("pid"), "running": running, "healthy": healthy, "url": url})
    return out


def _deploy(opts: StackOptions, state_dir: Path, state: dict, *, log) -> None:
    prefect_file = write_deployments(opts, state_dir, state)
    env = {**os.environ, **prefect_env(opts, state_dir), MARKER_ENV: state["marker"]}
    prefect = str(Path(sys.executable).with_name("prefect"))
    pool = work_pool()
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
                             f"{log_pointer(cli_log)}")
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
    u.add_argument("--stabilization-s", type=float, default=None, help="override the scale-down stabilization window, s (the scale-down floor's window no longer than it)")
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
                        "mocker workers on CPU, scaled by the fleet executor, loaded over HTTP; vllm: real vLLM "
                        "0.32 engines on CPU behind the routing service, scaled by the fleet executor")
    u.add_argument("--vllm-model-config", default=d.vllm_model_config,
                   help="--fleet vllm: config.json of the tiny model the engines serve with random weights "
                        "(default: ../shared/llmd/vllm/tiny-model-config.json beside the project)")
    u.add_argument("--vllm-max-num-seqs", type=int, default=d.vllm_max_num_seqs,
                   help="--fleet vllm: requests one engine runs at once (vLLM's --max-num-seqs); the rest wait in "
                        "its queue, which the saturation guardrail reads (default: %(default)s)")
    u.add_argument("--max-in-flight", type=int, default=d.max_in_flight,
                   help="--fleet dynamo|vllm: the load generator keeps at most this many requests outstanding and "
                        "sheds (counts, never sends) arrivals beyond them (default: open loop, every arrival sent)")
    u.add_argument("--mocker-speedup", type=float, default=d.mocker_speedup,
                   help="--fleet dynamo: mocker engines run this many times faster than profiled (default: 1)")
    u.add_argument("--max-workers", type=int, default=d.max_workers,
                   help="--fleet dynamo|vllm: the planner's most workers per pool; each is a mocker process (a "
                        "vLLM engine: ~3 GB, keep it at 2 on two cores) on this machine (default: %(default)s)")
    u.add_argument("--prefect-db", choices=("sqlite", "postgres"), default=d.prefect_db,
                   help="the Prefect server's database: sqlite in the state folder (default), or postgres: Debian's "
                        "PostgreSQL started by the stack on 127.0.0.1 with its cluster in the state folder, for many "
                        "deployments a minute (docs/control-plane.md)")
    u.add_argument("--postgres-port", type=int, default=d.postgres_port,
                   help="--prefect-db postgres: its port (default: a free one)")
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
        max_workers=args.max_workers, vllm_model_config=args.vllm_model_config,
        vllm_max_num_seqs=args.vllm_max_num_seqs, max_in_flight=args.max_in_flight, prefect_db=args.prefect_db,
        postgres_port=args.postgres_port,
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

"""`sla-planner router`: run the routing service, or register an endpoint with one.

Serve (default):

    SLA_ROUTER_TOKEN=... SLA_ROUTER_DATA_TOKEN=... sla-planner router --host 0.0.0.0 --port 8080 \\
        --config configs/routing.yaml

The admin token (model publishing, rollback, endpoint registration, samples)
comes only from the environment variable named in the config (default
SLA_ROUTER_TOKEN); there is no default token: without it the admin API
answers 403. The data-plane token (route, lifecycle, pushed metrics, reads)
comes from auth.data_token_env (default SLA_ROUTER_DATA_TOKEN); without it
the data plane is open, with a warning. Without --config, --profile-dir is
enough for a service with defaults.

Register (run beside an engine, e.g. as an init container):

    sla-planner router register --router-url http://router:8080 --id pf-0 --role prefill \\
        --url http://10.0.0.5:8000 --labels-dir /etc/podinfo --level zone

reads topology domains from one file per level in --labels-dir (a Downward
API volume), waiting up to --wait-s for the --level file, then registers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from planner_cli.command import command_parser


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "router", doc=__doc__,
                       help="run the SLO/topology-aware routing service (or register an endpoint with it)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port (default: %(default)s)")
    p.add_argument("--config", default=None, help="routing config YAML (RouterConfig)")
    p.add_argument("--profile-dir", default=None, help="profile folder; overrides the config's profile_dir")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--llmd-listen", default=None, metavar="HOST:PORT",
                   help="also serve llm-d's latency-predictor API (an EPP's prediction and training sidecar routes) "
                        "on this address; overrides the config's llmd.listen. No token: keep it on 127.0.0.1")
    sub = p.add_subparsers(dest="router_command", metavar="{register}")
    sub.required = False
    r = sub.add_parser("register", help="register this engine with a running router")
    r.add_argument("--router-url", required=True, help="base URL of the routing service")
    r.add_argument("--id", required=True, help="endpoint id")
    r.add_argument("--role", required=True, choices=["prefill", "decode", "aggregated"])
    r.add_argument("--url", default=None, help="engine base URL (scraped for /metrics)")
    r.add_argument("--domain", action="append", default=[], metavar="LEVEL=VALUE", help="topology domain, repeatable")
    r.add_argument("--labels-dir", default=None, help="read domains from one file per level here")
    r.add_argument("--levels", default="zone,rack,host", help="levels to read from --labels-dir (default: %(default)s)")
    r.add_argument("--level", default=None, help="the KV-transfer level whose file must exist")
    r.add_argument("--wait-s", type=float, default=30.0, help="how long to wait for the --level file (default: %(default)s)")
    r.add_argument("--poll-s", type=float, default=1.0, help="retry period while waiting (default: %(default)s)")
    r.add_argument("--max-kv-tokens", type=int, default=None)
    r.add_argument("--token-env", default="SLA_ROUTER_TOKEN", help="env var holding the admin token")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "router_command", None) == "register":
        return _register(args)
    return _serve(args)


def load_router_config(path: str | None, *, profile_dir: str | None):
    """RouterConfig from a YAML file (or defaults), with profile_dir overridden."""
    from planner.config import parse_yaml
    from routing.config import RouterConfig

    if path is None:
        if profile_dir is None:
            raise ValueError("give --config or --profile-dir (the latency estimate needs a profile)")
        return RouterConfig(profile_dir=profile_dir)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    cfg = parse_yaml(text, RouterConfig, source=path)
    if profile_dir is not None:
        cfg = cfg.model_copy(update={"profile_dir": profile_dir})
    return cfg


def _serve(args: argparse.Namespace) -> int:
    import gc
    import logging

    import uvicorn

    from routing.config import LlmdConfig, listen_address
    from routing.http.app import create_app
    from routing.http.server import uvicorn_options
    from routing.fleet.topology import TopologyLabelError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_router_config(args.config, profile_dir=args.profile_dir)
        token = os.environ.get(cfg.auth.token_env) or None
        data_token = os.environ.get(cfg.auth.data_token_env) or None
        if args.llmd_listen is not None:
            listen_address(args.llmd_listen)  # a plain one-line ValueError naming it, not pydantic's report
            cfg = cfg.model_copy(update={"llmd": LlmdConfig(listen=args.llmd_listen)})
        app = create_app(cfg, token=token, data_token=data_token)
    except (ValueError, TopologyLabelError) as exc:
        print(f"sla-planner router: {exc}", file=sys.stderr)
        return 2
    llmd = _start_llmd(app.state.service, cfg.llmd.listen, args.log_level) if cfg.llmd.listen else None
    # Everything loaded so far lives for the whole process: keep it out of the
    # collector's full passes, which would otherwise pause routing for ms each.
    gc.collect()
    gc.freeze()
    # uvloop and httptools (declared dependencies) by name: uvicorn's "auto"
    # would fall back silently to the slower pure-Python loop and parser.
    # One worker process: the registry and in-flight state live in memory.
    # No proxy-header rewriting: rate limits and sample quotas key on the
    # client address, which a forged X-Forwarded-For must not change.
    # httptools under routing.http.server's protocol: it adds the request-head deadline and size limit.
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                    loop="uvloop", proxy_headers=False, **uvicorn_options(cfg))
    finally:
        if llmd is not None:
            llmd.should_exit = True
    return 0


def _start_llmd(service, listen: str, log_level: str):
    """llm-d's predictor API beside the routing service, sharing its models and samples (routing.llmd)."""
    import logging

    from routing.config import listen_address
    from routing.llmd.app import start_listener
    from routing.llmd.sidecar import LatencyPredictorSidecar

    host, port = listen_address(listen)
    log = logging.getLogger("sla_planner.routing")
    if host in ("127.0.0.1", "localhost", "::1"):
        log.info("llm-d latency-predictor API on http://%s:%d (loopback only: llm-d sends no token)", host, port)
    else:
        log.warning("llm-d latency-predictor API on http://%s:%d: llm-d sends no token, so anyone who can reach "
                    "this address can read predictions and post training rows; bind 127.0.0.1 unless a network "
                    "policy keeps others out", host, port)
    server, _ = start_listener(LatencyPredictorSidecar(service), host=host, port=port, log_level=log_level)
    return server


def _register(args: argparse.Namespace) -> int:
    import httpx

    from routing.fleet.topology import TopologyLabelError, read_domain_labels

    token = os.environ.get(args.token_env)
    if not token:
        print(f"sla-planner router register: set ${args.token_env} (the router's admin token)", file=sys.stderr)
        return 2
    domains: dict[str, str] = {}
    try:
        if args.labels_dir:
            levels = [lv for lv in args.levels.split(",") if lv]
            domains.update(read_domain_labels(
                args.labels_dir, levels=levels, required_level=args.level, wait_s=args.wait_s, poll_s=args.poll_s))
        for item in args.domain:
            level, sep, value = item.partition("=")
            if not sep or not level or not value:
                raise ValueError(f"--domain {item!r}: expected LEVEL=VALUE")
            domains[level] = value
    except (ValueError, TopologyLabelError) as exc:
        print(f"sla-planner router register: {exc}", file=sys.stderr)
        return 2
    body = {"role": args.role, "url": args.url, "domains": domains, "max_kv_tokens": args.max_kv_tokens}
    url = f"{args.router_url.rstrip('/')}/v1/endpoints/{args.id}"
    try:
        resp = httpx.put(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
    except httpx.HTTPError as exc:
        print(f"sla-planner router register: PUT {url}: {exc}", file=sys.stderr)
        return 1
    if resp.status_code >= 300:
        print(f"sla-planner router register: PUT {url}: HTTP {resp.status_code}: {resp.text}", file=sys.stderr)
        return 1
    print(f"registered {args.id} ({args.role}) domains={domains}")
    return 0

"""Live mode: the simulated fleet in wall-clock time, behind real interfaces.

`FleetSim` normally runs as fast as it can in virtual time. Here its clock
follows the wall clock (times `speed`), and it talks to the rest of the stack
the way a Dynamo deployment does:

- `/metrics` in Prometheus text: the series a Dynamo 1.6.1 frontend exports
  (requests_started_total at arrival, requests_total at completion, the TTFT /
  ITL / ISL / OSL histograms with its label sets and bucket boundaries), and per pod `vllm:kv_cache_usage_perc`,
  `vllm:num_requests_waiting` and `vllm:num_requests_running` (label `pod`,
  named `<prefix>prefill-N` / `<prefix>decode-N`, which the collector's
  default pod-name mapping attributes to the pools); `/status` as JSON.
- every request is routed by the routing service over HTTP (`/v1/route`),
  and its first token and completion are reported back as lifecycle events;
  workers register when ready and are drained there when they start draining
  (not picked; their requests still complete with samples), and
  push their load to the router every second.
- the virtual connector's etcd keys: a new `decision_id` makes the fleet
  start or drain workers (new ones serve after the startup delay), and
  `scaled_decision_id` is written once every pool has reached its target.

Nothing is dropped: requests are sent as critical (the router takes the
least negative headroom instead of shedding; shed load would hide demand
from the planner), and when the router is unreachable or answers an error
the fleet routes the request itself (least loaded) and counts the fallback.

Speed: simulated seconds per wall second. Prometheus stamps samples with the
wall clock, so at speed k the planner sees k times the trace's request rate;
keep speed 1 for faithful sizing and compress the trace (`time_scale`) or
multiply its load to make things happen sooner.

Run: `python -m sim.live --config live.yaml` (a `LiveConfig` file).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sim.live.config import load_config, make_tables
from sim.live.fleet import LiveFleet
from workloads.trace_shaping import build_trace

log = logging.getLogger("sla_planner.sim.live")


class _Handler(BaseHTTPRequestHandler):
    """The live fleet's HTTP server: /metrics, /status, /healthz."""

    fleet: LiveFleet

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.fleet.metrics_text(), CONTENT_TYPE_LATEST)
        elif path == "/status":
            self._send(200, json.dumps(self.fleet.status()).encode(), "application/json")
        elif path == "/healthz":
            ok = self.fleet.started
            self._send(200 if ok else 503, json.dumps({"status": "ok" if ok else "starting"}).encode(),
                       "application/json")
        else:
            self._send(404, b'{"error": "not_found"}', "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - quiet: Prometheus scrapes every second
        pass


def serve(fleet: LiveFleet) -> ThreadingHTTPServer:
    """/metrics, /status and /healthz on the configured address, in a daemon thread."""
    handler = type("Handler", (_Handler,), {"fleet": fleet})
    server = ThreadingHTTPServer((fleet.cfg.host, fleet.cfg.port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="live-http", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.live", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="LiveConfig YAML file")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per router call otherwise
    disable_created_metrics()  # a Dynamo frontend exports no _created series
    try:
        cfg = load_config(args.config)
        trace = build_trace(cfg)
        tables = make_tables(cfg)
    except (ValueError, OSError) as exc:
        print(f"sim.live: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get(cfg.router_token_env) or None
    if cfg.router_url and not token:
        print(f"sim.live: set ${cfg.router_token_env}: registering endpoints needs the router's admin token",
              file=sys.stderr)
        return 2
    data_token = os.environ.get(cfg.router_data_token_env) or None
    fleet = LiveFleet(cfg, trace=trace, tables=tables, token=token, data_token=data_token)
    server = serve(fleet)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("replaying %s (%d requests over %.0f s) at speed %g; metrics on http://%s:%d/metrics",
             trace.name, len(trace), trace.duration_s, cfg.speed, cfg.host, cfg.port)
    try:
        fleet.run(stop)
    finally:
        status = fleet.status()
        if cfg.status_path:
            Path(cfg.status_path).write_text(json.dumps(status, indent=1))
        server.shutdown()
        fleet.close()
        log.info("stopped at t=%.1f s: %d arrived, %d completed", status["sim_time_s"], status["arrived"],
                 status["completed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

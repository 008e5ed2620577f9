"""The live fleet's HTTP server (/metrics, /status, /healthz)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sim.live.fleet import LiveFleet


class _Handler(BaseHTTPRequestHandler):
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

"""The live fleet: a FleetSim stepped by the wall clock behind the interfaces of a Dynamo deployment.

Its etcd side (EtcdFollower) is the deployment environment's half of the virtual connector's keys:
read targets, confirm.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, generate_latest

from sim.config import SimConfig
from sim.engine import FleetSim
from sim.live.http_router import HttpRouter, RouterClient
from sim.live.config import LiveConfig
from sim.live.metrics import LiveSeries
from sim.lookup import ProfileTables
from workloads.traces import Trace

log = logging.getLogger("sla_planner.sim.live")


class LiveFleet:
    """A FleetSim stepped by the wall clock, with metrics, routing and the etcd protocol."""

    def __init__(self, cfg: LiveConfig, *, trace: Trace, tables: ProfileTables, clock=time.monotonic,
                 token: str | None = None, data_token: str | None = None):
        self.cfg = cfg
        self.trace = trace
        self.clock = clock
        self.lock = threading.RLock()
        self.follower = (EtcdFollower(cfg.etcd_url, namespace=cfg.namespace, key_prefix=cfg.key_prefix)
                         if cfg.etcd_url else None)
        self.applied_id: int | None = None  # newest decision the fleet follows
        self.confirmed_id: int | None = None  # newest decision written as scaled_decision_id
        self.decisions: list[dict] = []
        self.etcd_errors = 0
        self.etcd_last_error = ""
        self._confirm_failed_at = -math.inf
        prefill, decode = cfg.initial_prefill, cfg.initial_decode
        stored = self._read_etcd_at_start()
        if stored is not None and "decision_id" in stored:
            # The fleet was already running at the stored targets (a restart of this process).
            prefill, decode = stored.get("num_prefill_workers", prefill), stored.get("num_decode_workers", decode)
            self.applied_id = stored["decision_id"]
            self.confirmed_id = stored.get("scaled_decision_id")
        self.router: HttpRouter | None = None
        self.client: RouterClient | None = None
        if cfg.router_url:
            self.client = RouterClient(cfg.router_url, token=token, data_token=data_token,
                                       timeout_s=cfg.router_timeout_s)
            self.router = HttpRouter(
                self.client, pod_prefix=cfg.pod_prefix, ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms,
                retry_after_s=cfg.router_retry_after_s, max_kv_tokens=tables.max_kv_tokens,
                request_prefix=f"{cfg.pod_prefix}{os.getpid()}-{int(time.time())}-", clock=clock,
            )
        self.sim = FleetSim(trace, tables, config=SimConfig(startup_s=cfg.startup_s), router=self.router,
                            initial_prefill=max(prefill, 1), initial_decode=max(decode, 1))
        if self.router is not None:
            self.router.sim = self.sim
            self.router.forget_foreign_endpoints()
        self.registry = CollectorRegistry(auto_describe=True)
        self.series = LiveSeries(self.registry, self)
        self.in_flight: dict[int, bool] = {}  # arrived, unfinished request -> first token reported
        self._seen_arrivals = 0
        self.wall0 = clock()
        self.unix0 = time.time()
        self.lag_s = 0.0
        self.started = False

    # -- clock ---------------------------------------------------------------

    def sim_time(self, wall_s: float | None = None) -> float:
        return ((self.clock() if wall_s is None else wall_s) - self.wall0) * self.cfg.speed

    @property
    def finished(self) -> bool:
        return self.sim.done

    # -- main loop -------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Step the simulation every tick until `stop` is set."""
        cfg = self.cfg
        next_etcd = next_push = self.clock()
        self.started = True
        while not stop.is_set():
            tick_start = self.clock()
            self.step(self.sim_time(tick_start))
            if self.follower is not None and tick_start >= next_etcd:
                self.follow_etcd()
                next_etcd = tick_start + cfg.etcd_poll_s
            if self.router is not None and tick_start >= next_push:
                with self.lock:
                    self.router.sync_endpoints()
                    self.router.push_load(self.sim.now_s)
                next_push = tick_start + cfg.metrics_push_s
            elapsed = self.clock() - tick_start
            self.lag_s = max(0.0, elapsed - cfg.tick_s)
            stop.wait(max(0.0, cfg.tick_s - elapsed))

    def step(self, t_s: float) -> None:
        """Advance to simulated time t_s and export what happened."""
        with self.lock:
            if t_s > self.sim.now_s:
                self.sim.run_until(t_s)
            self._export_requests()
            if self.clock() - self._confirm_failed_at >= self.cfg.etcd_poll_s:
                self._confirm_if_scaled()

    def _export_requests(self) -> None:
        sim = self.sim
        for rid in range(self._seen_arrivals, sim.next_arrival):
            self.series.started.inc()
            self.series.isl.observe(sim.isl[rid])
            self.in_flight[rid] = False
        self._seen_arrivals = sim.next_arrival
        done = []
        for rid, reported in self.in_flight.items():
            first = sim.first_token_s[rid]
            if not reported and first == first:
                ttft_s = first - sim.arrival_s[rid]
                self.series.ttft.observe(ttft_s)
                self.in_flight[rid] = True
                self._event(rid, "first_token", {"observed_ttft_ms": ttft_s * 1e3})
            finish = sim.finish_s[rid]
            if finish == finish:
                done.append(rid)
        for rid in done:
            del self.in_flight[rid]
            osl = int(sim.osl[rid])
            self.series.osl.observe(osl)
            ttft_s = sim.first_token_s[rid] - sim.arrival_s[rid]
            body = {"output_tokens": osl, "observed_ttft_ms": ttft_s * 1e3}
            if osl > 1:
                itl_s = (sim.finish_s[rid] - sim.first_token_s[rid]) / (osl - 1)
                self.series.itl.observe(itl_s)
                body["observed_tpot_ms"] = itl_s * 1e3
            self.series.completed.inc()
            self.series.finished.inc()
            self._event(rid, "completed", body)
            if self.router is not None:
                self.router.tracked.discard(rid)

    def _event(self, rid: int, kind: str, body: dict) -> None:
        if self.router is not None and rid in self.router.tracked:
            self.client.post_later("POST", f"/v1/requests/{self.router.request_prefix}{rid}/{kind}", body)

    # -- etcd --------------------------------------------------------------------

    def _read_etcd_at_start(self) -> dict | None:
        if self.follower is None:
            return None
        try:
            return self.follower.read()
        except Exception as exc:  # noqa: BLE001 - etcd down at start: follow it once it is up
            self._etcd_failed("reading the keys at start", exc)
            return None

    def follow_etcd(self) -> None:
        """Apply a new decision's targets; confirm the newest one once it is carried out."""
        try:
            stored = self.follower.read()
        except Exception as exc:  # noqa: BLE001 - any etcd failure: retry at the next poll
            self._etcd_failed("reading the keys", exc)
            return
        decision_id = stored.get("decision_id")
        with self.lock:
            if decision_id is not None and (self.applied_id is None or decision_id > self.applied_id):
                prefill, decode = stored.get("num_prefill_workers"), stored.get("num_decode_workers")
                if prefill is None or decode is None:
                    self._etcd_failed("reading the targets", ValueError(f"decision {decision_id} has no targets"))
                    return
                now = self.sim.now_s
                self.sim.set_target("prefill", prefill, now)
                self.sim.set_target("decode", decode, now)
                self.applied_id = decision_id
                self.decisions.append({"decision_id": decision_id, "prefill": prefill, "decode": decode,
                                       "seen_sim_s": now, "seen_unix_s": time.time(), "confirmed_unix_s": None})
                log.info("decision %d: prefill -> %d, decode -> %d (t=%.1f s)", decision_id, prefill, decode, now)
            self._confirm_if_scaled()

    def _confirm_if_scaled(self) -> None:
        """Write scaled_decision_id once both pools serve exactly their targets."""
        if self.follower is None or self.applied_id is None:
            return
        if self.confirmed_id is not None and self.confirmed_id >= self.applied_id:
            return
        sim = self.sim
        for pool in ("prefill", "decode"):
            live = sim.live_workers(pool)
            if any(not w.ready for w in live) or sim.ready_count(pool) != len(live):
                return
        try:
            self.follower.confirm(self.applied_id)
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            self._etcd_failed(f"writing scaled_decision_id {self.applied_id}", exc)
            self._confirm_failed_at = self.clock()
            return
        self.confirmed_id = self.applied_id
        for d in self.decisions:
            if d["confirmed_unix_s"] is None and d["decision_id"] <= self.applied_id:
                d["confirmed_unix_s"] = time.time()
                d["confirmed_sim_s"] = sim.now_s
        log.info("decision %d carried out (t=%.1f s)", self.applied_id, sim.now_s)

    def _etcd_failed(self, doing: str, exc: Exception) -> None:
        self.etcd_errors += 1
        message = f"etcd {self.cfg.etcd_url}: {doing}: {type(exc).__name__}: {exc}"
        if message != self.etcd_last_error:
            log.warning("%s", message)
        self.etcd_last_error = message

    def status(self) -> dict:
        """What the fleet is doing, for people and tests (GET /status)."""
        with self.lock:
            sim = self.sim
            pools = {}
            for pool in ("prefill", "decode"):
                workers = sim.prefill_workers if pool == "prefill" else sim.decode_workers
                pools[pool] = {
                    "target": len(sim.live_workers(pool)),
                    "ready": sim.ready_count(pool),
                    "starting": sum(1 for w in workers if not w.ready and not w.retired),
                    "draining": sum(1 for w in workers if w.draining and not w.retired),
                }
            out = {
                "trace": {"name": self.trace.name, "requests": len(self.trace), "duration_s": self.trace.duration_s},
                "speed": self.cfg.speed,
                "started_unix_s": self.unix0,
                "sim_time_s": sim.now_s,
                "lag_s": self.lag_s,
                "arrived": sim.next_arrival,
                "completed": sim.completed,
                "in_flight": len(self.in_flight),
                "finished": sim.done,
                "workers": pools,
                "decisions": {"applied": self.applied_id, "confirmed": self.confirmed_id, "log": list(self.decisions),
                              "etcd_errors": self.etcd_errors, "etcd_last_error": self.etcd_last_error},
            }
            if self.router is not None:
                r = self.router
                out["router"] = {"url": self.client.base_url, "routed": r.routed, "fallbacks": dict(r.fallbacks),
                                 "model_versions": dict(r.model_versions), "registered": sorted(r.registered),
                                 "events_sent": self.client.events_sent, "events_failed": self.client.events_failed,
                                 "last_error": r.last_error}
            return out

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class EtcdFollower:
    """The deployment environment's side of the virtual protocol: read targets, confirm."""

    def __init__(self, etcd_url: str, *, namespace: str, key_prefix: str = "v1/{namespace}/planner/",
                 timeout_s: float = 2.0):
        from etcd3gw.client import Etcd3Client

        from connectors.virtual import KEY_DECISION_ID, KEY_DECODE, KEY_PREFILL, KEY_SCALED_ID

        parts = urlsplit(etcd_url)
        self.url = etcd_url
        self.prefix = key_prefix.format(namespace=namespace)
        self.keys = (KEY_DECISION_ID, KEY_PREFILL, KEY_DECODE, KEY_SCALED_ID)
        self._client = Etcd3Client(host=parts.hostname or "127.0.0.1", port=parts.port or 2379,
                                   protocol=parts.scheme or "http", timeout=timeout_s)

    def read(self) -> dict[str, int]:
        """The stored integer keys that exist (decision_id, targets, scaled_decision_id)."""
        out: dict[str, int] = {}
        for value, meta in self._client.get_prefix(self.prefix):
            key = meta["key"].decode() if isinstance(meta["key"], bytes) else meta["key"]
            name = key[len(self.prefix):]
            if name in self.keys:
                try:
                    out[name] = int(value.decode())
                except ValueError:
                    raise ValueError(f"etcd {key}: expected an integer, got {value!r}") from None
        return out

    def confirm(self, decision_id: int) -> None:
        self._client.put(self.prefix + self.keys[3], str(decision_id))

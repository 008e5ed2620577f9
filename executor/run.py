"""The fleet executor's loop: Dynamo's VirtualConnectorClient in, worker processes out.

Runs in the Dynamo environment (it imports `dynamo._core`), as
`python -m executor --config FILE` with the project on PYTHONPATH, or through
`sla-planner fleet-executor`. Each decision the planner publishes under
`v1/{namespace}/planner/` is carried out and acknowledged:

1. `client.wait()` returns when there is an unacknowledged decision; `get()` reads it
   (-1: that count is absent, its role keeps what it has);
2. drains (SIGTERM, the worker finishes its in-flight requests) and starts
   (lowest free slots) bring each role to its target (executor.reconcile);
3. once Dynamo's discovery shows exactly the target number of instances for each
   role's endpoint, `client.complete(decision)` writes `scaled_decision_id`.

Dynamo leases that ack to this process: it stands while the executor lives, and
after an executor restart the same decision is seen again, found already
carried out (the workers are adopted, not doubled) and acknowledged again.
Between decisions the loop supervises: a worker that dies unasked is started
again in its slot (after a backoff that doubles per death, reset once it
registers), so the fleet returns to the decided size without a new decision.
Events go to `<state_dir>/events.jsonl`, one JSON object per line.

Engines outside Dynamo's discovery (a role with `ready_url`, e.g. plain vLLM
servers) count as registered once that URL answers 200. With `router` set, a
worker is registered with the routing service (PUT /v1/endpoints/<role>-<slot>)
once it serves, and a drain takes it out of routing first (DELETE
...?drain=true: no new picks, its requests in flight finish), then sends
SIGTERM when the router has dropped it, i.e. after its last request completed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from executor.config import ExecutorConfig
from executor.reconcile import Drain, Role, Start, reconcile
from executor.workers import WorkerTable

log = logging.getLogger("executor")


class EventLog:
    """Append-only JSON lines of what the executor did, for operators and tests."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, event: str, **fields) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps({"t_s": round(time.time(), 3), "event": event, **fields}) + "\n")


class Executor:
    def __init__(self, cfg: ExecutorConfig):
        self.cfg = cfg
        self.table = WorkerTable(cfg)
        self.event = EventLog(cfg.state_path / "events.jsonl")
        self.targets: dict[Role, int] = dict(cfg.initial_workers)
        # An aggregated role runs max(prefill, decode) of the newest counts the planner gave for each.
        self._asked: dict[str, int] = {"prefill": cfg.initial_workers.get("aggregated", 0),
                                       "decode": cfg.initial_workers.get("aggregated", 0)}
        self._routed: set[str] = set()  # endpoint ids registered with the router by this process
        self._restart_at: dict[tuple[Role, int], float] = {}
        self._backoff: dict[tuple[Role, int], float] = {}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        from dynamo._core import DistributedRuntime, VirtualConnectorClient

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        os.environ["ETCD_ENDPOINTS"] = self.cfg.etcd_url  # Dynamo's runtime reads it
        adopted = self.table.adopt()
        self.event("start", adopted=[{"role": p.role, "slot": p.slot, "pid": p.pid} for p in adopted])
        runtime = DistributedRuntime(loop, "etcd", "tcp", event_plane="zmq")
        try:
            client = VirtualConnectorClient(runtime, self.cfg.namespace)
            self._counters = {role: await runtime.endpoint(rc.endpoint).client()
                              for role, rc in self.cfg.roles.items() if rc.endpoint is not None}
            first = await client.get()
            if first.decision_id >= 0:
                self._take(first)
            self._apply(time.time())
            decisions: asyncio.Queue = asyncio.Queue()
            acked = asyncio.Event()
            watcher = asyncio.create_task(self._watch(client, decisions, acked))
            pending, taken_at_s, warned, was_ready = None, 0.0, False, False
            while not self._stop.is_set():
                try:
                    pending = await asyncio.wait_for(decisions.get(), timeout=self.cfg.poll_s)
                    taken_at_s, warned = time.time(), False
                    self._take(pending)
                    self.event("decision", decision_id=pending.decision_id, targets=self.targets)
                except asyncio.TimeoutError:
                    pass
                now_s = time.time()
                self._supervise(now_s)
                self._apply(now_s)
                self._route()
                if pending is not None and not warned and now_s - taken_at_s > self.cfg.register_timeout_s:
                    warned = True
                    log.warning("decision %d not carried out after %.0f s: targets %s, serving and registered %s",
                                pending.decision_id, now_s - taken_at_s, self.targets, self._registered())
                    self.event("slow", decision_id=pending.decision_id, registered=self._registered())
                ready = self._carried_out()
                if ready and not was_ready:
                    self.event("fleet_ready", targets=dict(self.targets), registered=self._registered())
                was_ready = ready
                if pending is not None and ready:
                    await client.complete(pending)
                    self.event("ack", decision_id=pending.decision_id, registered=self._registered())
                    log.info("decision %d carried out and acknowledged: %s", pending.decision_id, self.targets)
                    pending = None
                    acked.set()
            watcher.cancel()
        finally:
            self.event("stop", workers=len(self.table.procs))
            runtime.shutdown()

    async def _watch(self, client, decisions: asyncio.Queue, acked: asyncio.Event) -> None:
        """Hand each unacknowledged decision to the loop, one at a time."""
        while True:
            await client.wait()
            decision = await client.get()
            acked.clear()
            await decisions.put(decision)
            await acked.wait()

    def _take(self, decision) -> None:
        for role, value in (("prefill", decision.num_prefill_workers), ("decode", decision.num_decode_workers)):
            if value >= 0:
                self._asked[role] = value
                if role in self.cfg.roles:
                    self.targets[role] = value
        if "aggregated" in self.cfg.roles:
            self.targets["aggregated"] = max(self._asked.values())

    def _apply(self, now_s: float) -> None:
        for action in reconcile(self.targets, self.table.workers()):
            if isinstance(action, Drain):
                routed = self._endpoint_id(action.worker.role, action.worker.slot) in self._routed
                if routed:
                    self._router_call("DELETE", f"{self._endpoint_id(action.worker.role, action.worker.slot)}"
                                                "?drain=true")
                self.table.drain(action.worker, signal_now=not routed)
                self.event("drain", role=action.worker.role, slot=action.worker.slot, pid=action.worker.pid,
                           out_of_routing_first=routed)
            elif isinstance(action, Start):
                key = (action.role, action.slot)
                if now_s < self._restart_at.get(key, 0.0):
                    continue
                proc = self.table.start(action.role, action.slot)
                self.event("start_worker", role=action.role, slot=action.slot, pid=proc.pid)

    def _supervise(self, now_s: float) -> None:
        for proc in self.table.reap(now_s=now_s):
            key = (proc.role, proc.slot)
            delay = self._backoff.get(key, self.cfg.restart_backoff_s)
            self._restart_at[key] = now_s + delay
            self._backoff[key] = min(max(delay, 0.5) * 2, 60.0)
            self.event("worker_died", role=proc.role, slot=proc.slot, pid=proc.pid, restart_in_s=delay)
        if self._carried_out():
            self._backoff.clear()

    def _registered(self) -> dict[str, int]:
        """Per role, the workers that serve: Dynamo's discovery count, or those whose ready_url answers 200."""
        out = {}
        for role, rc in self.cfg.roles.items():
            if rc.endpoint is not None:
                out[role] = len(self._counters[role].instance_ids())
            else:
                out[role] = sum(1 for p in self._serving(role) if self._ready(p))
        return out

    def _serving(self, role: str) -> list:
        return [p for p in self.table.procs if p.role == role and p.draining_since_s is None]

    def _ready(self, proc) -> bool:
        rc = self.cfg.roles[proc.role]
        try:
            with urllib.request.urlopen(rc.fill(rc.ready_url, role=proc.role, slot=proc.slot), timeout=1.0) as resp:
                return resp.status == 200
        except (OSError, ValueError):
            return False

    def _carried_out(self) -> bool:
        """Every role has exactly its target: serving processes and registered instances."""
        serving = {role: len(self._serving(role)) for role in self.cfg.roles}
        registered = self._registered()
        return all(serving[r] == self.targets.get(r, 0) == registered[r] for r in self.cfg.roles)

    # -- the routing service ------------------------------------------------------

    @staticmethod
    def _endpoint_id(role: str, slot: int) -> str:
        return f"{role}-{slot}"

    def _route(self) -> None:
        """Register workers that serve now; SIGTERM draining ones the router has let go of."""
        if self.cfg.router is None:
            return
        for proc in self.table.procs:
            eid = self._endpoint_id(proc.role, proc.slot)
            if proc.draining_since_s is None and eid not in self._routed and self._ready(proc):
                rc = self.cfg.roles[proc.role]
                body = {"role": proc.role, "url": rc.fill(rc.router_url, role=proc.role, slot=proc.slot)}
                if self._router_call("PUT", eid, body) is not None:
                    self._routed.add(eid)
                    self.event("routed", role=proc.role, slot=proc.slot, endpoint_id=eid)
        draining = [p for p in self.table.procs if p.draining_since_s is not None and p.terminated_at_s is None]
        if not draining:
            return
        listed = self._router_call("GET", "")
        if listed is None:
            return  # router unreachable: keep waiting (SIGKILL after drain_timeout_s still applies)
        known = {e.get("id") for e in listed} if isinstance(listed, list) else set()
        for proc in draining:
            eid = self._endpoint_id(proc.role, proc.slot)
            if eid not in known:
                self._routed.discard(eid)
                self.table.terminate(proc)
                self.event("drained_from_routing", role=proc.role, slot=proc.slot, endpoint_id=eid)

    def _router_call(self, method: str, path: str, body: dict | None = None):
        """One admin call to /v1/endpoints/<path>; the JSON answer, or None (logged) when it failed."""
        router = self.cfg.router
        url = f"{router.url.rstrip('/')}/v1/endpoints" + (f"/{path}" if path else "")
        headers = {"Content-Type": "application/json"}
        token = os.environ.get(router.token_env if method != "GET" else router.data_token_env)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers),
                                        timeout=router.request_timeout_s) as resp:
                text = resp.read()
                return json.loads(text) if text else {}
        except urllib.error.HTTPError as exc:
            log.warning("router %s %s: HTTP %d %s", method, url, exc.code, exc.read()[:300])
        except (OSError, ValueError) as exc:
            log.warning("router %s %s: %s", method, url, exc)
        return None


def main(cfg: ExecutorConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s executor: %(message)s")
    asyncio.run(Executor(cfg).run())

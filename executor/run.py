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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path

from executor.config import ExecutorConfig
from executor.reconcile import ROLES, Drain, Role, Start, reconcile
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
            self._counters = {role: await runtime.endpoint(self.cfg.roles[role].endpoint).client() for role in ROLES}
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
                self.targets[role] = value

    def _apply(self, now_s: float) -> None:
        for action in reconcile(self.targets, self.table.workers()):
            if isinstance(action, Drain):
                self.table.drain(action.worker)
                self.event("drain", role=action.worker.role, slot=action.worker.slot, pid=action.worker.pid)
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
        return {role: len(self._counters[role].instance_ids()) for role in ROLES}

    def _carried_out(self) -> bool:
        """Every role has exactly its target: serving processes and registered instances."""
        serving = {role: sum(1 for p in self.table.procs if p.role == role and p.draining_since_s is None)
                   for role in ROLES}
        registered = self._registered()
        return all(serving[r] == self.targets[r] == registered[r] for r in ROLES)


def main(cfg: ExecutorConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s executor: %(message)s")
    asyncio.run(Executor(cfg).run())

"""The executor's worker processes: start, drain, reap, and a table that survives a restart.

Each worker runs in its own session (so a Ctrl-C aimed at the executor does
not reach it, and it outlives an executor restart), with its output in
`<state_dir>/logs/<role>-<slot>.log` and its temporary files in its own
`<state_dir>/tmp/<role>-<slot>-<started ms>` (its TMPDIR), removed once it has
exited: a worker killed or crashed leaves no litter in the system's /tmp (the
1.6.1 mocker converts its profile into a temporary folder it removes only on a
clean exit). The table, `<state_dir>/workers.json`,
records each worker's pid and the kernel's start time of that pid, so a
restarted executor adopts exactly its own live workers and never a recycled
pid. `<state_dir>/targets.json` lists the live workers' metrics endpoints in
Prometheus' file_sd format.

Draining is SIGTERM: a Dynamo worker deregisters at once (no new requests)
and finishes its in-flight requests before it exits (measured on the 1.6.1
mocker: a 6000-token request completed 2.7 s after the signal); SIGKILL only
after drain_timeout_s. A worker the routing service sends requests to is
drained in two steps: marked draining without a signal (`signal=False`: the
executor takes it out of routing first), then `terminate` once its last
request has finished; SIGKILL still after drain_timeout_s from the first step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from executor.config import ExecutorConfig
from executor.reconcile import Role, Worker

log = logging.getLogger("executor")


def process_start_ticks(pid: int) -> int | None:
    """The kernel's start time of pid (clock ticks since boot), None if no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # zombie or dead: gone for our purposes
        return None
    return int(fields[19])


def worker_tmp_dir(state_dir: Path, role: str, slot: int, started_at_s: float) -> Path:
    """The TMPDIR of the worker started in `slot` at `started_at_s`: `<state_dir>/tmp/<role>-<slot>-<ms>`."""
    return state_dir / "tmp" / f"{role}-{slot}-{int(started_at_s * 1000)}"


@dataclass
class Proc:
    """A worker process and what the table stores about it."""

    role: Role
    slot: int
    pid: int
    start_ticks: int
    started_at_s: float
    draining_since_s: float | None = None
    terminated_at_s: float | None = None  # SIGTERM sent (draining workers wait for it while routing empties them)
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def tmp_dir(self, state_dir: Path) -> Path:
        """The worker's own TMPDIR under the executor's state folder."""
        return worker_tmp_dir(state_dir, self.role, self.slot, self.started_at_s)

    @property
    def worker(self) -> Worker:
        return Worker(self.role, self.slot, self.pid, draining=self.draining_since_s is not None)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return process_start_ticks(self.pid) == self.start_ticks


_STORED = ("role", "slot", "pid", "start_ticks", "started_at_s", "draining_since_s", "terminated_at_s")
_OPTIONAL = ("terminated_at_s",)  # absent from tables an older executor wrote


class WorkerTable:
    """The live workers of one executor, persisted in its state folder."""

    def __init__(self, cfg: ExecutorConfig):
        self.cfg = cfg
        self.dir = cfg.state_path
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "workers.json"
        self.procs: list[Proc] = []

    # -- persistence -------------------------------------------------------

    def adopt(self) -> list[Proc]:
        """Load the table and keep the workers still running as recorded; returns them."""
        if not self.path.exists():
            return []
        try:
            rows = json.loads(self.path.read_text())
            procs = [Proc(**{k: row[k] for k in _STORED if k not in _OPTIONAL or k in row}) for row in rows]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.path}: worker table is not valid ({exc}); move it aside to start afresh") from None
        self.procs = [p for p in procs if p.alive()]
        self._save()
        self._remove_stale_tmp()
        return list(self.procs)

    def _save(self) -> None:
        rows = [{k: getattr(p, k) for k in _STORED} for p in self.procs]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, self.path)
        targets = [
            {"targets": [f"127.0.0.1:{self.cfg.roles[p.role].system_port_base + p.slot}"],
             "labels": {"role": p.role, "slot": str(p.slot), "dynamo_namespace": self.cfg.namespace}}
            for p in self.procs if p.draining_since_s is None
        ]
        tmp = self.dir / "targets.tmp"
        tmp.write_text(json.dumps(targets, indent=1))
        os.replace(tmp, self.dir / "targets.json")

    # -- actions -----------------------------------------------------------

    def workers(self) -> list[Worker]:
        return [p.worker for p in self.procs]

    def start(self, role: Role, slot: int) -> Proc:
        rc = self.cfg.roles[role]
        port = rc.system_port_base + slot
        argv = [rc.fill(arg, role=role, slot=slot, python=sys.executable) for arg in rc.command]
        started_at_s = time.time()
        tmp = worker_tmp_dir(self.dir, role, slot, started_at_s)
        tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **rc.env, "DYN_SYSTEM_PORT": str(port), "ETCD_ENDPOINTS": self.cfg.etcd_url,
               "TMPDIR": str(tmp)}
        log_path = self.dir / "logs" / f"{role}-{slot}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        ticks = process_start_ticks(popen.pid) or 0
        proc = Proc(role, slot, popen.pid, ticks, started_at_s, popen=popen)
        self.procs.append(proc)
        self._save()
        log.info("started %s worker slot %d (pid %d, metrics port %d)", role, slot, popen.pid, port)
        return proc

    def drain(self, worker: Worker, *, signal_now: bool = True) -> None:
        """Stop counting the worker as serving; SIGTERM now, or (signal_now False) at `terminate`."""
        proc = self._find(worker)
        if proc is None or proc.draining_since_s is not None:
            return
        proc.draining_since_s = time.time()
        if signal_now:
            self.terminate(proc)
        else:
            self._save()
            log.info("draining %s worker slot %d (pid %d): out of routing, SIGTERM after its last request",
                     proc.role, proc.slot, proc.pid)

    def terminate(self, proc: Proc) -> None:
        """SIGTERM a draining worker (once)."""
        if proc.terminated_at_s is not None:
            return
        proc.terminated_at_s = time.time()
        self._signal(proc, signal.SIGTERM)
        self._save()
        log.info("draining %s worker slot %d (pid %d): SIGTERM", proc.role, proc.slot, proc.pid)

    def reap(self, *, now_s: float) -> list[Proc]:
        """Forget exited workers; SIGKILL drains past their timeout. Returns the ones that died unasked."""
        died, kept = [], []
        for proc in self.procs:
            if proc.alive():
                if proc.draining_since_s is not None and now_s - proc.draining_since_s > self.cfg.drain_timeout_s:
                    log.warning("%s worker slot %d (pid %d) still running %.0f s after SIGTERM: SIGKILL",
                                proc.role, proc.slot, proc.pid, now_s - proc.draining_since_s)
                    self._signal(proc, signal.SIGKILL)
                kept.append(proc)
                continue
            if proc.draining_since_s is None:
                code = proc.popen.returncode if proc.popen is not None else "unknown (adopted)"
                log.warning("%s worker slot %d (pid %d) exited unasked, exit code %s", proc.role, proc.slot,
                            proc.pid, code)
                died.append(proc)
            else:
                log.info("%s worker slot %d (pid %d) drained and exited after %.1f s", proc.role, proc.slot,
                         proc.pid, now_s - proc.draining_since_s)
        if len(kept) != len(self.procs):
            self.procs = kept
            self._save()
            self._remove_stale_tmp()
        return died

    def _remove_stale_tmp(self) -> None:
        """Remove the temporary folders of workers no longer in the table (exited, or gone before an adoption)."""
        root = self.dir / "tmp"
        live = {p.tmp_dir(self.dir).name for p in self.procs}
        for path in root.iterdir() if root.is_dir() else ():
            if path.name not in live:
                shutil.rmtree(path, ignore_errors=True)

    def stop_all(self) -> None:
        """Drain every worker and wait for them (SIGKILL after the drain timeout)."""
        for proc in list(self.procs):
            self.drain(proc.worker)
        while self.procs:
            self.reap(now_s=time.time())
            time.sleep(0.1)

    def _find(self, worker: Worker) -> Proc | None:
        return next((p for p in self.procs if p.pid == worker.pid and p.slot == worker.slot), None)

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the worker leads its own session: its children go too
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(proc.pid, sig)

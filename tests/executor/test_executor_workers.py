"""executor.workers: the worker processes the executor starts (plain Python processes standing in for workers)."""

from __future__ import annotations

import os
import signal
import time

from executor.config import ExecutorConfig
from executor.workers import WorkerTable


def test_a_worker_gets_its_own_tmpdir_removed_once_it_has_exited(tmp_path):
    """Each worker's TMPDIR is its own folder under the state dir; a worker killed (no clean exit, as a
    SIGKILLed mocker leaves its converted profile behind) leaves no folder once reaped or re-adopted."""
    script = ("import os, pathlib, time; pathlib.Path(os.environ['TMPDIR'], 'scratch').write_text('x'); "
              "time.sleep(60)")
    role = {"command": ["{python}", "-c", script], "endpoint": "dyn.prefill.generate", "system_port_base": 9300}
    cfg = ExecutorConfig(state_dir=str(tmp_path / "s"),
                         roles={"prefill": role, "decode": {**role, "system_port_base": 9400}})
    table = WorkerTable(cfg)
    a, b = table.start("prefill", 0), table.start("decode", 0)
    dirs = {p.pid: p.tmp_dir(table.dir) for p in (a, b)}
    deadline = time.monotonic() + 30
    while not all((d / "scratch").exists() for d in dirs.values()):
        assert time.monotonic() < deadline, "the workers never wrote to their TMPDIR"
        time.sleep(0.05)
    assert all(d.parent == table.dir / "tmp" for d in dirs.values()) and len(set(dirs.values())) == 2
    os.kill(a.pid, signal.SIGKILL)
    a.popen.wait(timeout=10)
    [died] = table.reap(now_s=time.time())
    assert died.pid == a.pid
    assert not dirs[a.pid].exists() and (dirs[b.pid] / "scratch").exists()
    # A restarted executor adopts the live worker and clears what a worker gone meanwhile left.
    b.popen.kill()
    b.popen.wait(timeout=10)
    assert WorkerTable(cfg).adopt() == [] and not dirs[b.pid].exists()

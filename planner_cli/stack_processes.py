"""Supervision of the stack's processes: each component runs in its own process group whose
environment carries the stack's marker; the state folder's state file records them.

`down` stops every one of them, then any process a component started in a session of its
own (a worker's flow runs), found by the marker alone; it checks that none is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STATE_FILE = "stack.json"
MARKER_ENV = "SLA_PLANNER_STACK"
TOKEN_ENV = "SLA_ROUTER_TOKEN"
DATA_TOKEN_ENV = "SLA_ROUTER_DATA_TOKEN"


class StackError(RuntimeError):
    """A component did not start or stop; the message names it and shows its log."""


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


# -- the stack as a whole --------------------------------------------------------------


def down(state_dir: str, *, log=print, grace_s: float = 10.0) -> list[int]:
    """Stop every process of the stack and verify none is left; returns the pids stopped.

    Raises StackError naming any process that survived SIGKILL.
    """
    state_path = Path(state_dir).resolve()
    state = load_state(state_path, missing_ok=True)
    if state is None:
        log(f"no stack state in {state_path}: nothing to stop")
        return []
    groups = [c["pid"] for c in state["components"].values() if c.get("pid")]
    marker = state["marker"]
    # Marked processes leading a group of their own (an executor's workers, each in its own session) are
    # stopped with their group: a vLLM engine's child processes retitle themselves (setproctitle overwrites
    # the environment /proc shows), so the marker finds the engine but not its engine core and worker.
    leaders = [pid for pid in marked_processes(marker) if pid not in groups and (_proc_stat(pid) or ("", 0))[1] == pid]
    stopped = set()
    for pgid in leaders:
        stopped.update(_group_members(pgid))
        _signal_unmarked_group(pgid, signal.SIGTERM)
    for pgid in groups:
        stopped.update(members(pgid, marker))
        _signal_group(pgid, signal.SIGTERM, marker=marker)
    deadline = time.monotonic() + grace_s
    resent = False
    while time.monotonic() < deadline and (marked_processes(marker) or _live_in(leaders)):
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
    for pgid in leaders:
        _signal_unmarked_group(pgid, signal.SIGKILL)
    for pid in marked_processes(marker):
        stopped.add(pid)
        _signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (marked_processes(marker) or _live_in(leaders)):
        _reap(groups)
        time.sleep(0.05)
    _reap(groups)
    left = sorted(set(marked_processes(marker)) | set(_live_in(leaders)))
    for comp in state["components"].values():
        comp["pid"] = None
    save_state(state_path, state)
    if left:
        raise StackError(f"stack in {state_path}: processes still running after SIGKILL: {left}")
    log(f"stack in {state_path} stopped: {len(stopped)} processes, none left")
    return sorted(stopped)


def stop_component(state_dir: str, name: str, *, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop one component's process group (the fault tests' outage)."""
    state_path = Path(state_dir).resolve()
    state = load_state(state_path)
    comp = state["components"][name]
    pgid = comp.get("pid")
    if not pgid:
        return
    marker = state["marker"]
    _signal_group(pgid, sig, marker=marker)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and members(pgid, marker):
        _reap([pgid])
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL, marker=marker)
    deadline = time.monotonic() + 10.0
    while members(pgid, marker):
        if time.monotonic() > deadline:
            raise StackError(f"{name}: processes {members(pgid, marker)} survived SIGKILL")
        _reap([pgid])
        time.sleep(0.05)
    comp["pid"] = None
    save_state(state_path, state)


def start_component(state_dir: str, name: str, *, timeout_s: float = 120.0) -> None:
    """Start one stopped component again with the same command, data and ports."""
    state_path = Path(state_dir).resolve()
    state = load_state(state_path)
    data = dict(state["components"][name])
    comp = Component(**{k: v for k, v in data.items() if k in {f.name for f in fields(Component)}})
    if comp.pid and members(comp.pid, state["marker"]):
        raise StackError(f"{name} is already running (pid {comp.pid})")
    launch(state_path, state, comp)
    if comp.health_url:
        wait_healthy(state_path, state, name, timeout_s=timeout_s)


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


# -- one process ------------------------------------------------------------------------


def launch(state_dir: Path, state: dict, comp: Component) -> None:
    log_path = state_dir / "logs" / f"{comp.name}.log"
    # Temporary files stay in the stack's folder: a component killed leaves none in the system's /tmp.
    tmp = state_dir / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), **comp.env, MARKER_ENV: state["marker"]}
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
    save_state(state_dir, state)


def wait_healthy(state_dir: Path, state: dict, name: str, *, timeout_s: float) -> None:
    comp = state["components"][name]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exited(comp["pid"]):
            raise StackError(f"{name} exited before it answered at {comp['health_url']}{log_tail(comp)}")
        if http_ok(comp["health_url"]):
            return
        time.sleep(0.2)
    raise StackError(f"{name} did not answer at {comp['health_url']} within {timeout_s:g} s{log_tail(comp)}")


def check_running(state_dir: Path, state: dict, name: str, *, settle_s: float = 2.0) -> None:
    comp = state["components"][name]
    time.sleep(settle_s)
    if exited(comp["pid"]):
        raise StackError(f"{name} exited right after it started{log_tail(comp)}")


def exited(pid: int) -> bool:
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


def members(pgid: int, marker: str) -> list[int]:
    """Live members of process group pgid that carry this stack's marker (a recorded
    pgid may since have been reused by someone else's processes)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    return [pid for pid in _group_members(pgid) if needle in _environ(pid).split(b"\0")]


def _signal_group(pgid: int, sig: int, *, marker: str) -> None:
    """Signal a process group, but only while it holds processes of this stack."""
    if not members(pgid, marker):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_unmarked_group(pgid: int, sig: int) -> None:
    """Signal the group of a marked process found leading it; a pgid stays its group's while any member lives,
    so a group with members left is still that one."""
    if not _group_members(pgid):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _live_in(pgids) -> list[int]:
    """Live members of these process groups."""
    return [pid for pgid in pgids for pid in _group_members(pgid)]


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


def live_pids(state: dict) -> list[int]:
    return [p for c in state["components"].values() if c.get("pid") for p in members(c["pid"], state["marker"])]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def log_tail(comp: dict) -> str:
    """Where the component's log is and its last line, on the error's one line."""
    return log_pointer(Path(comp.get("log", "")))


def log_pointer(path: Path, *, width: int = 160) -> str:
    if not path.is_file():
        return ""
    last = next((line.strip() for line in reversed(path.read_text(errors="replace").splitlines()) if line.strip()),
                "")
    last = last if len(last) <= width else last[: width - 3] + "..."
    return f"; log {path}" + (f", last line: {last}" if last else " (empty)")


# -- the state folder -----------------------------------------------------------------


def fresh_dir(state_dir: Path) -> None:
    """Empty the state folder (every `up` starts clean) but refuse to wipe a foreign folder."""
    if state_dir.exists() and any(state_dir.iterdir()) and not (state_dir / STATE_FILE).exists():
        raise StackError(f"{state_dir} exists and is not a stack state folder; choose another --state-dir")
    shutil.rmtree(state_dir, ignore_errors=True)
    (state_dir / "logs").mkdir(parents=True)


def load_state(state_dir: Path, *, missing_ok: bool = False) -> dict | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        if missing_ok:
            return None
        raise StackError(f"no stack state in {state_dir} (start one with `sla-planner stack up`)")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise StackError(f"{path}: unreadable stack state: {exc}") from None


def save_state(state_dir: Path, state: dict) -> None:
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_dir / STATE_FILE)

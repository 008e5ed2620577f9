"""The `sla-planner` console command on bad input, unreachable servers and Ctrl-C, as a user runs it.

Each case runs the installed console script in a subprocess: one line on stderr naming
the file, field or server and the cause, exit code 2 for bad input and 1 for a failure
at run time, never a traceback (unless --debug asks for it).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from planner_cli.stack_processes import STATE_FILE, marked_processes
from tests.support.fixtures_net import free_port

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".venv" / "bin" / "sla-planner"
TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"


def sla_planner(*args: str, timeout_s: float = 60, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def assert_one_line(proc: subprocess.CompletedProcess, *, code: int, needles: tuple[str, ...]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{proc.stderr[-3000:]}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def planner_config(tmp_path: Path, *, profile_dir: Path = PROFILE, prometheus_url: str = "http://127.0.0.1:9",
                   connector: str = "  kind: local\n  state_path: fleet.json\n") -> Path:
    path = tmp_path / "planner.yaml"
    path.write_text(
        "planner:\n"
        "  namespace: dynamo\n"
        "  slo: {ttft_ms: 200, itl_ms: 10}\n"
        f"  profile: {{dir: {profile_dir}}}\n"
        f"metrics:\n  prometheus_url: {prometheus_url}\n"
        f"connector:\n{connector}"
    )
    return path


def test_plan_missing_profile_names_config_field_and_folder(tmp_path):
    cfg = planner_config(tmp_path, profile_dir=tmp_path / "no-such-profile")
    proc = sla_planner("plan", "--config", str(cfg), "--intervals", "1")
    assert_one_line(proc, code=2, needles=(str(cfg), "planner.profile", "no-such-profile", "not found"))


def test_plan_truncated_gzip_trace_names_the_file(tmp_path):
    # Past the first block, so the format is detected and the rows fail later.
    trace = tmp_path / "cut.csv.gz"
    trace.write_bytes(TRACE.read_bytes()[:3000])
    proc = sla_planner("plan", "--trace", str(trace), "--intervals", "1")
    assert_one_line(proc, code=2, needles=(str(trace), "truncated or corrupt gzip"))


@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty file"),
    pytest.param(gzip.compress(b""), id="empty gzip"),
    pytest.param(b"TIMESTAMP,ContextTokens,GeneratedTokens\n", id="header only"),
])
def test_plan_empty_trace_names_the_file(tmp_path, content):
    trace = tmp_path / "empty.csv"
    trace.write_bytes(content)
    proc = sla_planner("plan", "--trace", str(trace), "--intervals", "1")
    assert_one_line(proc, code=2, needles=(str(trace),))


def test_what_if_truncated_gzip_trace_names_the_file(tmp_path):
    trace = tmp_path / "cut.csv.gz"
    trace.write_bytes(TRACE.read_bytes()[:3000])
    proc = sla_planner("what-if", "--trace", str(trace), "--profile", str(PROFILE), "--ttft-ms", "200",
                       "--itl-ms", "10", "--no-progress")
    assert_one_line(proc, code=2, needles=(str(trace), "truncated or corrupt gzip"))


def test_what_if_missing_warmup_trace_names_the_field_and_file(tmp_path):
    missing = tmp_path / "warm.jsonl"
    proc = sla_planner("what-if", "--trace", str(TRACE), "--profile", str(PROFILE), "--ttft-ms", "200",
                       "--itl-ms", "10", "--warmup-trace", str(missing), "--no-progress")
    assert_one_line(proc, code=2, needles=("predictor.warmup_trace_path", str(missing), "trace file not found"))


def test_run_unreachable_etcd_names_server_and_cause(tmp_path):
    port = free_port()
    cfg = planner_config(tmp_path, connector=f"  kind: virtual\n  etcd_url: http://127.0.0.1:{port}\n")
    started = time.monotonic()
    proc = sla_planner("run", "--config", str(cfg))
    assert_one_line(proc, code=1, needles=(f"etcd http://127.0.0.1:{port}", "unreachable", "Connection refused"))
    # Checked before Prefect starts: no retries, no server start.
    assert time.monotonic() - started < 15


def test_run_unreachable_prometheus_names_url_and_cause(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    cfg = planner_config(tmp_path, prometheus_url=url)
    proc = sla_planner("run", "--config", str(cfg), "--dry-run", cwd=tmp_path)
    line = assert_one_line(proc, code=1, needles=(f"Prometheus at {url}", "unreachable", "Connection refused"))
    # The URL and the cause, not the HTTP client's connection-pool report around them.
    assert line == (f"sla-planner run: Prometheus at {url} unreachable while running queries.num_requests: "
                    "[Errno 111] Connection refused (--debug: traceback)")


@pytest.mark.parametrize("argv", [
    pytest.param(("--debug", "run"), id="global flag"),
    pytest.param(("run", "--debug"), id="after the command"),
])
def test_debug_keeps_the_traceback(tmp_path, argv):
    cfg = planner_config(tmp_path, connector=f"  kind: virtual\n  etcd_url: http://127.0.0.1:{free_port()}\n")
    proc = sla_planner(*argv, "--config", str(cfg))
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "ConnectorUnavailableError" in proc.stderr


def test_stack_up_failure_is_one_line_naming_component_and_log(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    etcd_port = taken.getsockname()[1]
    state_dir = tmp_path / "stack"
    ports = []
    for name in ("prefect", "prometheus", "etcd-peer", "router", "fleet", "frontend"):
        ports += [f"--{name}-port", str(free_port())]
    try:
        proc = sla_planner("stack", "up", "--state-dir", str(state_dir), "--etcd-port", str(etcd_port), *ports,
                           timeout_s=120)
    finally:
        taken.close()
    log = state_dir / "logs" / "etcd.log"
    line = assert_one_line(proc, code=1, needles=("sla-planner stack up: etcd", str(log)))
    assert "address already in use" in line, line
    assert log.is_file()
    # stack up stops what it started: no process carries the stack's marker.
    marker = json.loads((state_dir / STATE_FILE).read_text())["marker"]
    assert marked_processes(marker) == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_ctrl_c_stops_plan_at_once(tmp_path):
    """SIGINT to the command alone (not its process group) ends the run and Prefect's server with it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([str(CLI), "plan", "--intervals", "50", "--state-dir", str(tmp_path / "state")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        for line in proc.stdout:
            if re.match(r"^\s+60\s+\d+", line):
                break
        else:
            pytest.fail(f"plan ended before its first interval: {proc.wait()}\n{proc.stderr.read()[-3000:]}")
        # Mid-run: the next interval's flow run is on its way (Prefect swallowed Ctrl-C here).
        time.sleep(0.5)
        children = _children(proc.pid)
        assert children, "Prefect's local API server should be a child of the command"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        took_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = proc.stderr.read()
    assert code == 130, stderr[-3000:]
    assert took_s < 6, f"took {took_s:.1f} s to stop"
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == "sla-planner plan: interrupted" and len(lines) <= 2, stderr[-3000:]
    assert not [pid for pid in children if _alive(pid)], "a child of the command outlived it"

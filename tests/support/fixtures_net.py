"""Small helpers shared by the real-component fixtures: free ports, readiness polling."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from executor.localfleet import stop_process  # noqa: F401 - the fixtures stop processes with it


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http_ok(url: str, *, timeout_s: float, proc: subprocess.Popen | None = None,
                 log_path: Path | None = None, what: str) -> None:
    """Poll url until it answers HTTP 200; fail naming what, the url and the log tail.

    timeout_s: give up after this long, seconds.
    proc: the process serving url; if it exits, fail at once.
    """
    deadline = time.monotonic() + timeout_s
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before {url} was ready"
                               f"{_log_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
                last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last_error = str(exc)
        time.sleep(0.02)
    raise RuntimeError(f"{what} not ready at {url} after {timeout_s} s: {last_error}{_log_tail(log_path)}")


def _log_tail(log_path: Path | None, *, lines: int = 20) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- {log_path} (last {len(tail)} lines) ---\n" + "\n".join(tail)

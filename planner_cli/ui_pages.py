"""Prefect UI pages rendered by headless Chromium: their URLs, a screenshot and the rendered DOM.

Chromium is Debian's package `chromium`. The URL forms are the ones that open on the
wanted view: a flow run's Artifacts tab only in the V2 UI (the V1 UI drops the `?tab=`
while the run is still loading), an artifact's page in the default UI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
WINDOW_PX = (1400, 1000)
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
    f"--window-size={WINDOW_PX[0]},{WINDOW_PX[1]}",
]


def flow_run_artifacts_url(ui: str, flow_run_id: str) -> str:
    """A flow run's page on its Artifacts tab; ui is the UI's base URL."""
    return f"{ui.rstrip('/')}/v2/runs/flow-run/{flow_run_id}?tab=Artifacts"


def artifact_url(ui: str, artifact_id: str) -> str:
    """One artifact's page: an image artifact shows as an <img> of its URL."""
    return f"{ui.rstrip('/')}/artifacts/artifact/{artifact_id}"


def render_page(url: str, screenshot: Path, *, chromium: str = CHROMIUM, render_ms: int = 20000) -> str:
    """Load url in headless Chromium, write its screenshot (PNG) and return the rendered DOM.

    render_ms: virtual time the page gets to load and render, ms; Chromium waits for the
    page's network requests in real time on top of it.
    Raises RuntimeError naming the page when Chromium is missing or wrote no screenshot.
    """
    if not Path(chromium).is_file():
        raise RuntimeError(f"{chromium} not found: apt-get install -y --no-install-recommends chromium")
    screenshot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="sla-planner-chromium-") as profile, \
            tempfile.TemporaryFile() as log:
        argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={screenshot}",
                "--dump-dom", f"--virtual-time-budget={render_ms}", url]
        # Chromium starts helper processes: its own session, so all of them are stopped together.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            dom, _ = proc.communicate(timeout=render_ms / 1000 + 90)
        except subprocess.TimeoutExpired:
            dom = b""
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        log.seek(0)
        tail = log.read().decode(errors="replace")[-1500:]
    if not screenshot.is_file() or screenshot.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot of {url} (exit {proc.returncode}):\n{tail}")
    return dom.decode(errors="replace")

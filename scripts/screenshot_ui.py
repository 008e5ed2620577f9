#!/usr/bin/env python3
"""Screenshots of the Prefect UI of a running stack: the planner's runs and their artifacts.

    .venv/bin/python scripts/screenshot_ui.py                # the stack in .stack/
    .venv/bin/python scripts/screenshot_ui.py --state-dir /tmp/stack --out-dir /tmp/shots

Takes headless-Chromium screenshots (Debian package `chromium`) of
- the flow runs list,
- the newest completed planner run on its Artifacts tab (the V2 UI: the V1
  UI drops a `?tab=` link while the run is still loading),
- that run's decision table, summary and chart artifacts,
and prints the PNG paths. Fails, naming the page, when Chromium is missing,
no planner run has completed yet, or a screenshot was not written.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
    "--window-size=1400,1000",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", default=str(ROOT / ".stack"), help="the stack's state folder (default: %(default)s)")
    parser.add_argument("--ui-url", default=None, help="Prefect UI base URL (default: read from the stack state)")
    parser.add_argument("--out-dir", default=None, help="where the PNGs go (default: <state-dir>/screenshots)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium binary (default: %(default)s)")
    parser.add_argument("--namespace", default=None, help="planner namespace of the artifact keys (default: the stack's)")
    parser.add_argument("--render-ms", type=int, default=20000,
                        help="virtual time the page gets to load and render, ms (default: %(default)s)")
    args = parser.parse_args(argv)

    try:
        ui, namespace = _ui_and_namespace(args)
        if not Path(args.chromium).is_file():
            raise RuntimeError(f"{args.chromium} not found: apt-get install -y chromium")
        run = _newest_planner_run(ui)
        out_dir = Path(args.out_dir or Path(args.state_dir) / "screenshots")
        out_dir.mkdir(parents=True, exist_ok=True)
        artifacts = _artifact_ids(ui, run["id"])
        pages = {"flow-runs": f"{ui}/runs",
                 "planner-run-artifacts": f"{ui}/v2/runs/flow-run/{run['id']}?tab=Artifacts"}
        for kind in ("decision", "summary", "chart"):
            key = f"sla-planner-{kind}-{namespace}"
            if key not in artifacts:
                raise RuntimeError(f"planner run {run['name']} has no artifact {key!r} (has {sorted(artifacts)})")
            pages[f"{kind}-artifact"] = f"{ui}/artifacts/artifact/{artifacts[key]}"
        for name, url in pages.items():
            path = out_dir / f"{name}.png"
            _screenshot(args.chromium, url, path, render_ms=args.render_ms)
            print(f"{path}  <- {url}")
    except RuntimeError as exc:
        print(f"screenshot_ui: {exc}", file=sys.stderr)
        return 1
    return 0


def _ui_and_namespace(args) -> tuple[str, str]:
    state = None
    state_file = Path(args.state_dir) / "stack.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
    if args.ui_url is None and state is None:
        raise RuntimeError(f"no stack state in {args.state_dir}: start one (sla-planner stack up) or pass --ui-url")
    ui = (args.ui_url or state["urls"]["prefect_ui"]).rstrip("/")
    namespace = args.namespace or (state or {}).get("namespace") or "dynamo"
    return ui, namespace


def _api(ui: str, path: str, body: dict):
    req = urllib.request.Request(f"{ui}/api{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except OSError as exc:
        raise RuntimeError(f"Prefect API at {ui}/api{path}: {exc}") from None


def _newest_planner_run(ui: str) -> dict:
    runs = _api(ui, "/flow_runs/filter", {"limit": 1, "sort": "START_TIME_DESC",
                                          "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}},
                                          "deployments": {"name": {"any_": ["planner"]}}})
    if not runs:
        raise RuntimeError(f"no completed planner run at {ui} yet: wait one adjustment interval")
    return runs[0]


def _artifact_ids(ui: str, flow_run_id: str) -> dict[str, str]:
    """artifact key -> id of the run's artifacts."""
    found = _api(ui, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    return {a["key"]: a["id"] for a in found if a.get("key")}


def _screenshot(chromium: str, url: str, path: Path, *, render_ms: int) -> None:
    path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="sla-planner-chromium-") as profile:
        argv = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={path}",
                f"--virtual-time-budget={render_ms}", url]
        # Chromium starts helper processes: its own session, so all of them are stopped together.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=render_ms / 1000 + 90)
        except subprocess.TimeoutExpired:
            out = b""
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if not path.is_file() or path.stat().st_size == 0:
        tail = out.decode(errors="replace")[-1500:]
        raise RuntimeError(f"chromium wrote no screenshot of {url} (exit {proc.returncode}):\n{tail}")


if __name__ == "__main__":
    sys.exit(main())

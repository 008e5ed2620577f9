#!/usr/bin/env python3
"""Screenshots of the Prefect UI of a running stack: the planner's runs and their artifacts.

    .venv/bin/python scripts/screenshot_ui.py                # the stack in .stack/
    .venv/bin/python scripts/screenshot_ui.py --state-dir /tmp/stack --out-dir /tmp/shots

Takes headless-Chromium screenshots (Debian package `chromium`) of
- the flow runs list,
- the newest completed planner run on its Artifacts tab,
- that run's decision table, summary and chart artifacts,
and prints the PNG paths. Fails, naming the page, when Chromium is missing,
no planner run has completed yet, or a screenshot was not written.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

from planner_cli.ui_pages import CHROMIUM, artifact_url, flow_run_artifacts_url, render_page

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", default=str(ROOT / ".stack"), help="the stack's state folder (default: %(default)s)")
    parser.add_argument("--ui-url", default=None, help="Prefect UI base URL (default: read from the stack state)")
    parser.add_argument("--out-dir", default=None, help="where the PNGs go (default: <state-dir>/screenshots)")
    parser.add_argument("--chromium", default=CHROMIUM, help="Chromium binary (default: %(default)s)")
    parser.add_argument("--namespace", default=None, help="planner namespace of the artifact keys (default: the stack's)")
    parser.add_argument("--render-ms", type=int, default=20000,
                        help="virtual time the page gets to load and render, ms (default: %(default)s)")
    args = parser.parse_args(argv)

    try:
        ui, namespace = _ui_and_namespace(args)
        run = _newest_planner_run(ui)
        out_dir = Path(args.out_dir or Path(args.state_dir) / "screenshots")
        out_dir.mkdir(parents=True, exist_ok=True)
        artifacts = _artifact_ids(ui, run["id"])
        pages = {"flow-runs": f"{ui}/runs",
                 "planner-run-artifacts": flow_run_artifacts_url(ui, run["id"])}
        for kind in ("decision", "summary", "chart"):
            key = f"sla-planner-{kind}-{namespace}"
            if key not in artifacts:
                raise RuntimeError(f"planner run {run['name']} has no artifact {key!r} (has {sorted(artifacts)})")
            pages[f"{kind}-artifact"] = artifact_url(ui, artifacts[key])
        for name, url in pages.items():
            path = out_dir / f"{name}.png"
            render_page(url, path, chromium=args.chromium, render_ms=args.render_ms)
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


if __name__ == "__main__":
    sys.exit(main())

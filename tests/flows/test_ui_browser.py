"""A user sees what the planner did, in a browser: headless Chromium opens a real Prefect server's UI
and finds the planner run's chart and the what-if run's images.

One planner run (given metrics, local connector) and one what-if compare run (three minutes of the
bundled trace) publish their artifacts to a `prefect server start` on 127.0.0.1; Chromium renders each
run's Artifacts tab and the artifact pages. The screenshots stay in pytest's temp folder (the last three
sessions are kept) and in test-artifacts/ui-browser/ under the repository; their paths are printed.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner_cli.ui_pages import WINDOW_PX, artifact_url, flow_run_artifacts_url, render_page
from tests.support.fixtures_prefect_server import ROOT, PrefectStack

NAMESPACE = "ui-browser"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
KEPT_DIR = ROOT / "test-artifacts" / "ui-browser"
IMG_DATA = re.compile(r'<img\b[^>]*\bsrc="(data:image/png;base64,[^"]+)"')


def publish_runs(state_dir: str) -> dict[str, str]:
    """Run one planner flow and one what-if compare flow against PREFECT_API_URL; their flow run ids.

    Called in a subprocess whose environment points Prefect at the test's server.
    """
    from flows.config import ReplayInputs
    from flows.planner_flow import planner_flow
    from sim.whatif.flow import what_if_compare_flow
    from tests.flows.test_flow_ui import NOW_S, _config, _observation

    cfg = _config(Path(state_dir), PROFILE, NAMESPACE)
    # 3,000 requests/min: the planner scales prefill up, so the chart has a step to draw.
    planner = planner_flow(config=cfg, replay=ReplayInputs(observation=_observation(3000.0, t_end=NOW_S), now_s=NOW_S),
                           return_state=True)
    what_if = what_if_compare_flow(trace=str(TRACE), profile_dir=str(PROFILE), load_multiplier=2.0,
                                   policies=("planner", "static:1x1"), duration_min=3.0,
                                   output_dir=str(Path(state_dir) / "what-if"), return_state=True)
    for state in (planner, what_if):
        state.result()  # raises if the run failed
    return {"planner": str(planner.state_details.flow_run_id), "what-if": str(what_if.state_details.flow_run_id)}


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A Prefect server with the UI, one planner run and one what-if run on it; yields (stack, run ids)."""
    base = tmp_path_factory.mktemp("prefect-ui")
    stack = PrefectStack(base)
    try:
        stack.start_server()
        code = ("import json, sys; from tests.flows.test_ui_browser import publish_runs; "
                "print(json.dumps(publish_runs(sys.argv[1])))")
        done = subprocess.run([sys.executable, "-c", code, str(base)], env=stack.env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"flow runs failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
        runs = json.loads(done.stdout.strip().splitlines()[-1])
        yield stack, runs
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """The screenshot folder: pytest's temp folder, copied to test-artifacts/ at the end."""
    out = tmp_path_factory.mktemp("ui-screenshots")
    yield out
    shutil.copytree(out, KEPT_DIR, dirs_exist_ok=True)
    print(f"\nUI screenshots: {out} (copied to {KEPT_DIR})")


def _open(url: str, shots: Path, name: str) -> str:
    """The page's rendered DOM; its screenshot, checked not to be blank, goes to shots/name.png, the DOM beside it."""
    from PIL import Image

    path = shots / f"{name}.png"
    dom = render_page(url, path)
    path.with_suffix(".html").write_text(dom)
    print(f"{path}  <- {url}")
    image = Image.open(path).convert("RGB")
    assert image.size == WINDOW_PX, f"{path}: {image.size}"
    colours = image.getcolors(maxcolors=1 << 20) or []
    most = max(n for n, _ in colours)
    # Not blank: a rendered page has antialiased text (hundreds of colours) and no colour on all of it
    # (the dark summary page's background covers 95%). What the page shows is the DOM checks' job.
    assert len(colours) > 100 and most < 0.99 * image.width * image.height, \
        f"{path} looks blank: {len(colours)} colours, the commonest on {most} px"
    return dom


def _ui(stack: PrefectStack) -> str:
    return stack.api_url.removesuffix("/api")


def _artifacts(stack: PrefectStack, flow_run_id: str) -> dict[str, dict]:
    found = stack.api("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    return {a["key"]: a for a in found}


def _text(dom: str) -> str:
    """The page's text, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def _assert_image_page(stack: PrefectStack, artifact: dict, shots: Path, name: str) -> None:
    """The artifact's page shows an <img> of exactly the PNG the run published."""
    dom = _open(artifact_url(_ui(stack), artifact["id"]), shots, name)
    assert artifact["key"] in _text(dom), f"{name}: page does not name {artifact['key']}"
    shown = IMG_DATA.findall(dom)
    assert artifact["data"] in shown, f"{name}: no <img> of the artifact's PNG among {len(shown)} data: images"
    png = base64.b64decode(artifact["data"].partition(",")[2])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_planner_run_page_lists_its_artifacts_and_the_chart_page_shows_the_chart(ui, shots):
    stack, runs = ui
    arts = _artifacts(stack, runs["planner"])
    keys = {f"sla-planner-{kind}-{NAMESPACE}" for kind in ("decision", "summary", "chart")}
    assert keys <= set(arts), sorted(arts)

    text = _text(_open(flow_run_artifacts_url(_ui(stack), runs["planner"]), shots, "planner-run-artifacts"))
    for key in keys:
        assert key in text, f"planner run's Artifacts tab does not list {key}"
    assert "prefill 1→" in text, "the run page does not show the run's name (what it scaled)"

    _assert_image_page(stack, arts[f"sla-planner-chart-{NAMESPACE}"], shots, "planner-chart-artifact")
    summary = arts[f"sla-planner-summary-{NAMESPACE}"]
    summary_text = _text(_open(artifact_url(_ui(stack), summary["id"]), shots, "planner-summary-artifact"))
    for shown in ("Planner decision", "prefill 1 → 2", "sla_sizing"):
        assert shown in summary_text, f"summary page does not show {shown!r}"


def test_what_if_run_page_lists_its_artifacts_and_shows_the_comparison_images(ui, shots):
    stack, runs = ui
    arts = _artifacts(stack, runs["what-if"])
    images = [a for a in arts.values() if a["type"] == "image"]
    assert images and "what-if-compare" in arts, sorted(arts)

    text = _text(_open(flow_run_artifacts_url(_ui(stack), runs["what-if"]), shots, "what-if-run-artifacts"))
    for key in arts:
        assert key in text, f"what-if run's Artifacts tab does not list {key}"

    for art in images:
        _assert_image_page(stack, art, shots, f"what-if-{art['key']}")
    table = _open(artifact_url(_ui(stack), arts["what-if-compare"]["id"]), shots, "what-if-table")
    cells = {html.unescape(c).strip() for c in re.findall(r"<td\b[^>]*>([^<]*)</td>", table)}
    for label in ("planner", "static:1x1", "oracle"):
        assert label in cells, f"what-if table page has no row {label!r}"

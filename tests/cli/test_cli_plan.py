"""`sla-planner plan`, the README's first command, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_prints_each_interval_decision(tmp_path):
    """The README's command as written (no --state-dir): it leaves nothing in the temp folder."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), DO_NOT_TRACK="1", TMPDIR=str(temp))
    proc = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "plan", "--intervals", "3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The trace by its file's name and the copies once, not the copies' internal name as well.
    assert proc.stdout.startswith("replaying azure2023_conv.csv.gz x8 ("), proc.stdout[:300]
    assert "*load" not in proc.stdout
    assert "8 copies shifted by up to +-30 s: independent tenants" in proc.stdout  # the default load model, stated
    rows = [l for l in proc.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s+", l)]
    assert len(rows) == 3, proc.stdout
    # x8 the Azure conversation trace is ~25 requests/s: more than one prefill replica.
    first = rows[0].split()
    assert first[0] == "60" and int(first[5]) > 1, rows[0]
    assert "sla_sizing" in rows[0]
    assert re.search(r"\d+ requests: [\d.]+% met both SLAs", proc.stdout)
    assert [p.name for p in temp.iterdir() if p.name.startswith("sla-planner-plan-")] == []
    # Prefect's local API logs to a file, not into the command's output (its shutdown can log a cancelled
    # database flush with a traceback).
    assert (tmp_path / "prefect-home" / "local-api.log").is_file()
    assert "Traceback" not in proc.stderr and "prefect.server" not in proc.stderr, proc.stderr[-3000:]


def test_plan_rejects_bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("planner:\n  profile: {dir: /nonexistent}\n  sloo: {}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "plan", "--config", str(bad)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "sloo" in proc.stderr and str(bad) in proc.stderr


def test_plan_rejects_a_negative_jitter_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "plan", "--jitter-s", "-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "jitter_s must be >= 0" in proc.stderr

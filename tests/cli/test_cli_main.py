"""The `sla-planner` command lists every user job and stays fast to start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner_cli.main import build_parser


@pytest.mark.parametrize("command", ["plan", "backtest", "what-if", "router", "stack"])
def test_every_subcommand_is_registered(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert command in sub.choices


def test_help_does_not_import_the_heavy_stack():
    code = (
        "import sys; from planner_cli.main import build_parser; build_parser(); "
        "heavy = [m for m in ('prefect', 'prophet', 'pmdarima', 'sklearn', 'fastapi') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"--help imports {out}"


def test_unknown_command_exits_2():
    proc = subprocess.run([sys.executable, "-m", "planner_cli.main", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2 and "frobnicate" in proc.stderr

"""planner_cli.stack_processes: how the stack starts one of its processes."""

from __future__ import annotations

import sys
import time

from planner_cli.stack_processes import Component, exited, launch


def test_a_component_keeps_its_temporary_files_in_the_stack_folder(tmp_path):
    """TMPDIR points into the stack's state folder, so a component killed leaves no litter in /tmp;
    a component's own env still wins."""
    (tmp_path / "logs").mkdir()
    state = {"marker": "m", "components": {}}
    script = "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(os.environ['TMPDIR'])"
    launch(tmp_path, state, Component("probe", [sys.executable, "-c", script, str(tmp_path / "seen")], None))
    own = tmp_path / "own"
    launch(tmp_path, state, Component("own", [sys.executable, "-c", script, str(tmp_path / "seen-own")], None,
                                      env={"TMPDIR": str(own)}))
    deadline = time.monotonic() + 30
    while not all(exited(c["pid"]) for c in state["components"].values()):
        assert time.monotonic() < deadline, "the probes did not exit"
        time.sleep(0.05)
    assert (tmp_path / "seen").read_text() == str(tmp_path / "tmp") and (tmp_path / "tmp").is_dir()
    assert (tmp_path / "seen-own").read_text() == str(own)

"""Every path the shipped configs and docs point a user at exists in a fresh clone."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# Runtime state the commands create (gitignored), not inputs.
STATE_DIRS = (".sla-planner",)


def tracked() -> set[str]:
    """Files and folders `git ls-files` knows: what a fresh clone holds."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return set(files) | {str(parent) for f in files for parent in PurePosixPath(f).parents}


def strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def path_like(value: str) -> bool:
    """A relative path: path characters only, a slash (not a URL, selector or {placeholder})."""
    return "/" in value and not value.startswith("/") and re.fullmatch(r"[\w.\-/]+", value) is not None


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config_paths_exist_in_a_fresh_clone(config):
    known = tracked()
    paths = [v for v in strings(yaml.safe_load(config.read_text())) if path_like(v)]
    missing = []
    for value in paths:
        if PurePosixPath(value).parts[0] in STATE_DIRS:
            continue
        # Relative to the file (the planner config's profile) or to the project root (the others).
        candidates = {(config.parent / value).resolve(), (ROOT / value).resolve()}
        rel = {str(c.relative_to(ROOT)) for c in candidates if c.is_relative_to(ROOT)}
        if not rel & known:
            missing.append(value)
    assert not missing, f"{config.relative_to(ROOT)} points at paths a fresh clone lacks: {missing}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config_state_paths_are_gitignored(config):
    states = [v for v in strings(yaml.safe_load(config.read_text()))
              if path_like(v) and PurePosixPath(v).parts[0] in STATE_DIRS]
    for value in states:
        ignored = subprocess.run(["git", "check-ignore", "-q", value], cwd=ROOT).returncode == 0
        assert ignored, f"{config.name}: runtime state {value} is not gitignored"


def test_docs_do_not_point_outside_the_clone():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *CONFIGS]
    outside = [f"{d.relative_to(ROOT)}:{n}: {line.strip()}" for d in docs
               for n, line in enumerate(d.read_text().splitlines(), 1) if re.search(r"\.\./shared\b", line)]
    assert not outside, "paths beside the project, absent from a clone:\n" + "\n".join(outside)

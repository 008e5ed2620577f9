"""docs/llmd.md's compatibility rows are each backed by a test that exists."""

from __future__ import annotations

import ast
import re

from tests.conftest import PROJECT_ROOT

DOC = PROJECT_ROOT / "docs" / "llmd.md"


def named_tests() -> list[tuple[int, str, str]]:
    """(line, test file, function) for every test a table row of docs/llmd.md names in its `test` column."""
    out = []
    lines = DOC.read_text().splitlines()
    test_col = None
    for n, line in enumerate(lines, 1):
        if not line.startswith("|"):
            test_col = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if test_col is None:
            test_col = cells.index("test") if "test" in cells else -1
            continue
        if test_col < 0 or set(cells[0]) <= {"-"} or test_col >= len(cells):
            continue
        current = None
        for ref in re.findall(r"`([^`]+)`", cells[test_col]):
            path, sep, name = ref.partition("::")
            if path.startswith("tests/"):
                current = path
            if sep and current:
                out.append((n, current, name.split("[")[0]))
    return out


def test_every_compatibility_row_names_tests_that_exist():
    refs = named_tests()
    assert len(refs) >= 20, "docs/llmd.md's compatibility tables name fewer tests than expected: parser drift?"
    missing = []
    defined: dict[str, set[str]] = {}
    for line, path, name in refs:
        file = PROJECT_ROOT / path
        if path not in defined:
            defined[path] = ({node.name for node in ast.walk(ast.parse(file.read_text()))
                              if isinstance(node, ast.FunctionDef)} if file.is_file() else set())
        if name not in defined[path]:
            missing.append(f"docs/llmd.md:{line}: {path}::{name}")
    assert missing == []

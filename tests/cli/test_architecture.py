"""The shape docs/architecture.md promises, read from the source with `ast`.

Imports are counted wherever they are written, inside functions too: a lazy import that
closes a circle is still a circle. The import graph has no cycle, layers import one way,
no package's rooms (its modules and sub-packages) import each other in a circle (no upward
arrow: a room's module importing a module beside the room that imports the room back), no
folder holds more than about twenty modules side by side, and the planner flow and its tasks
import nothing from the simulator. Size follows the concept: no line cap.
"""

from __future__ import annotations

import ast
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

MAX_MODULES_SIDE_BY_SIDE = 20
# The commands that run the simulator (plan, what-if, the stack's simulated fleet) or its load generator
# (the stack's Dynamo and vLLM fleets, and the executor command that stops them); every other command is
# production code and reaches nothing in sim/.
SIMULATOR_COMMANDS = {"planner_cli.plan", "planner_cli.whatif", "planner_cli.stack", "planner_cli.stack_components",
                      "planner_cli.stack_dynamo", "planner_cli.stack_vllm", "planner_cli.executor"}
PACKAGES = ("planner", "connectors", "tasks", "flows", "routing", "sim", "workloads", "planner_cli", "executor")
# Who may import whom; anything not listed for a package is refused.
ALLOWED = {
    "planner": set(),
    "connectors": {"planner"},
    "routing": {"planner", "connectors"},
    "workloads": {"planner"},
    "tasks": {"planner", "connectors", "routing", "workloads"},
    "flows": {"planner", "connectors", "routing", "workloads", "tasks"},
    # the simulator drives the same core, and its what-if flow (sim/whatif/) draws with flows.charts
    "sim": {"planner", "connectors", "routing", "workloads", "flows"},
    "executor": {"planner"},
    "planner_cli": {"planner", "connectors", "routing", "sim", "workloads", "tasks", "flows", "executor"},
}
CORE_FORBIDDEN_THIRD_PARTY = ("prefect", "requests", "httpx", "etcd3gw", "kubernetes", "prometheus_api_client")


@cache
def source_files() -> tuple[Path, ...]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    return tuple(PROJECT_ROOT / f for f in listed if f.split("/")[0] in PACKAGES)


def module_name(path: Path) -> str:
    rel = path.relative_to(PROJECT_ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_names(path: Path) -> set[str]:
    """Every dotted name an import statement anywhere in the file can load (relative ones resolved)."""
    name = module_name(path)
    return names_imported_by(path.read_text(), package=name if path.name == "__init__.py" else name.rpartition(".")[0])


def names_imported_by(source: str, *, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


@cache
def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in source_files()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(path):
            # importing a.b.c runs a/__init__ and a/b/__init__ first
            parts = imported.split(".")
            targets.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_lazy_circle():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert strongly_connected(graph) == [["a.x", "a.y", "a.z"]]
    assert strongly_connected({"a.x": {"a.y"}, "a.y": set()}) == []


def test_the_import_reader_counts_function_level_and_relative_imports():
    source = "def f():\n    from .sizing import size_pools\n    import connectors.base\n    from .. import sim\n"
    assert names_imported_by(source, package="planner.predictors") == {
        "planner.predictors.sizing", "planner.predictors.sizing.size_pools", "connectors.base", "planner", "planner.sim"}


def test_no_import_cycle_between_project_modules():
    assert strongly_connected(import_graph()) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layers_import_one_way(package):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items() if module.split(".")[0] == package
        for target in targets if target.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert wrong == []


def test_the_core_imports_no_orchestration_or_io_library():
    wrong = sorted(
        f"{module_name(p)} imports {name}"
        for p in source_files() if module_name(p).split(".")[0] == "planner"
        for name in imported_names(p) if name.split(".")[0] in CORE_FORBIDDEN_THIRD_PARTY
    )
    assert wrong == []


def units_within(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The package's rooms (its direct modules and sub-packages) and which rooms each imports."""
    depth = package.count(".") + 1

    def unit(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[: depth + 1]) if module.startswith(package + ".") else None

    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        u = unit(module)
        if u is None:
            continue
        units.setdefault(u, set()).update(v for t in targets if (v := unit(t)) is not None and v != u)
    return units


def package_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every package whose rooms import each other in a circle, with the circle."""
    packages = sorted({m.rsplit(".", 1)[0] for m in graph if "." in m})
    return [f"{package}: {' <-> '.join(c)}" for package in packages
            for c in strongly_connected(units_within(package, graph))]


def test_the_room_finder_finds_an_upward_arrow():
    # r.training.publish -> r.model_export -> r.training.fit: the serving side's module in the middle
    graph = {"r.training.publish": {"r.model_export"}, "r.model_export": {"r.training.fit"}, "r.training.fit": set(),
             "r.service": {"r.training.fit"}}
    assert package_cycles(graph) == ["r: r.model_export <-> r.training"]
    graph["r.model_export"] = set()
    assert package_cycles(graph) == []


def test_no_upward_arrow_inside_a_package():
    assert package_cycles(import_graph()) == []


def test_no_folder_holds_more_than_about_twenty_modules_side_by_side():
    folders: dict[Path, int] = {}
    for p in source_files():
        if p.name != "__init__.py":
            folders[p.parent] = folders.get(p.parent, 0) + 1
    crowded = sorted(f"{d.relative_to(PROJECT_ROOT)}/: {n} modules" for d, n in folders.items()
                     if n > MAX_MODULES_SIDE_BY_SIDE)
    assert crowded == []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_the_reach_finder_follows_arrows_through_other_packages():
    graph = {"flows.f": {"tasks.t"}, "tasks.t": {"workloads.w"}, "workloads.w": {"sim.s"}, "sim.s": set()}
    assert reachable(graph, "flows.f") == {"tasks.t", "workloads.w", "sim.s"}


def test_the_planner_flow_and_tasks_import_nothing_from_the_simulator():
    graph = import_graph()
    production = ["flows.planner_flow", "flows.retrain"] + sorted(m for m in graph if m.split(".")[0] == "tasks")
    wrong = sorted(f"{m} reaches {t}" for m in production for t in reachable(graph, m) if t.split(".")[0] == "sim")
    assert wrong == []


def architecture_section() -> str:
    return (PROJECT_ROOT / "docs" / "architecture.md").read_text()


def test_the_readme_names_every_module_with_its_concept():
    """Each module appears in its package's table with a non-empty concept; no row names a module that is gone."""
    rows: dict[str, str] = {}
    package = None
    for line in architecture_section().splitlines():
        if line.startswith("**") and "/**" in line:
            package = line[2: line.index("/**")]
        elif line.startswith("| `") and package:
            name, concept = (cell.strip() for cell in line.strip("|").split("|", 1))
            rows[f"{package}/{name.strip('`')}"] = concept.strip(" |")
    modules = {str(p.relative_to(PROJECT_ROOT)) for p in source_files()
               if p.name != "__init__.py" or p.parent.name in ("training", "executor")}
    assert sorted(modules - rows.keys()) == [], "modules docs/architecture.md does not name"
    assert sorted(rows.keys() - modules) == [], "rows naming modules that no longer exist"
    assert [m for m, concept in rows.items() if len(concept) < 10] == []


def test_only_the_simulator_commands_reach_the_simulator():
    graph = import_graph()
    wrong = sorted(f"{m} reaches {t}" for m in graph if m.split(".")[0] == "planner_cli" and m not in SIMULATOR_COMMANDS
                   for t in reachable(graph, m) if t.split(".")[0] == "sim")
    assert wrong == []


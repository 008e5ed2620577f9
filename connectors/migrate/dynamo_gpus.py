"""GPUs per engine and the GPU budgets as Dynamo 1.6.1's planner takes them at start: pure functions, no I/O.

Dynamo reads each worker's GPUs per engine from the operator's status (the worker's pod
asks for them) and uses `prefill_engine_num_gpu` / `decode_engine_num_gpu` only for a
worker that has none; it then checks the pools' minimum endpoints against the budget.
What would stop it raises ConfigRefused (with `lenient`: a skipped line instead).
"""

from __future__ import annotations

from connectors.migrate.dynamo_settings import PlannerSettings, main_container, spec_components
from connectors.migrate.result import Migration
from connectors.migrate.dynamo_config import ConfigRefused


def worker_engine_gpus(obj: dict, version: str, name: str) -> int:
    """GPUs of one engine of the named worker as Dynamo 1.6.1 reads them (0: none).

    Dynamo reads the operator's status.components.<name>.gpusPerEngine (when the
    operator has seen the current generation); a DGD without it is read as the operator
    fills it: the main container's nvidia.com/gpu limit (v1alpha1: resources gpu),
    then its request, times the nodes of a multinode component.
    """
    comp = next((c for n, c, _ in spec_components(obj, version) if n == name), {})
    status = ((obj.get("status") or {}).get("components") or {}).get(name) or {}
    if (obj.get("metadata") or {}).get("generation") == (obj.get("status") or {}).get("observedGeneration") \
            and isinstance(status.get("gpusPerEngine"), int):
        return status["gpusPerEngine"]
    resources = comp.get("resources") or {} if version == "v1alpha1" else main_container(comp, version).get(
        "resources") or {}
    resource = "gpu" if version == "v1alpha1" else "nvidia.com/gpu"
    gpus = 0
    for section in ("limits", "requests"):
        try:
            gpus = gpus or int(str((resources.get(section) or {}).get(resource, 0)))
        except ValueError:
            pass
    nodes = (comp.get("multinode") or {}).get("nodeCount", 1)
    return gpus * (nodes if isinstance(nodes, int) and nodes > 0 else 1)


def engine_gpus(s: PlannerSettings, obj: dict, version: str, workers: dict | None, out: Migration, *,
                 lenient: bool) -> dict[str, int]:
    """GPUs per engine by pool, as Dynamo 1.6.1 takes them: the worker's count first, the config's when it is 0.

    A virtual environment has no workers to read: the config's values are required.
    Pre-1.0 planners took the flag (else the worker's count). ConfigRefused when Dynamo
    would stop for a missing count.
    """
    gpus = {}
    for pool in ("prefill", "decode"):
        key = f"{pool}_engine_num_gpu"
        given = s.get(key)
        worker = None
        if workers is not None and s.get("environment") != "virtual":
            worker = worker_engine_gpus(obj, version, workers[pool].name)
        if s.legacy:
            gpus[pool] = int(given) if given is not None else (worker or 1)
        elif worker:
            gpus[pool] = worker
            if given is not None and int(given) != worker:
                out.skip(s.spelled(key), given, f"Dynamo 1.6.1 uses the {pool} worker's {worker} GPU(s) per engine "
                         "(this value only when the worker has none)")
        elif given is not None:
            gpus[pool] = int(given)
        else:
            where = ("a virtual environment reads no workers" if s.get("environment") == "virtual" or workers is None
                     else f"the {pool} worker asks for no GPUs")
            problem = ConfigRefused(key, None, f"{where} and the config sets none: Dynamo 1.6.1 stops "
                                    f"(Missing {key} in config)")
            if not lenient:
                raise problem
            out.skip(problem.key, None, f"{problem.why}; written as 1 (--lenient)")
            gpus[pool] = 1
    return gpus


def check_budgets(s: PlannerSettings, gpus: dict[str, int], out: Migration, *, lenient: bool) -> None:
    """Dynamo 1.6.1's start-up check of the GPU budgets: ConfigRefused (lenient: a line) when it would stop.

    min_gpu_budget may not exceed max_gpu_budget, and the pools' minimum endpoints (those of
    the mode's pools) must fit in max_gpu_budget at the workers' GPUs per replica; -1 is no budget.
    """
    low, high = int(s.get("min_gpu_budget")), int(s.get("max_gpu_budget"))
    problems = []
    if low >= 0 and high >= 0 and low > high:
        problems.append(ConfigRefused(s.spelled("min_gpu_budget"), low, f"exceeds max_gpu_budget {high}: Dynamo "
                                      "1.6.1 stops at start"))
    mode = s.get("mode")
    pools = {"prefill": ("prefill",), "decode": ("decode",), "agg": ("decode",)}.get(str(mode), ("prefill", "decode"))
    floors = {}
    for pool in pools:
        own = s.get(f"{pool}_min_endpoint")
        floors[pool] = int(own if own is not None else s.get("min_endpoint"))
    needed = sum(floors[pool] * gpus[pool] for pool in pools)
    if high >= 0 and needed > high:
        floor_text = " + ".join(f"{floors[p]} {p} x {gpus[p]} GPU(s)" for p in pools)
        problems.append(ConfigRefused(s.spelled("max_gpu_budget"), high, f"the minimum endpoints need {needed} GPUs "
                                      f"({floor_text}): Dynamo 1.6.1 stops at start"))
    for problem in problems:
        if not lenient:
            raise problem
        out.skip(problem.key, problem.value, f"{problem.why}; skipped (--lenient)")

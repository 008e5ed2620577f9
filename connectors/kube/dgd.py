"""A DynamoGraphDeployment's shape, in both served versions: pure functions, no I/O.

v1beta1 (Dynamo 1.3+, the storage version) lists `spec.components[]` with
`name`, `type` (prefill, decode, worker, frontend, planner...), `replicas`,
`podTemplate`, `multinode` and, when an adapter owns the replicas,
`scalingAdapter`; the operator reports `status.components.<name>`. v1alpha1
(deprecated, older operators) keys `spec.services.<name>` with
`componentType`/`subComponentType` and `resources`; status under
`status.services.<name>`. The workers are found as Dynamo's own planner finds
them: by type (v1beta1: a single `worker` component when there is no `decode`
one; v1alpha1: subComponentType, then componentType), else by the configured
name.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.types import POOLS, Pool

VERSIONS = ("v1beta1", "v1alpha1")  # newest first: the order `api: auto` prefers


class DgdShapeError(ValueError):
    """The DGD lacks what the planner needs (the message names it in one line)."""


@dataclass(frozen=True)
class Worker:
    """One pool's component as the DGD describes it."""

    name: str
    index: int | None  # position in v1beta1 spec.components (None in v1alpha1)
    replicas: int  # spec replicas (unset means 1, as the operator reads it)
    gpus_per_replica: int
    adapter: bool  # v1beta1 scalingAdapter set: a DGDSA owns the replicas
    status: dict  # status.components.<name> (v1beta1) or status.services.<name> (v1alpha1); {} when absent


def workers(obj: dict, version: str, *, configured: dict[Pool, str]) -> dict[Pool, Worker]:
    """The prefill and decode components of a DGD read at `version`; DgdShapeError when either is missing."""
    if version == "v1beta1":
        return _workers_v1beta1(obj, configured)
    return _workers_v1alpha1(obj, configured)


def _workers_v1beta1(obj: dict, configured: dict[Pool, str]) -> dict[Pool, Worker]:
    components = [c for c in (obj.get("spec") or {}).get("components") or [] if isinstance(c, dict)]
    status = ((obj.get("status") or {}).get("components") or {})
    found: dict[Pool, Worker] = {}
    problems = []
    for pool in POOLS:
        matches = [i for i, c in enumerate(components) if c.get("type") == pool]
        if not matches and pool == "decode":
            matches = [i for i, c in enumerate(components) if c.get("type") == "worker"]
        if not matches:
            matches = [i for i, c in enumerate(components) if c.get("name") == configured[pool]
                       and c.get("type") in (None, "", "worker", pool)]
        if len(matches) != 1:
            names = [components[i].get("name") for i in matches]
            problems.append(f"{len(matches)} components of type {pool!r}{': ' + str(names) if names else ''}"
                            + ("" if matches else f" and none named {configured[pool]!r}"))
            continue
        comp = components[matches[0]]
        found[pool] = Worker(
            name=comp["name"], index=matches[0], replicas=_replicas(comp),
            gpus_per_replica=_gpus_v1beta1(comp, status.get(comp["name"]) or {}),
            adapter="scalingAdapter" in comp, status=status.get(comp["name"]) or {},
        )
    if problems:
        raise DgdShapeError(
            f"{'; '.join(problems)} (components: {[c.get('name') for c in components] or 'none'}; "
            f"set connector.prefill_service / decode_service to component names)"
        )
    return found


def _workers_v1alpha1(obj: dict, configured: dict[Pool, str]) -> dict[Pool, Worker]:
    services = (obj.get("spec") or {}).get("services") or {}
    status = (obj.get("status") or {}).get("services") or {}
    found: dict[Pool, Worker] = {}
    problems = []
    for pool in POOLS:
        name = None
        for field in ("subComponentType", "componentType"):
            matches = sorted(n for n, s in services.items() if isinstance(s, dict) and s.get(field) == pool)
            if len(matches) > 1:
                problems.append(f"{len(matches)} services have {field} {pool!r}: {matches}")
                name = ""
                break
            if matches:
                name = matches[0]
                break
        if name is None:
            if configured[pool] in services:
                name = configured[pool]
            else:
                problems.append(f"no {pool} service: none has subComponentType {pool!r} and "
                                f"spec.services has no {configured[pool]!r} key")
                continue
        if not name:
            continue
        spec = services[name]
        found[pool] = Worker(name=name, index=None, replicas=_replicas(spec),
                             gpus_per_replica=_gpus_v1alpha1(spec, status.get(name) or {}), adapter=False,
                             status=status.get(name) or {})
    if problems:
        raise DgdShapeError(
            f"{'; '.join(problems)} (services: {sorted(services) or 'none'}; "
            f"set connector.prefill_service / decode_service to the spec.services keys)"
        )
    return found


def ready_replicas(worker: Worker) -> int:
    """Replicas serving: availableReplicas, else readyReplicas, else 0 (no status leans toward "not yet")."""
    for field in ("availableReplicas", "readyReplicas"):
        value = worker.status.get(field)
        if isinstance(value, int):
            return value
    return 0


def caught_up(obj: dict) -> bool:
    """The operator has observed the DGD's current generation (or reports none to compare)."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    generation = (obj.get("metadata") or {}).get("generation")
    return not (isinstance(observed, int) and isinstance(generation, int) and observed < generation)


def adapter_name(dgd_name: str, component: str) -> str:
    """The DynamoGraphDeploymentScalingAdapter the operator makes for a component."""
    return f"{dgd_name}-{component.lower()}"


def json_pointer_token(key: str) -> str:
    """RFC 6901 escaping of one path token ("~" then "/")."""
    return key.replace("~", "~0").replace("/", "~1")


def replicas_json_patch(workers_to_set: list[tuple[Worker, int]]) -> list[dict]:
    """Dynamo's own fallback write for v1beta1 without adapters: per component `test` its name, `add` replicas."""
    ops = []
    for worker, replicas in workers_to_set:
        ops += [{"op": "test", "path": f"/spec/components/{worker.index}/name", "value": worker.name},
                {"op": "add", "path": f"/spec/components/{worker.index}/replicas", "value": replicas}]
    return ops


def annotations_json_patch(obj: dict, resource_version: str, annotations: dict[str, str]) -> list[dict]:
    """JSON patch ops writing annotations, guarded by resourceVersion (fails with 422 if anyone wrote since)."""
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
    if not (obj.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops += [{"op": "add", "path": f"/metadata/annotations/{json_pointer_token(k)}", "value": v}
            for k, v in annotations.items()]
    return ops


def _replicas(spec: dict) -> int:
    value = spec.get("replicas")
    return value if isinstance(value, int) else 1


def _nodes(spec: dict) -> int:
    nodes = (spec.get("multinode") or {}).get("nodeCount", 1)
    return nodes if isinstance(nodes, int) and nodes > 0 else 1


def _gpus_v1beta1(comp: dict, status: dict) -> int:
    """The operator's gpusPerReplica, else nvidia.com/gpu of the main container (limits, then requests)."""
    reported = status.get("gpusPerReplica")
    if isinstance(reported, int) and reported > 0:
        return reported
    containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    main = next((c for c in containers if c.get("name") == "main"), containers[0] if containers else {})
    gpus = 0
    for section in ("limits", "requests"):
        try:
            gpus = int(str(((main.get("resources") or {}).get(section) or {}).get("nvidia.com/gpu", 0)))
        except ValueError:
            gpus = 0
        if gpus:
            break
    return max(gpus, 1) * _nodes(comp)


def _gpus_v1alpha1(spec: dict, status: dict) -> int:
    """The operator's gpusPerReplica if reported, else `resources` gpu (limits, then requests)."""
    reported = status.get("gpusPerReplica")
    if isinstance(reported, int) and reported > 0:
        return reported
    resources = spec.get("resources") or {}
    gpus = 0
    for section in ("limits", "requests"):
        try:
            gpus = int(str((resources.get(section) or {}).get("gpu", 0)))
        except ValueError:
            gpus = 0
        if gpus:
            break
    return max(gpus, 1) * _nodes(spec)

"""An llm-d InferencePool's prefill and decode model servers, found as llm-d labels them: pure functions, no I/O.

The pool (`inference.networking.k8s.io/v1`) selects pods in its namespace by
`spec.selector.matchLabels`; a workload is the pool's when its pod template
carries those labels. Its role is the pod label `llm-d.ai/role` (else the
workload's own label): `prefill`, `decode`, or `prefill-decode` (`both` is
llm-d's deprecated alias), which serves both and counts as one combined role.
Workloads:

- `apps/v1` Deployment: replicas = pods; ready = availableReplicas, else readyReplicas;
- `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet: replicas = groups of
  `leaderWorkerTemplate.size` pods (GPUs per replica: the leader's pod and size - 1 workers);
- a DisaggregatedSet's LeaderWorkerSets (label `disaggregatedset.x-k8s.io/name`), one per
  slice and role: the role is scaled through its `DisaggregatedSetRoleScaler`
  `<disaggregatedset>-<role>` (only with `scaling.mode: External`), whose replicas apply
  in every slice, so one written replica is `slices` groups.

GPUs per pod: the containers' `nvidia.com/gpu` limits, else requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROLES = ("prefill", "decode")
COMBINED = "prefill-decode"
ROLE_ALIASES = {"prefill": "prefill", "decode": "decode", "prefill-decode": COMBINED, "both": COMBINED}
DS_NAME = "disaggregatedset.x-k8s.io/name"
DS_ROLE = "disaggregatedset.x-k8s.io/role"
DS_SLICE = "disaggregatedset.x-k8s.io/slice"
DEPLOYMENT = ("apps", "Deployment", "deployments")
LWS = ("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets")
DSRS = ("disaggregatedset.x-k8s.io", "DisaggregatedSetRoleScaler", "disaggregatedsetrolescalers")


class PoolShapeError(ValueError):
    """The pool or its workloads lack what the planner needs (the message names them in one line)."""


@dataclass(frozen=True)
class Target:
    """One role's scalable object: what the planner reads and writes through /scale.

    replicas, ready: in model-server replicas (pods of a Deployment, groups of an LWS);
    unit: replicas one written /scale replica makes (a DisaggregatedSet's slices, else 1).
    """

    kind: tuple[str, str, str]  # (API group, Kind, plural)
    name: str
    role: str
    replicas: int
    ready: int
    gpus_per_replica: int
    caught_up: bool
    unit: int = 1
    members: tuple[str, ...] = ()  # the LeaderWorkerSets behind a role scaler

    @property
    def ref(self) -> str:
        return f"{self.kind[2]}.{self.kind[0]}/{self.name}"

    def scale_replicas(self, replicas: int) -> int:
        """The /scale spec.replicas that gives at least `replicas` (rounded up to whole units)."""
        return math.ceil(replicas / self.unit)


def selector(pool: dict, *, pool_ref: str) -> dict[str, str]:
    """The pool's spec.selector.matchLabels; PoolShapeError when it has none."""
    labels = (((pool.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
    if not isinstance(labels, dict) or not labels:
        raise PoolShapeError(f"InferencePool {pool_ref}: spec.selector.matchLabels is empty: it selects no model servers")
    return {str(k): str(v) for k, v in labels.items()}


def _labels(obj: dict | None) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _worker_template(lws: dict) -> dict:
    return ((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}


def pod_labels(kind: str, obj: dict) -> dict:
    """The labels a workload's pods carry (an LWS: its worker template's, which leaders share by default)."""
    if kind == "Deployment":
        return _labels(((obj.get("spec") or {}).get("template")))
    return _labels(_worker_template(obj))


def role_of(obj: dict, pods: dict, role_label: str) -> str | None:
    """The llm-d role of a workload (combined for prefill-decode and both); None without the label.

    An unknown value (encode, ...) is returned as is, for the caller to name."""
    value = pods.get(role_label, _labels(obj).get(role_label))
    return None if value is None else ROLE_ALIASES.get(str(value), str(value))


def gpus_per_pod(pod_template: dict) -> int:
    """nvidia.com/gpu over the pod template's containers: limits, else requests (init containers hold none)."""
    total = 0
    for container in ((pod_template.get("spec") or {}).get("containers") or []):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            value = (resources.get(section) or {}).get("nvidia.com/gpu")
            if value is not None:
                try:
                    total += int(str(value))
                except ValueError:
                    raise PoolShapeError(f"container {container.get('name')!r}: nvidia.com/gpu {value!r} is not "
                                         f"a whole number") from None
                break
    return total


def gpus_per_replica(kind: str, obj: dict) -> int:
    """GPUs one replica holds (at least 1, as the planner counts engines): a Deployment's pod; an LWS group of
    `size` pods, the leader's template (else the worker's) plus size - 1 workers."""
    spec = obj.get("spec") or {}
    if kind == "Deployment":
        return max(gpus_per_pod(spec.get("template") or {}), 1)
    template = spec.get("leaderWorkerTemplate") or {}
    size = int(template.get("size") or 1)
    worker = gpus_per_pod(template.get("workerTemplate") or {})
    leader = gpus_per_pod(template["leaderTemplate"]) if template.get("leaderTemplate") else worker
    return max(leader + (size - 1) * worker, 1)


def _replicas(obj: dict) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else 1


def ready_replicas(kind: str, obj: dict) -> int:
    """Deployment: availableReplicas, else readyReplicas; LWS: readyReplicas (groups); 0 without status."""
    status = obj.get("status") or {}
    for field in (("availableReplicas", "readyReplicas") if kind == "Deployment" else ("readyReplicas",)):
        if isinstance(status.get(field), int):
            return status[field]
    return 0


def caught_up(obj: dict) -> bool:
    """The controller has observed the object's current generation (or reports none to compare)."""
    observed = (obj.get("status") or {}).get("observedGeneration")
    generation = (obj.get("metadata") or {}).get("generation")
    return not (isinstance(observed, int) and isinstance(generation, int) and observed < generation)


@dataclass(frozen=True)
class Member:
    """A workload the pool selects, with its role (None: unlabelled)."""

    kind: str  # Deployment, LeaderWorkerSet
    obj: dict
    role: str | None

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def ref(self) -> str:
        return f"{'deployments.apps' if self.kind == 'Deployment' else 'leaderworkersets.' + LWS[0]}/{self.name}"


def members(match_labels: dict[str, str], *, deployments: list[dict], lwss: list[dict], role_label: str) -> list[Member]:
    """The Deployments and LeaderWorkerSets whose pods the pool selects, with their roles."""
    out = []
    for kind, objs in (("Deployment", deployments), ("LeaderWorkerSet", lwss)):
        for obj in objs:
            pods = pod_labels(kind, obj)
            if all(pods.get(k) == v for k, v in match_labels.items()):
                out.append(Member(kind, obj, role_of(obj, pods, role_label)))
    return sorted(out, key=lambda m: (m.kind, m.name))


def role_scaler_groups(found: list[Member]) -> dict[tuple[str, str], list[Member]]:
    """A DisaggregatedSet's LeaderWorkerSets by (DisaggregatedSet, its role name)."""
    groups: dict[tuple[str, str], list[Member]] = {}
    for m in found:
        labels = _labels(m.obj)
        if m.kind == "LeaderWorkerSet" and DS_NAME in labels:
            groups.setdefault((labels[DS_NAME], labels.get(DS_ROLE) or m.role or "?"), []).append(m)
    return groups


def targets(found: list[Member], *, pool_ref: str, role_label: str,
            scalers: dict[str, int | None]) -> dict[str, Target]:
    """The prefill and decode targets of a pool's members; PoolShapeError naming the pool when they are not
    one per role.

    scalers: spec.replicas of each DisaggregatedSetRoleScaler `<ds>-<role>` the members'
    DisaggregatedSets name, None where it does not exist (the role is not scaling.mode External).
    """
    if not found:
        raise PoolShapeError(f"InferencePool {pool_ref}: no Deployment or LeaderWorkerSet in its namespace has "
                             f"pods with its selector's labels")
    if all(m.role is None for m in found):
        raise PoolShapeError(f"InferencePool {pool_ref}: none of its model servers ({', '.join(m.ref for m in found)}) "
                             f"carries the role label {role_label} (prefill, decode)")
    problems = []
    unlabelled = [m.ref for m in found if m.role is None]
    if unlabelled:
        problems.append(f"{', '.join(unlabelled)} carry no {role_label} (llm-d routes them as decode; label them)")
    combined = [m.ref for m in found if m.role == COMBINED]
    if combined:
        problems.append(f"{', '.join(combined)} serve both roles ({role_label} prefill-decode or both): the planner "
                        f"sizes prefill and decode apart")
    other = [f"{m.ref} ({m.role})" for m in found if m.role not in (None, COMBINED) + ROLES]
    if other:
        problems.append(f"{', '.join(other)} have roles the planner does not size")
    by_role: dict[str, list[Target]] = {r: [] for r in ROLES}
    ds_members = {id(m.obj) for ms in role_scaler_groups(found).values() for m in ms}
    for (ds, ds_role), group in sorted(role_scaler_groups(found).items()):
        roles = {m.role for m in group}
        if len(roles) != 1 or next(iter(roles)) not in ROLES:
            continue  # reported above
        name = f"{ds}-{ds_role}"
        if scalers.get(name) is None:
            problems.append(f"DisaggregatedSet {ds} role {ds_role} has no DisaggregatedSetRoleScaler {name} "
                            f"(set the role's scaling.mode: External; its LeaderWorkerSets "
                            f"{', '.join(m.name for m in group)} are the DisaggregatedSet's to scale)")
            continue
        slices = len({_labels(m.obj).get(DS_SLICE, m.name) for m in group})
        first = group[0]
        by_role[first.role].append(Target(
            kind=DSRS, name=name, role=first.role, replicas=scalers[name] * slices,
            ready=sum(ready_replicas("LeaderWorkerSet", m.obj) for m in group),
            gpus_per_replica=gpus_per_replica("LeaderWorkerSet", first.obj),
            caught_up=all(caught_up(m.obj) for m in group), unit=slices, members=tuple(m.name for m in group)))
    for m in found:
        if id(m.obj) in ds_members or m.role not in ROLES:
            continue
        by_role[m.role].append(Target(
            kind=DEPLOYMENT if m.kind == "Deployment" else LWS, name=m.name, role=m.role, replicas=_replicas(m.obj),
            ready=ready_replicas(m.kind, m.obj), gpus_per_replica=gpus_per_replica(m.kind, m.obj),
            caught_up=caught_up(m.obj)))
    for role, ts in by_role.items():
        if len(ts) > 1:
            problems.append(f"{len(ts)} {role} targets ({', '.join(t.ref for t in ts)}): the planner scales one per role")
        elif not ts and not problems:
            problems.append(f"no {role} model server (none with {role_label}={role})")
    if problems:
        raise PoolShapeError(f"InferencePool {pool_ref}: {'; '.join(problems)}")
    return {role: ts[0] for role, ts in by_role.items()}

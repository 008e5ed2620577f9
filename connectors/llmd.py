"""The llm-d connector: scale the prefill and decode model servers of an InferencePool through their /scale.

The pool's targets are found as llm-d labels them (connectors.kube.llmd_pool): the
Deployments, LeaderWorkerSets or DisaggregatedSet role scalers whose pods the
pool selects, by `llm-d.ai/role`. Reads: the InferencePool, the namespace's
Deployments and LeaderWorkerSets (lists), a role scaler's /scale, and, to
check nobody else scales the same object, its HorizontalPodAutoscalers
(autoscaling/v2) and KEDA ScaledObjects (lists). Writes: the pool's
annotations (the last decision and the recommendation history,
connectors.kube.annotation_ledger, guarded by resourceVersion), then each changed
target's /scale (autoscaling/v1 Scale, merge patch of spec.replicas). Nothing
else is written.

Another autoscaler on a target would undo every write: an HPA is refused, in
one line naming it; a KEDA ScaledObject too, unless `on_autoscaler: pause`,
which sets its `autoscaling.keda.sh/paused-replicas` annotation to the
planner's target before writing /scale (KEDA then holds the target there).

With `actuation: keda` the connector writes no /scale: the planner publishes
its desired replicas per pool and role (connectors.planner_metrics, the gauge
connectors.kube.keda.GAUGE) and one ScaledObject per role applies it; the connector
checks each target has exactly such a ScaledObject (one on another metric is a
one-line error naming it) and that its bounds let KEDA apply the decision.

A decision is done when both roles' ready replicas equal its targets and
their controllers have observed the current generation.
"""

from __future__ import annotations

import logging

from kubernetes import client as k8s_client

from connectors.kube import keda, llmd_pool
from connectors.kube.annotation_ledger import AnnotationLedger
from connectors.base import (
    ConcurrentWriteError,
    ConnectorError,
    ResourceAccessError,
    as_applied_targets,
    changes_as_recent_targets,
    recommendation_entry,
    recommendation_of,
    refuse_stale,
)
from connectors.config import LlmdConnectorConfig
from connectors.kube.session import KubeSession
from connectors.kube.llmd_pool import DSRS, LWS, ROLES, PoolShapeError, Target
from planner.types import Decision, DecisionRecord, FleetState, PoolState

log = logging.getLogger(__name__)

POOL_GROUP, POOL_VERSION, POOLS_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"
KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS = "keda.sh", "v1alpha1", "scaledobjects"
MERGE_PATCH = "application/merge-patch+json"


def autoscalers_of(target: Target, *, hpas: list[dict], scaled_objects: list[dict]) -> tuple[list[dict], list[dict]]:
    """(ScaledObjects, HPAs not made by one of them) that scale `target`."""
    key = (target.kind[0], target.kind[1], target.name)
    sos = [so for so in scaled_objects if keda.scale_target(so) == key]
    keda_hpas = {((so.get("status") or {}).get("hpaName")
                  or ((so["spec"].get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("name")
                  or f"keda-hpa-{so['metadata']['name']}") for so in sos}
    plain = [h for h in hpas if keda.scale_target(h) == key and h["metadata"]["name"] not in keda_hpas
             and not any(o.get("kind") == "ScaledObject" for o in h["metadata"].get("ownerReferences") or [])]
    return sos, plain


class LlmdConnector:
    """Connector for one InferencePool; every call reads the pool and its targets afresh."""

    def __init__(self, config: LlmdConnectorConfig, *, default_namespace: str = "default",
                 api_client: k8s_client.ApiClient | None = None):
        self.config = config
        self.namespace = config.namespace or default_namespace
        self.name = config.inference_pool
        self._session = KubeSession(
            auth=config.auth, kubeconfig_path=config.kubeconfig_path, kubeconfig_context=config.kubeconfig_context,
            resource=self.resource, not_found_hint="check connector.inference_pool and namespace",
            api_client=api_client)
        self.auth_source = self._session.auth_source
        self._ledger = AnnotationLedger(prefix=config.annotation_prefix, resource=self.resource)

    @property
    def resource(self) -> str:
        return f"{POOLS_PLURAL}.{POOL_GROUP}/{self.name} in namespace {self.namespace}"

    @property
    def pool_ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    # -- Connector interface -------------------------------------------------

    def validate(self) -> None:
        """The pool exists, has one prefill and one decode target, and nobody else scales them
        (actuation keda: each has the ScaledObject that applies the planner's gauge)."""
        pool, targets = self._read(doing="validating")
        self._ledger.validate(pool)
        self._check_autoscalers(targets, want=None)

    def validate_reads(self) -> None:
        """What a reader needs (connectors.read_only, advisory mode): the pool and its two targets; another
        autoscaler on them is expected, not refused."""
        pool, _ = self._read(doing="validating")
        self._ledger.validate(pool)

    def read_fleet(self, *, now_s: float) -> FleetState:
        pool, targets = self._read(doing="reading the fleet")
        return FleetState(
            prefill=self._pool_state(targets["prefill"]),
            decode=self._pool_state(targets["decode"]),
            last_decision=self._last_decision(pool, targets),
            recent_targets=changes_as_recent_targets(self._ledger.recommendations(pool), now_s=now_s),
            applied_targets=as_applied_targets(self._ledger.history(pool)),
        )

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Record a changed recommendation on the pool, and write changed targets to their /scale.

        Targets are rounded up to whole /scale units (a DisaggregatedSet role scaler's
        replicas apply per slice). Returns the new decision's record, or None when no
        targets were written. A conflict on the pool re-reads and retries.
        """
        cfg = self.config
        recommended = recommendation_of(decision)
        entry = recommendation_entry(t_s=now_s, prefill=recommended[0], decode=recommended[1])
        conflicts = []
        for _ in range(cfg.conflict_retries + 1):
            pool, targets = self._read(doing="reading before apply")
            refuse_stale(decision, (targets["prefill"].replicas, targets["decode"].replicas), resource=self.resource)
            asked = {"prefill": decision.prefill_replicas, "decode": decision.decode_replicas}
            want = {r: targets[r].scale_replicas(asked[r]) * targets[r].unit for r in ROLES}
            changed = [r for r in ROLES if decision.apply and targets[r].replicas != want[r]]
            pauses = self._check_autoscalers(targets, want=want if decision.apply else None)
            annotations = self._ledger.updates(pool, entry=entry, want=want if changed else None, now_s=now_s,
                                               max_entries=cfg.history_max_entries, max_age_s=cfg.history_max_age_s)
            if not annotations and not pauses:
                return None
            try:
                if annotations:
                    pool = self._patch_pool(pool, annotations, doing="recording the decision" if changed
                                            else "recording the recommendation")
            except ConcurrentWriteError as exc:
                conflicts.append(str(exc))
                continue
            for so, replicas in pauses:
                self._pause(so, replicas)
            if cfg.actuation == "scale":
                for role in changed:
                    self._scale(targets[role], targets[role].scale_replicas(want[role]))
            if not changed:
                return None
            return DecisionRecord(self._ledger.decision_id(pool), float(now_s), want["prefill"], want["decode"],
                                  done=False)
        raise ConcurrentWriteError(
            f"{self.resource}: patch kept conflicting with other writers ({len(conflicts)} attempts, "
            f"conflict_retries={cfg.conflict_retries}); last: {conflicts[-1]}")

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        pool, targets = self._read(doing="checking the last decision")
        record = self._last_decision(pool, targets)
        return record is None or record.done

    def read_autoscalers(self) -> list[dict]:
        """The KEDA ScaledObjects that scale the pool's prefill and decode targets (`sla-planner import llmd --live`)."""
        _, targets = self._read(doing="finding the pool's targets")
        sos = self._custom_list(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, doing="reading the ScaledObjects")
        return [so for role in ROLES for so in autoscalers_of(targets[role], hpas=[], scaled_objects=sos)[0]]

    # -- reading -------------------------------------------------------------

    def _read(self, *, doing: str) -> tuple[dict, dict[str, Target]]:
        """The pool and its prefill and decode targets."""
        pool = self._custom_get(POOL_GROUP, POOL_VERSION, POOLS_PLURAL, self.name, doing=doing)
        try:
            match = llmd_pool.selector(pool, pool_ref=self.pool_ref)
            deployments = self._list_deployments(doing=doing)
            lwss = self._custom_list(LWS[0], "v1", LWS[2], doing=doing)
            found = llmd_pool.members(match, deployments=deployments, lwss=lwss, role_label=self.config.role_label)
            scalers = {f"{ds}-{role}": self._role_scaler_replicas(f"{ds}-{role}", doing=doing)
                       for ds, role in llmd_pool.role_scaler_groups(found)}
            return pool, llmd_pool.targets(found, pool_ref=self.pool_ref, role_label=self.config.role_label,
                                           scalers=scalers)
        except PoolShapeError as exc:
            raise ResourceAccessError(str(exc)) from None

    @staticmethod
    def _pool_state(target: Target) -> PoolState:
        return PoolState(target.replicas, target.ready, target.gpus_per_replica)

    def _last_decision(self, pool: dict, targets: dict[str, Target]) -> DecisionRecord | None:
        last = self._ledger.last_targets(pool)
        if last is None:
            return None
        decision_id, decided_at_s, prefill, decode = last
        done = all(t.caught_up for t in targets.values()) and (targets["prefill"].ready, targets["decode"].ready) \
            == (prefill, decode)
        return DecisionRecord(decision_id, decided_at_s, prefill, decode, done=done)

    def _check_autoscalers(self, targets: dict[str, Target], *, want: dict[str, int] | None) -> list[tuple[dict, int]]:
        """Raise, in one line naming it, for an autoscaler that would fight (or, keda, not apply) the planner;
        the ScaledObjects to pause at a count (on_autoscaler pause, `want` given)."""
        hpas = self._list_hpas(doing="looking for autoscalers on the pool's targets")
        sos = self._custom_list(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS,
                                doing="looking for KEDA ScaledObjects on the pool's targets")
        pauses = []
        for role in ROLES:
            target = targets[role]
            found, plain = autoscalers_of(target, hpas=hpas, scaled_objects=sos)
            what = f"InferencePool {self.pool_ref}: {role} target {target.ref}"
            if plain:
                raise ConnectorError(
                    f"{what} is scaled by HorizontalPodAutoscaler {keda.name_of(plain[0])}: the planner's writes "
                    f"would fight it; delete it (or, for the KEDA path, replace it with the ScaledObject of "
                    f"connector.actuation keda)")
            if self.config.actuation == "keda":
                self._check_keda(what, target, found, want)
                continue
            if found and self.config.on_autoscaler == "refuse":
                raise ConnectorError(
                    f"{what} is scaled by KEDA ScaledObject {keda.name_of(found[0])}: the planner's /scale writes "
                    f"would fight it; delete it, set connector.on_autoscaler: pause, or let KEDA apply the planner "
                    f"(connector.actuation: keda)")
            if want is not None:
                n = target.scale_replicas(want[role])
                pauses += [(so, n) for so in found if keda.paused_replicas(so) != n]
        return pauses

    def _check_keda(self, what: str, target: Target, found: list[dict], want: dict[str, int] | None) -> None:
        """Raise unless exactly one ScaledObject applies the planner's gauge to `target`, unpaused, within bounds."""
        role = target.role
        if not found:
            raise ConnectorError(
                f"{what} has no KEDA ScaledObject (connector.actuation keda): apply one that reads "
                f"{keda.planner_query(pool_namespace=self.namespace, pool=self.name, role=role)}")
        if len(found) > 1:
            raise ConnectorError(f"{what} is scaled by {len(found)} ScaledObjects "
                                 f"({', '.join(keda.name_of(so) for so in found)}): keep the one that reads the planner")
        (so,) = found
        problem = keda.planner_trigger_problem(so, pool_namespace=self.namespace, pool=self.name, role=role)
        if problem:
            raise ConnectorError(f"{what}: ScaledObject {keda.name_of(so)} does not apply the planner's replicas: "
                                 f"{problem}")
        query = " ".join(str(((so["spec"]["triggers"][0]).get("metadata") or {}).get("query", "")).split())
        if target.unit > 1 and not query.replace(" ", "").endswith(f"/{target.unit}"):
            raise ConnectorError(f"{what}: ScaledObject {keda.name_of(so)}: the role scaler's replicas apply in each "
                                 f"of {target.unit} slices, so its query must end with / {target.unit} (got {query})")
        if keda.paused_replicas(so) is not None or str(((so.get("metadata") or {}).get("annotations") or {})
                                                        .get(keda.PAUSED, "")).lower() == "true":
            raise ConnectorError(f"{what}: ScaledObject {keda.name_of(so)} is paused: KEDA applies nothing "
                                 f"(remove its {keda.PAUSED_REPLICAS} / {keda.PAUSED} annotation)")
        if want is not None:
            n = target.scale_replicas(want[role])
            low, high = keda.replica_bounds(so)
            if not max(low, 1) <= n <= high:
                raise ConnectorError(f"{what}: ScaledObject {keda.name_of(so)} would clamp the planner's {n} "
                                     f"replicas to [{max(low, 1)}, {high}] (minReplicaCount, maxReplicaCount)")

    # -- API calls -----------------------------------------------------------

    @property
    def _custom(self) -> k8s_client.CustomObjectsApi:
        return k8s_client.CustomObjectsApi(self._session.api_client)

    def _call(self, fn, *, verb: str, doing: str, resource: str):
        return self._session.call(fn, verb=verb, doing=doing, resource=f"{resource} in namespace {self.namespace}")

    def _custom_get(self, group: str, version: str, plural: str, name: str, *, doing: str) -> dict:
        return self._call(lambda: self._custom.get_namespaced_custom_object(
            group, version, self.namespace, plural, name, _request_timeout=self.config.request_timeout_s),
            verb="get", doing=doing, resource=f"{plural}.{group}/{name}")

    def _custom_list(self, group: str, version: str, plural: str, *, doing: str) -> list[dict]:
        """The namespace's objects of a custom kind; [] when the cluster does not serve the kind."""
        try:
            out = self._call(lambda: self._custom.list_namespaced_custom_object(
                group, version, self.namespace, plural, _request_timeout=self.config.request_timeout_s),
                verb="list", doing=doing, resource=f"{plural}.{group}")
        except ResourceAccessError as exc:
            if "404" in str(exc):
                return []
            raise
        return list(out.get("items") or [])

    def _list_deployments(self, *, doing: str) -> list[dict]:
        apps = k8s_client.AppsV1Api(self._session.api_client)
        out = self._call(lambda: apps.list_namespaced_deployment(self.namespace,
                                                                 _request_timeout=self.config.request_timeout_s),
                         verb="list", doing=doing, resource="deployments.apps")
        return self._session.api_client.sanitize_for_serialization(out).get("items") or []

    def _list_hpas(self, *, doing: str) -> list[dict]:
        api = k8s_client.AutoscalingV2Api(self._session.api_client)
        out = self._call(lambda: api.list_namespaced_horizontal_pod_autoscaler(
            self.namespace, _request_timeout=self.config.request_timeout_s),
            verb="list", doing=doing, resource="horizontalpodautoscalers.autoscaling")
        return self._session.api_client.sanitize_for_serialization(out).get("items") or []

    def _role_scaler_replicas(self, name: str, *, doing: str) -> int | None:
        """A DisaggregatedSetRoleScaler's spec.replicas through its /scale; None when it does not exist."""
        try:
            scale = self._call(lambda: self._custom.get_namespaced_custom_object_scale(
                DSRS[0], "v1", self.namespace, DSRS[2], name, _request_timeout=self.config.request_timeout_s),
                verb="get", doing=doing, resource=f"{DSRS[2]}.{DSRS[0]}/{name} (scale)")
        except ResourceAccessError as exc:
            if "404" in str(exc):
                return None
            raise
        replicas = (scale.get("spec") or {}).get("replicas")
        return replicas if isinstance(replicas, int) else 0

    def _patch_pool(self, pool: dict, annotations: dict[str, str], *, doing: str) -> dict:
        body = {"metadata": {"resourceVersion": pool["metadata"]["resourceVersion"], "annotations": annotations}}
        return self._call(lambda: self._custom.patch_namespaced_custom_object(
            POOL_GROUP, POOL_VERSION, self.namespace, POOLS_PLURAL, self.name, body, _content_type=MERGE_PATCH,
            _request_timeout=self.config.request_timeout_s),
            verb="patch", doing=doing, resource=f"{POOLS_PLURAL}.{POOL_GROUP}/{self.name}")

    def _pause(self, so: dict, replicas: int) -> None:
        name = so["metadata"]["name"]
        log.warning("%s: pausing KEDA ScaledObject %s at %d replicas (%s)", self.resource, name, replicas,
                    keda.PAUSED_REPLICAS)
        self._call(lambda: self._custom.patch_namespaced_custom_object(
            KEDA_GROUP, KEDA_VERSION, self.namespace, SCALED_OBJECTS, name,
            {"metadata": {"annotations": {keda.PAUSED_REPLICAS: str(replicas)}}}, _content_type=MERGE_PATCH,
            _request_timeout=self.config.request_timeout_s),
            verb="patch", doing=f"pausing it at {replicas} replicas", resource=f"{SCALED_OBJECTS}.{KEDA_GROUP}/{name}")

    def _scale(self, target: Target, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        group, _, plural = target.kind
        resource = f"{plural}.{group}/{target.name} (scale)"
        doing = f"scaling {target.role} to {replicas}"
        timeout = self.config.request_timeout_s
        if group == "apps":
            apps = k8s_client.AppsV1Api(self._session.api_client)
            self._call(lambda: apps.patch_namespaced_deployment_scale(
                target.name, self.namespace, body, _content_type=MERGE_PATCH, _request_timeout=timeout),
                verb="patch", doing=doing, resource=resource)
            return
        self._call(lambda: self._custom.patch_namespaced_custom_object_scale(
            group, "v1", self.namespace, plural, target.name, body, _content_type=MERGE_PATCH,
            _request_timeout=timeout), verb="patch", doing=doing, resource=resource)

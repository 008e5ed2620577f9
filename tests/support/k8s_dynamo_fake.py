"""A Kubernetes API server holding Dynamo's CRDs as a Dynamo 1.3-1.6.1 cluster serves them.

`DynamoCluster(operator="current")` (Dynamo 1.3 and later) serves, from the CRD files
Dynamo ships (../shared/dynamo/crds):

- API discovery: `/apis`, `/apis/nvidia.com`, `/apis/nvidia.com/<version>` (resources
  and subresources, as `kubectl api-resources` reads them)
- `dynamographdeployments` in v1beta1 (the storage version) and v1alpha1 (served,
  deprecated; converted on the fly as the operator's conversion webhook does:
  `spec.components[]` <-> `spec.services{}`, `status.components` <-> `status.services`,
  for the fields a planner reads and writes)
- `dynamographdeploymentscalingadapters` (v1beta1) with the `scale` subresource
  (autoscaling/v1 Scale: spec.replicas, status.replicas, status.selector)
- GET/PATCH: merge patch (RFC 7386) and JSON patch (RFC 6902, `test` failures -> 422),
  `resourceVersion` preconditions (409), 404 and 422 as `Status` objects; on every
  write, fields the CRD's structural schema does not declare are pruned, as the real
  API server does (the default `fieldValidation=Warn`), and recorded in `pruned`
- `GET /api/v1/namespaces/<ns>/pods?labelSelector=...`: the pods of the DGD's components
- the operator, as a method tests call (`reconcile`): a component with `scalingAdapter`
  gets its DGDSA `<dgd>-<lowercase name>`, whose `spec.replicas` is the source of truth
  (a direct edit of the component's replicas is put back); status filled, generation observed

`DynamoCluster(operator="v1alpha1")` is a pre-1.3 operator: only v1alpha1 DGDs (the
parent class's behaviour), no adapters. Auth, per-verb 403 and TLS come from the parent.
The 1.6.1 planner also reads `status.components.<name>.{servedModelName, gpusPerReplica, ...}`,
which 1.6.1's operator publishes but the kit's (older) CRD does not declare; they are added
to the status schema here (see the kit's README, "CRD provenance").
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import jsonpatch
import yaml

from tests.support.k8s_fake_server import MERGE_PATCH, ApiError, FakeKubeApiServer, merge_patch

GROUP = "nvidia.com"
DGD, DGDSA = "dynamographdeployments", "dynamographdeploymentscalingadapters"
KINDS = {DGD: "DynamoGraphDeployment", DGDSA: "DynamoGraphDeploymentScalingAdapter"}
JSON_PATCH = "application/json-patch+json"
CRD_DIR = Path(__file__).resolve().parents[3] / "shared" / "dynamo" / "crds"
STATUS_161 = {"servedModelName": {"type": "string"}, "runtimeComponentName": {"type": "string"},
              "gpusPerEngine": {"type": "integer"}, "gpusPerReplica": {"type": "integer"},
              "gpuPowerLimitWatts": {"type": "integer"}}
_PATH = re.compile(
    rf"^/apis/{GROUP}/(?P<version>v1alpha1|v1beta1)/namespaces/(?P<ns>[^/]+)/(?P<plural>{DGD}|{DGDSA})"
    r"/(?P<name>[^/]+)(?:/(?P<sub>status|scale))?/?$"
)
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/?$")
POD_LABEL_DGD = "nvidia.com/dynamo-graph-deployment-name"
POD_LABEL_COMPONENT = "nvidia.com/dynamo-component"


@functools.lru_cache(maxsize=None)
def crd_schema(plural: str, version: str) -> dict:
    """The openAPIV3Schema of one served version, from the CRD file Dynamo ships."""
    crd = yaml.safe_load((CRD_DIR / f"nvidia.com_{plural}.yaml").read_text())
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = copy.deepcopy(entry["schema"]["openAPIV3Schema"])
    if plural == DGD:
        key = "components" if version == "v1beta1" else "services"
        status = schema["properties"]["status"]["properties"][key]["additionalProperties"]["properties"]
        status.update(STATUS_161)
    return schema


def prune(value, schema: dict, path: str, pruned: list[str]):
    """Structural pruning: drop object fields the schema does not declare (metadata is the server's)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and schema.get("type") == "object":
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        if extra is True:
            return value
        out = {}  # an object declaring no fields keeps none (e.g. v1beta1 scalingAdapter: {enabled: true} -> {})
        for key, item in value.items():
            if props is not None and key in props:
                out[key] = prune(item, props[key], f"{path}.{key}", pruned)
            elif isinstance(extra, dict):
                out[key] = prune(item, extra, f"{path}.{key}", pruned)
            else:
                pruned.append(f"{path}.{key}")
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"], f"{path}[{i}]", pruned) for i, item in enumerate(value)]
    return value


def to_v1alpha1(obj: dict) -> dict:
    """A stored v1beta1 DGD as v1alpha1 (the conversion webhook, for what a planner reads and writes)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/v1alpha1"
    services = {}
    for comp in out["spec"].pop("components", []):
        svc = {k: v for k, v in comp.items() if k in ("replicas", "multinode", "scalingAdapter")}
        kind = comp.get("type")
        if kind in ("prefill", "decode"):
            svc.update(componentType="worker", subComponentType=kind)
        elif kind:
            svc["componentType"] = kind
        container = next(iter((comp.get("podTemplate") or {}).get("spec", {}).get("containers") or []), {})
        gpus = (container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")
        if gpus is not None:
            svc["resources"] = {"limits": {"gpu": str(gpus)}}
        services[comp["name"]] = svc
    out["spec"]["services"] = services
    if "components" in out.get("status", {}):
        out["status"]["services"] = out["status"].pop("components")
    return out


def from_v1alpha1(obj: dict, stored: dict) -> dict:
    """A v1alpha1 DGD back into the stored v1beta1 one: replicas and annotations carry over."""
    out = copy.deepcopy(stored)
    out["metadata"] = copy.deepcopy(obj["metadata"])
    services = obj["spec"].get("services") or {}
    for comp in out["spec"]["components"]:
        svc = services.get(comp["name"]) or {}
        if "replicas" in svc:
            comp["replicas"] = svc["replicas"]
    return out


class DynamoCluster(FakeKubeApiServer):
    """See the module docstring. operator: "current" (v1beta1 + adapters) or "v1alpha1" (pre-1.3)."""

    def __init__(self, *, operator: str = "current", **kwargs):
        super().__init__(**kwargs)
        if operator not in ("current", "v1alpha1", "none"):
            raise ValueError(f"operator: current, v1alpha1 or none (no Dynamo CRDs), got {operator!r}")
        self.operator = operator
        self._crs: dict[tuple[str, str, str], dict] = {}  # (plural, ns, name) -> stored object
        self.pruned: list[str] = []
        self._rules: set[tuple[str, str]] = set()  # (resource[/sub], verb) answered 403

    @property
    def versions(self) -> tuple[str, ...]:
        return {"current": ("v1beta1", "v1alpha1"), "v1alpha1": ("v1alpha1",), "none": ()}[self.operator]

    def forbid_on(self, resource: str, verb: str) -> None:
        """Answer 403 to `verb` on `resource` (e.g. "dynamographdeploymentscalingadapters/scale", "patch")."""
        self._rules.add((resource, verb))

    # -- the store (the operator and tests use these) -------------------------

    def create_dgd(self, manifest: dict, *, namespace: str) -> dict:
        if self.operator == "v1alpha1":
            return self.create(manifest, namespace=namespace)
        if manifest.get("apiVersion") != f"{GROUP}/v1beta1":
            raise ValueError(f"create_dgd: a current cluster stores v1beta1, got {manifest.get('apiVersion')}")
        return self._write(DGD, namespace, manifest["metadata"]["name"], manifest, create=True)

    def stored(self, plural: str, namespace: str, name: str) -> dict:
        with self._lock:
            obj = self._crs.get((plural, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural}.{GROUP} "{name}" not found', name=name)
            return copy.deepcopy(obj)

    def reconcile(self, namespace: str, name: str) -> dict:
        """The operator: adapters created and obeyed, status published, generation observed."""
        if self.operator == "v1alpha1":
            return super().reconcile(namespace, name)
        with self._lock:
            dgd = self.stored(DGD, namespace, name)
            components, status = {}, {}
            for comp in dgd["spec"]["components"]:
                if "scalingAdapter" in comp:
                    adapter = f"{name}-{comp['name'].lower()}"
                    try:
                        comp["replicas"] = self.stored(DGDSA, namespace, adapter)["spec"]["replicas"]
                    except ApiError:  # first reconcile: the adapter starts at the component's replicas
                        self._write(DGDSA, namespace, adapter, {
                            "apiVersion": f"{GROUP}/v1beta1", "kind": KINDS[DGDSA],
                            "metadata": {"name": adapter, "namespace": namespace},
                            "spec": {"replicas": comp.get("replicas", 1),
                                     "dgdRef": {"name": name, "componentName": comp["name"]}},
                        }, create=True)
                    self._set_status(DGDSA, namespace, adapter, {
                        "replicas": comp.get("replicas", 1),
                        "selector": f"{POD_LABEL_DGD}={name},{POD_LABEL_COMPONENT}={comp['name']}"})
                components[comp["name"]] = comp
                n = comp.get("replicas", 1)
                container = next(iter(comp.get("podTemplate", {}).get("spec", {}).get("containers") or []), {})
                gpus = int((container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0) or 0)
                status[comp["name"]] = {"componentKind": "Deployment", "replicas": n, "updatedReplicas": n,
                                        "readyReplicas": n, "availableReplicas": n, "servedModelName": "Qwen/Qwen3-0.6B",
                                        **({"gpusPerReplica": gpus} if gpus else {})}
            stored = self._crs[(DGD, namespace, name)]
            if [c.get("replicas") for c in stored["spec"]["components"]] != \
                    [c.get("replicas") for c in dgd["spec"]["components"]]:
                self._write(DGD, namespace, name, dgd)  # the adapter wins: a direct edit is put back
            generation = self._crs[(DGD, namespace, name)]["metadata"]["generation"]
            return self._set_status(DGD, namespace, name, {
                "state": "successful", "observedGeneration": generation, "components": status,
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllComponentsReady", "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]})

    def set_component_status(self, namespace: str, name: str, component: str, **fields) -> dict:
        """Change what the operator reports for one component (e.g. availableReplicas while pods start)."""
        with self._lock:
            status = self.stored(DGD, namespace, name).get("status", {})
            status.setdefault("components", {}).setdefault(component, {}).update(fields)
            return self._set_status(DGD, namespace, name, status)

    def _set_status(self, plural: str, namespace: str, name: str, status: dict) -> dict:
        obj = self._crs[(plural, namespace, name)]
        obj["status"] = prune(status, crd_schema(plural, "v1beta1")["properties"]["status"], "status", self.pruned)
        obj["metadata"]["resourceVersion"] = self._next_revision()
        return copy.deepcopy(obj)

    def _write(self, plural: str, namespace: str, name: str, obj: dict, *, create: bool = False,
               expect_rv: str | None = None) -> dict:
        with self._lock:
            current = self._crs.get((plural, namespace, name))
            if create and current is not None:
                raise ApiError(409, "AlreadyExists", f'{plural}.{GROUP} "{name}" already exists', name=name)
            if not create and current is None:
                raise ApiError(404, "NotFound", f'{plural}.{GROUP} "{name}" not found', name=name)
            if expect_rv is not None and current is not None and expect_rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            schema = crd_schema(plural, "v1beta1")
            new["spec"] = prune(new.get("spec") or {}, schema["properties"]["spec"], "spec", self.pruned)
            new["apiVersion"], new["kind"] = f"{GROUP}/v1beta1", KINDS[plural]
            if current is None:
                meta.update(namespace=namespace, name=name, generation=1, uid=f"uid-{name}")
                new.pop("status", None)
            else:
                for key in ("name", "namespace", "uid", "creationTimestamp", "generation"):
                    if key in current["metadata"]:
                        meta[key] = current["metadata"][key]
                if new["spec"] != current["spec"]:
                    meta["generation"] = current["metadata"]["generation"] + 1
                if "status" in current:
                    new["status"] = current["status"]
            meta["resourceVersion"] = self._next_revision()
            self._crs[(plural, namespace, name)] = new
            return copy.deepcopy(new)

    # -- HTTP ------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers, body_bytes: bytes) -> tuple[int, dict]:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/")
        if path in ("/apis", f"/apis/{GROUP}") or path.startswith(f"/apis/{GROUP}/v1") and path.count("/") == 3:
            token = self.record(method, parts, headers, body_bytes)[0]
            with self._lock:
                if self.tokens is not None and token not in self.tokens:  # discovery needs authentication too
                    raise ApiError(401, "Unauthorized", "Unauthorized")
            return 200, self._discovery(path)
        if self.operator == "v1alpha1":
            return super().handle(method, raw_path, headers, body_bytes)
        token, body, content_type = self.record(method, parts, headers, body_bytes)
        pods = _PODS.match(path)
        if pods and method == "GET":
            self._authorize(token, "pods", "list", pods["ns"], None)
            return 200, self._pods(pods["ns"], parse_qs(parts.query).get("labelSelector", [""])[0])
        match = _PATH.match(path)
        if match is None or match["version"] not in self.versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        plural, ns, name, sub, version = match["plural"], match["ns"], match["name"], match["sub"], match["version"]
        if (plural == DGD and sub == "scale") or (plural == DGDSA and version != "v1beta1"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = {"GET": "get", "PATCH": "patch"}.get(method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path} by this fake")
        self._authorize(token, plural + (f"/{sub}" if sub else ""), verb, ns, name)
        with self._lock:
            current = self.stored(plural, ns, name)
            if sub == "scale":
                return 200, self._scale(current) if verb == "get" else self._patch_scale(ns, name, current, body,
                                                                                          content_type)
            view = to_v1alpha1(current) if version == "v1alpha1" else current
            if verb == "get":
                return 200, view
            patched = self._apply_patch(view, body, content_type, name)
            if sub == "status":
                return 200, self._set_status(plural, ns, name, patched.get("status") or {})
            stored = from_v1alpha1(patched, current) if version == "v1alpha1" else patched
            # (a merge patch's resourceVersion was checked in _apply_patch; a JSON patch tests it itself)
            result = self._write(plural, ns, name, stored)
            return 200, to_v1alpha1(result) if version == "v1alpha1" else result

    def _authorize(self, token, resource: str, verb: str, namespace: str, name: str | None) -> None:
        with self._lock:
            valid = self.tokens
        if valid is not None and token not in valid:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        group = "" if resource == "pods" else GROUP
        if (resource, verb) in self._rules or verb in self._forbidden or self.role_denies(group, resource, verb,
                                                                                           namespace, name):
            subject = f'{resource.split("/")[0]}{"." + group if group else ""} "{name}"' if name else resource
            raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{self.user}" cannot {verb} resource '
                                             f'"{resource}" in API group "{group}" in the namespace "{namespace}"',
                           name=name)

    def _apply_patch(self, view: dict, body, content_type: str | None, name: str) -> dict:
        if content_type == MERGE_PATCH:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != view["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            return merge_patch(view, body)
        if content_type == JSON_PATCH:
            try:
                return jsonpatch.apply_patch(view, body)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                                               f"{exc}", name=name) from None
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}", name=name) from None
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: "
                       f"{JSON_PATCH}, {MERGE_PATCH}, application/apply-patch+yaml (got {content_type})")

    def _scale(self, adapter: dict) -> dict:
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: adapter["metadata"][k] for k in ("name", "namespace", "resourceVersion", "uid")},
                "spec": {"replicas": adapter["spec"].get("replicas", 0)},
                "status": {"replicas": (adapter.get("status") or {}).get("replicas", 0),
                           "selector": (adapter.get("status") or {}).get("selector", "")}}

    def _patch_scale(self, ns: str, name: str, adapter: dict, body, content_type: str | None) -> dict:
        scale = self._apply_patch(self._scale(adapter), body, content_type, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: {replicas!r}',
                           name=name)
        adapter["spec"]["replicas"] = replicas
        return self._scale(self._write(DGDSA, ns, name, adapter))

    def _discovery(self, path: str) -> dict:
        if not self.versions:
            if path == "/apis":
                return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        preferred = self.versions[0]
        group = {"name": GROUP, "versions": [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions],
                 "preferredVersion": {"groupVersion": f"{GROUP}/{preferred}", "version": preferred}}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
        if path == f"/apis/{GROUP}":
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
        version = path.rsplit("/", 1)[1]
        if version not in self.versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resources = [
            {"name": DGD, "singularName": "dynamographdeployment", "namespaced": True, "kind": KINDS[DGD],
             "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"], "shortNames": ["dgd"]},
            {"name": f"{DGD}/status", "singularName": "", "namespaced": True, "kind": KINDS[DGD],
             "verbs": ["get", "patch", "update"]},
        ]
        if version == "v1beta1":
            resources += [
                {"name": DGDSA, "singularName": "dynamographdeploymentscalingadapter", "namespaced": True,
                 "kind": KINDS[DGDSA], "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"],
                 "shortNames": ["dgdsa"]},
                {"name": f"{DGDSA}/scale", "singularName": "", "namespaced": True, "group": "autoscaling",
                 "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]},
                {"name": f"{DGDSA}/status", "singularName": "", "namespaced": True, "kind": KINDS[DGDSA],
                 "verbs": ["get", "patch", "update"]},
            ]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
                "resources": resources}

    def _pods(self, namespace: str, selector: str) -> dict:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = []
        with self._lock:
            for (plural, ns, name), obj in sorted(self._crs.items()):
                if plural != DGD or ns != namespace or wanted.get(POD_LABEL_DGD, name) != name:
                    continue
                for comp in obj["spec"]["components"]:
                    for k in range(comp.get("replicas", 1)):
                        labels = {POD_LABEL_DGD: name, POD_LABEL_COMPONENT: comp["name"]}
                        if any(labels.get(key, value) != value for key, value in wanted.items()):
                            continue
                        items.append({"metadata": {"name": f"{name}-{comp['name'].lower()}-{k}", "namespace": ns,
                                                   "labels": labels},
                                      "status": {"phase": "Running",
                                                 "conditions": [{"type": "Ready", "status": "True"}]}})
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._revision)},
                "items": items}

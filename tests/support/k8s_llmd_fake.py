"""A Kubernetes API server holding what an llm-d P/D fleet runs on, for the llm-d connector's tests.

`LlmdCluster` serves, namespaced, with GET / LIST / POST / PATCH (merge patch, JSON
patch; strategic merge patch for the built-in kinds only, as the real server) / DELETE:

- the custom kinds from the CRD files llm-d's kit holds (../shared/llmd/crds, read at
  test time): `inferencepools.inference.networking.k8s.io/v1`,
  `leaderworkersets.leaderworkerset.x-k8s.io/v1` and
  `disaggregatedsetrolescalers.disaggregatedset.x-k8s.io/v1` with the `scale`
  subresource at the paths their CRD declares (specReplicasPath, statusReplicasPath,
  labelSelectorPath), and `scaledobjects.keda.sh/v1alpha1`; fields the CRD's
  structural schema does not declare are pruned on write, as the real server does,
  and recorded in `pruned`;
- the built-in kinds `deployments.apps/v1` (with `scale`: spec.replicas, status.replicas
  and the selector as a string) and `horizontalpodautoscalers.autoscaling/v2`, pruned to
  the fields the official client's models declare;
- the `status` subresource (writes to the object keep its status, and the reverse),
  `resourceVersion` preconditions (409), `generation` bumped on spec changes, 404 for a
  kind the cluster does not serve (`kinds` leaves CRDs out: a cluster without LWS or KEDA).

Auth, RBAC enforcement (`enforce_role`), 403 switches, TLS and request recording come from
tests.support.k8s_fake_server. The controllers are methods tests call: `reconcile` makes every
Deployment and LeaderWorkerSet ready at its spec replicas, and the DisaggregatedSet
controller's part (a role scaler's replicas copied to the role's LeaderWorkerSets in every slice).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from urllib.parse import urlsplit

import jsonpatch
import yaml

from tests.support.k8s_dynamo_fake import JSON_PATCH, prune
from tests.support.k8s_fake_server import MERGE_PATCH, ApiError, FakeKubeApiServer, merge_patch

LLMD_KIT = Path(__file__).resolve().parents[3] / "shared" / "llmd"
CRD_DIR = LLMD_KIT / "crds"
EXAMPLES = LLMD_KIT / "examples"
STRATEGIC = "application/strategic-merge-patch+json"
CRD_FILES = {
    "inferencepools": "inference.networking.k8s.io_inferencepools.yaml",
    "leaderworkersets": "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "disaggregatedsetrolescalers": "disaggregatedset.x-k8s.io_disaggregatedsetrolescalers.yaml",
    "scaledobjects": "keda.sh_scaledobjects.yaml",
}
BUILTIN = {  # plural: (group, version, kind, the official client's model)
    "deployments": ("apps", "v1", "Deployment", "V1Deployment"),
    "horizontalpodautoscalers": ("autoscaling", "v2", "HorizontalPodAutoscaler", "V2HorizontalPodAutoscaler"),
}
_PATH = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                   r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|scale))?/?$")
DS_NAME, DS_ROLE, DS_SLICE = ("disaggregatedset.x-k8s.io/name", "disaggregatedset.x-k8s.io/role",
                              "disaggregatedset.x-k8s.io/slice")


@functools.lru_cache(maxsize=None)
def crd(plural: str) -> dict:
    """(group, version, kind, openAPIV3Schema, scale subresource or None) of a kit CRD's served version."""
    doc = yaml.load((CRD_DIR / CRD_FILES[plural]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in doc["spec"]["versions"] if v.get("served")]
    return {"group": doc["spec"]["group"], "version": version["name"], "kind": doc["spec"]["names"]["kind"],
            "schema": version["schema"]["openAPIV3Schema"], "scale": (version.get("subresources") or {}).get("scale")}


def prune_typed(value, type_name: str, path: str, pruned: list[str]):
    """Drop the fields the official client's model `type_name` does not declare (a built-in kind's decoding)."""
    from kubernetes import client as k8s_client

    if value is None or type_name in ("str", "int", "float", "bool", "object", "datetime", "date", "bytes"):
        return value
    if match := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        return [prune_typed(v, match[1], f"{path}[{i}]", pruned) for i, v in enumerate(value or [])]
    if match := re.fullmatch(r"(?:dict\(|Dict\[)\w+, (.+)[)\]]", type_name):
        return {k: prune_typed(v, match[1], f"{path}.{k}", pruned) for k, v in (value or {}).items()}
    model = getattr(k8s_client.models, type_name)
    by_key = {key: model.openapi_types[attr] for attr, key in model.attribute_map.items()}
    out = {}
    for key, item in (value or {}).items():
        if key in by_key:
            out[key] = prune_typed(item, by_key[key], f"{path}.{key}", pruned)
        else:
            pruned.append(f"{path}.{key}")
    return out


def _dig(obj: dict, json_path: str):
    for part in json_path.strip(".").split("."):
        obj = (obj or {}).get(part) if isinstance(obj, dict) else None
    return obj


def _put(obj: dict, json_path: str, value) -> None:
    parts = json_path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def example(name: str) -> list[dict]:
    """The documents of one of the kit's example manifests."""
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


class LlmdCluster(FakeKubeApiServer):
    """See the module docstring. kinds: the plurals served (default: every kind above)."""

    def __init__(self, *, kinds: tuple[str, ...] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.kinds = tuple(kinds or (*CRD_FILES, *BUILTIN))
        self._store: dict[tuple[str, str, str], dict] = {}  # (plural, ns, name) -> object
        self.pruned: list[str] = []

    # -- kinds ------------------------------------------------------------------

    def kind_of(self, plural: str) -> dict:
        if plural in BUILTIN:
            group, version, kind, model = BUILTIN[plural]
            scale = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": None} if plural == "deployments" else None
            return {"group": group, "version": version, "kind": kind, "model": model, "scale": scale}
        return crd(plural)

    def _prune(self, plural: str, obj: dict) -> dict:
        info = self.kind_of(plural)
        meta = obj.get("metadata") or {}
        if "model" in info:
            out = prune_typed(obj, info["model"], info["kind"], self.pruned)
        else:
            props = info["schema"].get("properties") or {}
            out = {}
            for key, value in obj.items():
                if key not in props:
                    self.pruned.append(key)
                elif key != "metadata":
                    out[key] = prune(value, props[key], key, self.pruned)
        out["metadata"] = meta
        return out

    # -- the store (tests and the controllers use these) ------------------------

    def create(self, obj: dict, *, namespace: str) -> dict:
        plural = self.plural_of(obj)
        return self._write(plural, namespace, obj["metadata"]["name"], obj, create=True)

    def plural_of(self, obj: dict) -> str:
        for plural in self.kinds:
            if self.kind_of(plural)["kind"] == obj.get("kind"):
                return plural
        raise ApiError(404, "NotFound", f"the server could not find the requested resource (kind {obj.get('kind')})")

    def stored(self, plural: str, namespace: str, name: str) -> dict:
        with self._lock:
            obj = self._store.get((plural, namespace, name))
            if obj is None:
                info = self.kind_of(plural)
                raise ApiError(404, "NotFound", f'{plural}.{info["group"]} "{name}" not found', name=name)
            return copy.deepcopy(obj)

    def objects(self, plural: str, namespace: str) -> list[dict]:
        with self._lock:
            return [copy.deepcopy(o) for (p, ns, _), o in sorted(self._store.items()) if p == plural and ns == namespace]

    def set_status(self, plural: str, namespace: str, name: str, status: dict) -> dict:
        with self._lock:
            obj = self._store[(plural, namespace, name)]
            obj["status"] = self._prune(plural, {"status": status, "metadata": {}}).get("status", {})
            obj["metadata"]["resourceVersion"] = self._next_revision()
            return copy.deepcopy(obj)

    def reconcile(self, namespace: str) -> None:
        """The controllers: role scalers applied to their LeaderWorkerSets in every slice, then every
        Deployment and LeaderWorkerSet ready at its spec replicas, generation observed."""
        with self._lock:
            for scaler in self.objects("disaggregatedsetrolescalers", namespace) if "disaggregatedsetrolescalers" \
                    in self.kinds else []:
                replicas = scaler["spec"].get("replicas", 0)
                children = [w for w in self.objects("leaderworkersets", namespace)
                            if f"{w['metadata'].get('labels', {}).get(DS_NAME)}-"
                               f"{w['metadata'].get('labels', {}).get(DS_ROLE)}" == scaler["metadata"]["name"]]
                for lws in children:
                    if lws["spec"].get("replicas") != replicas:
                        lws["spec"]["replicas"] = replicas
                        self._write("leaderworkersets", namespace, lws["metadata"]["name"], lws)
                self.set_status("disaggregatedsetrolescalers", namespace, scaler["metadata"]["name"], {
                    "replicas": replicas, "selector": f"{DS_NAME}={scaler['metadata']['name']}"})
            for plural in ("deployments", "leaderworkersets"):
                if plural not in self.kinds:
                    continue
                for obj in self.objects(plural, namespace):
                    self.set_ready(plural, namespace, obj["metadata"]["name"], obj["spec"].get("replicas", 1))

    def set_ready(self, plural: str, namespace: str, name: str, ready: int) -> dict:
        """A Deployment's or LeaderWorkerSet's controller reports `ready` replicas (generation observed)."""
        obj = self.stored(plural, namespace, name)
        n = obj["spec"].get("replicas", 1)
        status = {"replicas": n, "readyReplicas": ready, "updatedReplicas": n,
                  "observedGeneration": obj["metadata"]["generation"]}
        if plural == "deployments":
            status["availableReplicas"] = ready
        else:
            status["hpaPodSelector"] = f"leaderworkerset.sigs.k8s.io/name={name},leaderworkerset.sigs.k8s.io/worker-index=0"
        return self.set_status(plural, namespace, name, status)

    def _write(self, plural: str, namespace: str, name: str, obj: dict, *, create: bool = False) -> dict:
        with self._lock:
            info = self.kind_of(plural)
            current = self._store.get((plural, namespace, name))
            if create and current is not None:
                raise ApiError(409, "AlreadyExists", f'{plural}.{info["group"]} "{name}" already exists', name=name)
            if not create and current is None:
                raise ApiError(404, "NotFound", f'{plural}.{info["group"]} "{name}" not found', name=name)
            new = self._prune(plural, copy.deepcopy(obj))
            new["apiVersion"], new["kind"] = f"{info['group']}/{info['version']}", info["kind"]
            meta = new["metadata"] = copy.deepcopy(new.get("metadata") or {})
            if current is None:
                meta.update(namespace=namespace, name=name, generation=1, uid=f"uid-{plural}-{name}",
                            creationTimestamp="2026-01-01T00:00:00Z")
                new.pop("status", None)
            else:
                for key in ("name", "namespace", "uid", "creationTimestamp", "generation"):
                    meta[key] = current["metadata"][key]
                if new.get("spec") != current.get("spec"):
                    meta["generation"] = current["metadata"]["generation"] + 1
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            meta["resourceVersion"] = self._next_revision()
            self._store[(plural, namespace, name)] = new
            return copy.deepcopy(new)

    # -- HTTP ---------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers, body_bytes: bytes) -> tuple[int, dict]:
        parts = urlsplit(raw_path)
        token, body, content_type = self.record(method, parts, headers, body_bytes)
        match = _PATH.match(parts.path)
        if match is None or match["plural"] not in self.kinds:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        plural, ns, name, sub = match["plural"], match["ns"], match["name"], match["sub"]
        info = self.kind_of(plural)
        if (match["group"], match["version"]) != (info["group"], info["version"]) or (sub == "scale"
                                                                                       and not info["scale"]):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = {("GET", False): "list", ("GET", True): "get", ("POST", False): "create", ("PATCH", True): "patch",
                ("PUT", True): "update", ("DELETE", True): "delete"}.get((method, name is not None))
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {parts.path}")
        self._authorize(token, info["group"], plural + (f"/{sub}" if sub else ""), verb, ns, name)
        with self._lock:
            if verb == "list":
                return 200, {"apiVersion": f"{info['group']}/{info['version']}", "kind": f"{info['kind']}List",
                             "metadata": {"resourceVersion": str(self._revision)}, "items": self.objects(plural, ns)}
            if verb == "create":
                return 201, self.create({**body, "kind": info["kind"]}, namespace=ns)
            current = self.stored(plural, ns, name)
            if verb == "delete":
                del self._store[(plural, ns, name)]
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            view = self._scale(plural, current) if sub == "scale" else current
            if verb == "get":
                return 200, view
            changed = body if verb == "update" else self._apply_patch(view, body, content_type, name,
                                                                       builtin=plural in BUILTIN)
            rv = (changed.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            if sub == "scale":
                replicas = (changed.get("spec") or {}).get("replicas")
                if not isinstance(replicas, int) or replicas < 0:
                    raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: spec.replicas: '
                                                   f"{replicas!r}", name=name)
                _put(current, info["scale"]["specReplicasPath"], replicas)
                return 200, self._scale(plural, self._write(plural, ns, name, current))
            if sub == "status":
                return 200, self.set_status(plural, ns, name, changed.get("status") or {})
            return 200, self._write(plural, ns, name, changed)

    def _authorize(self, token, group: str, resource: str, verb: str, namespace: str, name: str | None) -> None:
        with self._lock:
            valid = self.tokens
        if valid is not None and token not in valid:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        if verb in self._forbidden or self.role_denies(group, resource, verb, namespace, name):
            subject = f'{resource.split("/")[0]}.{group} "{name}"' if name else f"{resource}.{group}"
            raise ApiError(403, "Forbidden", f'{subject} is forbidden: User "{self.user}" cannot {verb} resource '
                                             f'"{resource}" in API group "{group}" in the namespace "{namespace}"',
                           name=name)

    def _apply_patch(self, view: dict, body, content_type: str | None, name: str, *, builtin: bool) -> dict:
        if content_type == MERGE_PATCH or (builtin and content_type == STRATEGIC):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            return merge_patch(view, body)
        if content_type == JSON_PATCH:
            try:
                return jsonpatch.apply_patch(view, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}", name=name) from None
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: "
                       f"{JSON_PATCH}, {MERGE_PATCH}{', ' + STRATEGIC if builtin else ''}, "
                       f"application/apply-patch+yaml (got {content_type})")

    def _scale(self, plural: str, obj: dict) -> dict:
        """The autoscaling/v1 Scale of an object, read at its kind's scale paths."""
        paths = self.kind_of(plural)["scale"]
        if plural == "deployments":
            labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        else:
            selector = _dig(obj, paths["labelSelectorPath"]) or ""
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                             "creationTimestamp")},
                "spec": {"replicas": _dig(obj, paths["specReplicasPath"]) or 0},
                "status": {"replicas": _dig(obj, paths["statusReplicasPath"]) or 0, "selector": selector}}


def pool_manifest(name: str, match_labels: dict, *, port: int = 8000) -> dict:
    """An InferencePool as llm-d's P/D guide makes one (the EPP Service named after the pool)."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": dict(match_labels)}, "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}}}}

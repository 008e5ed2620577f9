"""A small Kubernetes API server for the DynamoGraphDeployment custom resource.

No real API server can run here, so the Kubernetes connector is tested with the
official `kubernetes` client against this one. It implements the parts of the
API machinery the connector relies on, as the real server behaves:

- GET / LIST (namespaced and all namespaces) / POST / PUT / PATCH / DELETE on
  `/apis/nvidia.com/v1alpha1/namespaces/{ns}/dynamographdeployments[/{name}]`
- the `status` subresource: writes to the main resource ignore `status`,
  writes to `/status` ignore everything but `status`
- PATCH with `application/merge-patch+json` (RFC 7386); other patch types get
  415 as for a custom resource
- `metadata.resourceVersion` increases with every write (one counter, as etcd's
  revision); a PATCH carrying a stale resourceVersion, or a PUT with one, gets
  409 Conflict; a PUT without one gets 422 Invalid
- `metadata.generation` increases when `spec` changes
- errors are `Status` objects (kind Status, apiVersion v1, status Failure,
  reason, message, details {name, group, kind}, code)
- optional bearer-token check (401; the scheme is case-insensitive, as the
  real authenticator's, and several tokens can be valid at once, as during a
  service-account token rotation) and per-verb 403 Forbidden (RBAC-style
  message naming verb, resource, group and namespace)
- optional HTTPS with a certificate the test makes (`make_self_signed_cert`),
  so the client's in-cluster loader (https only, CA file) can be used as is

Tests drive the "operator" side through methods (`reconcile`, `set_ready`) and
can inject a concurrent writer with `before_next`.
"""

from __future__ import annotations

import copy
import datetime as dt
import ipaddress
import json
import re
import ssl
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

GROUP = "nvidia.com"
VERSION = "v1alpha1"
PLURAL = "dynamographdeployments"
KIND = "DynamoGraphDeployment"
MERGE_PATCH = "application/merge-patch+json"

_PATH_RE = re.compile(
    rf"^/apis/{re.escape(GROUP)}/{VERSION}"
    rf"(?:/namespaces/(?P<ns>[^/]+))?/{PLURAL}(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?/?$"
)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def load_manifest(path: Path) -> dict:
    """A DynamoGraphDeployment manifest (YAML) as a dict; fails naming the file."""
    obj = yaml.safe_load(Path(path).read_text())
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        raise ValueError(f"{path}: expected a {KIND} manifest, got kind {obj.get('kind') if isinstance(obj, dict) else obj!r}")
    return obj


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, *, name: str | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.name = code, reason, message, name

    def status(self) -> dict:
        details = {"group": GROUP, "kind": PLURAL}
        if self.name:
            details["name"] = self.name
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": details,
            "code": self.code,
        }


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict
    content_type: str | None
    body: object
    token: str | None = None  # the bearer token sent, if any


def make_self_signed_cert(directory: Path, *, ip: str = "127.0.0.1", dns: str = "localhost") -> tuple[Path, Path]:
    """A self-signed server certificate for `ip` and `dns` (its own CA): (cert.pem, key.pem) in directory."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kube-apiserver")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)), x509.DNSName(dns)]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "apiserver.crt", directory / "apiserver.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class FakeKubeApiServer:
    """DynamoGraphDeployment API on 127.0.0.1 (a free port); start() / stop()."""

    def __init__(self, *, token: str | None = None, user: str = "system:serviceaccount:dynamo:planner",
                 tls: tuple[Path, Path] | None = None):
        """token: the one valid bearer token (None: no check); tls: (cert, key) PEM files to serve HTTPS."""
        self.tokens: set[str] | None = None if token is None else {token}
        self.user = user
        self.tls = tls
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str], dict] = {}
        self._revision = 1000
        self._forbidden: set[str] = set()
        self.role: dict | None = None
        self._hooks: list[tuple[str, Callable[[], None]]] = []
        self.requests: list[RecordedRequest] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> "FakeKubeApiServer":
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile=str(self.tls[0]), keyfile=str(self.tls[1]))
            # The handshake happens in the request's thread, so one stalled client blocks no other.
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-kube-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    # -- test controls -------------------------------------------------------

    def accept_tokens(self, *tokens: str) -> None:
        """From now on only these bearer tokens are valid (a rotation: the new one, maybe the old one too)."""
        with self._lock:
            self.tokens = set(tokens)

    def enforce_role(self, role: dict | None) -> None:
        """From now on authorize as Kubernetes RBAC would with only this Role bound (a parsed
        rbac.authorization.k8s.io/v1 Role manifest; None: allow everything). Non-resource URLs
        (API discovery) stay open to authenticated users, as the default system:discovery role has it."""
        with self._lock:
            self.role = role

    def role_denies(self, group: str, resource: str, verb: str, namespace: str | None, name: str | None) -> bool:
        """Whether the enforced Role refuses `verb` on `resource` (plural[/subresource]) of `group`."""
        with self._lock:
            role = self.role
        if role is None:
            return False
        if namespace is None or namespace != (role.get("metadata") or {}).get("namespace", namespace):
            return True  # a Role grants nothing outside its namespace, nothing cluster-wide
        return not any(_rule_allows(rule, group, resource, verb, name) for rule in role.get("rules") or [])

    def forbid(self, *verbs: str) -> None:
        """Answer 403 to these RBAC verbs (get, list, create, update, patch, delete)."""
        with self._lock:
            self._forbidden = set(verbs)

    def before_next(self, method: str, fn: Callable[[], None]) -> None:
        """Run fn (e.g. another writer's change) just before handling the next `method` request."""
        with self._lock:
            self._hooks.append((method.upper(), fn))

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- store (also what the "operator" and "other writers" use) -------------

    def create(self, obj: dict, *, namespace: str) -> dict:
        with self._lock:
            name = (obj.get("metadata") or {}).get("name")
            if not name:
                raise ApiError(422, "Invalid", f"{KIND}.{GROUP} \"\" is invalid: metadata.name: Required value")
            if (namespace, name) in self._objects:
                raise ApiError(409, "AlreadyExists", f'{PLURAL}.{GROUP} "{name}" already exists', name=name)
            stored = copy.deepcopy(obj)
            stored["apiVersion"] = f"{GROUP}/{VERSION}"
            stored["kind"] = KIND
            stored.pop("status", None)  # status subresource: create ignores it
            meta = stored.setdefault("metadata", {})
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                resourceVersion=self._next_revision(),
            )
            self._objects[(namespace, name)] = stored
            return copy.deepcopy(stored)

    def get(self, namespace: str, name: str) -> dict:
        with self._lock:
            return copy.deepcopy(self._require(namespace, name))

    def patch(self, namespace: str, name: str, patch: dict, *, subresource: str | None = None) -> dict:
        """Merge-patch as the API server does (resourceVersion precondition included)."""
        with self._lock:
            current = self._require(namespace, name)
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            return self._store(namespace, name, merge_patch(current, patch), subresource=subresource)

    def replace(self, namespace: str, name: str, obj: dict, *, subresource: str | None = None) -> dict:
        with self._lock:
            current = self._require(namespace, name)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if not rv:
                raise ApiError(
                    422, "Invalid",
                    f'{KIND}.{GROUP} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
                    "must be specified for an update",
                    name=name,
                )
            if rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(name)
            return self._store(namespace, name, copy.deepcopy(obj), subresource=subresource)

    def delete(self, namespace: str, name: str) -> dict:
        with self._lock:
            obj = self._require(namespace, name)
            del self._objects[(namespace, name)]
            self._next_revision()
            return obj

    def list(self, namespace: str | None) -> dict:
        with self._lock:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self._objects.items()) if namespace in (None, ns)]
            return {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": f"{KIND}List",
                "metadata": {"resourceVersion": str(self._revision)},
                "items": items,
            }

    def set_ready(self, namespace: str, name: str, service: str, *, ready: int, replicas: int | None = None,
                  field: str = "readyReplicas") -> dict:
        """The operator reports one service's replicas (status.services.<service>)."""
        obj = self.get(namespace, name)
        spec_replicas = obj["spec"]["services"][service].get("replicas", 1)
        entry = {
            "componentKind": "Deployment",
            "componentName": f"{name}-{service.lower()}",
            "replicas": spec_replicas if replicas is None else replicas,
            "updatedReplicas": spec_replicas if replicas is None else replicas,
            field: ready,
        }
        return self.patch(namespace, name, {"status": {"services": {service: entry}}}, subresource="status")

    def reconcile(self, namespace: str, name: str) -> dict:
        """The operator finished: every service ready at its spec replicas, generation observed."""
        obj = self.get(namespace, name)
        services = {}
        for service, spec in obj["spec"].get("services", {}).items():
            n = spec.get("replicas", 1)
            services[service] = {
                "componentKind": "Deployment",
                "componentName": f"{name}-{service.lower()}",
                "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
            }
        status = {
            "state": "successful",
            "observedGeneration": obj["metadata"]["generation"],
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllServicesReady",
                            "message": "All services are ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "services": services,
        }
        return self.patch(namespace, name, {"status": status}, subresource="status")

    # -- internals -----------------------------------------------------------

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _require(self, namespace: str, name: str) -> dict:
        obj = self._objects.get((namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{PLURAL}.{GROUP} "{name}" not found', name=name)
        return obj

    def _conflict(self, name: str) -> ApiError:
        return ApiError(
            409, "Conflict",
            f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            name=name,
        )

    def _store(self, namespace: str, name: str, new: dict, *, subresource: str | None) -> dict:
        current = self._objects[(namespace, name)]
        if subresource == "status":
            stored = copy.deepcopy(current)
            if "status" in new:
                stored["status"] = new["status"]
            else:
                stored.pop("status", None)
        else:
            stored = new
            if "status" in current:
                stored["status"] = copy.deepcopy(current["status"])
            else:
                stored.pop("status", None)
            # System fields belong to the server, whatever the client sent.
            for key in ("name", "namespace", "uid", "creationTimestamp", "generation"):
                stored.setdefault("metadata", {})[key] = current["metadata"][key]
            if stored.get("spec") != current.get("spec"):
                stored["metadata"]["generation"] = current["metadata"]["generation"] + 1
        stored["apiVersion"], stored["kind"] = f"{GROUP}/{VERSION}", KIND
        stored["metadata"]["resourceVersion"] = self._next_revision()
        self._objects[(namespace, name)] = stored
        return copy.deepcopy(stored)

    def _check_auth(self, token: str | None, verb: str, namespace: str | None, name: str | None,
                    sub: str | None) -> None:
        with self._lock:
            valid = self.tokens
        if valid is not None and token not in valid:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        if verb in self._forbidden or self.role_denies(GROUP, PLURAL + (f"/{sub}" if sub else ""), verb, namespace, name):
            resource = PLURAL + (f"/{sub}" if sub else "")
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            subject = f'{PLURAL}.{GROUP} "{name}"' if name else f"{PLURAL}.{GROUP}"
            raise ApiError(
                403, "Forbidden",
                f'{subject} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
                f'in API group "{GROUP}"{where}',
                name=name,
            )

    def record(self, method: str, parts, headers, body_bytes: bytes) -> tuple[str | None, object, str | None]:
        """Record a request and run the hooks waiting for its method: (bearer token, parsed body, content type)."""
        content_type = (headers.get("Content-Type") or "").split(";")[0].strip() or None
        try:
            body = json.loads(body_bytes) if body_bytes else None
        except ValueError:
            body = body_bytes.decode(errors="replace")
        token = _bearer_token(headers.get("Authorization"))
        with self._lock:
            self.requests.append(RecordedRequest(method, parts.path, parse_qs(parts.query), content_type, body, token))
            hooks = [fn for m, fn in self._hooks if m == method]
            self._hooks = [(m, fn) for m, fn in self._hooks if m != method]
        for fn in hooks:
            fn()
        return token, body, content_type

    def handle(self, method: str, raw_path: str, headers, body_bytes: bytes) -> tuple[int, dict]:
        parts = urlsplit(raw_path)
        token, body, content_type = self.record(method, parts, headers, body_bytes)
        discovery = _discovery_v1alpha1(parts.path.rstrip("/"))
        if discovery is not None:
            with self._lock:
                if self.tokens is not None and token not in self.tokens:  # discovery needs authentication too
                    raise ApiError(401, "Unauthorized", "Unauthorized")
            return 200, discovery
        match = _PATH_RE.match(parts.path)
        if match is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, name, sub = match["ns"], match["name"], match["sub"]
        verb = {
            ("GET", False): "list", ("GET", True): "get", ("POST", False): "create",
            ("PUT", True): "update", ("PATCH", True): "patch", ("DELETE", True): "delete",
        }.get((method, name is not None))
        if verb is None or (ns is None and verb != "list") or (sub and verb not in ("get", "update", "patch")):
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {parts.path}")
        self._check_auth(token, verb, ns, name, sub)
        if verb == "list":
            return 200, self.list(ns)
        if verb == "get":
            return 200, self.get(ns, name)
        if verb == "delete":
            self.delete(ns, name)
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": GROUP, "kind": PLURAL}}
        if verb == "patch" and content_type != MERGE_PATCH:
            raise ApiError(
                415, "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json-patch+json, {MERGE_PATCH}, application/apply-patch+yaml "
                f"(this fake implements {MERGE_PATCH} only; got {content_type})",
            )
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", f"the body of the request is not a JSON object: {body!r:.100}")
        if verb == "create":
            return 201, self.create(body, namespace=ns)
        if verb == "update":
            return 200, self.replace(ns, name, body, subresource=sub)
        return 200, self.patch(ns, name, body, subresource=sub)


def _discovery_v1alpha1(path: str) -> dict | None:
    """API discovery of a cluster whose operator predates Dynamo 1.3: v1alpha1 DGDs only."""
    version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
    group = {"name": GROUP, "versions": [version], "preferredVersion": version}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    if path == f"/apis/{GROUP}":
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    if path == f"/apis/{GROUP}/{VERSION}":
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}", "resources": [
            {"name": PLURAL, "singularName": "dynamographdeployment", "namespaced": True, "kind": KIND,
             "verbs": ["delete", "get", "list", "patch", "create", "update", "watch"]},
            {"name": f"{PLURAL}/status", "singularName": "", "namespaced": True, "kind": KIND,
             "verbs": ["get", "patch", "update"]}]}
    return None


def _rule_allows(rule: dict, group: str, resource: str, verb: str, name: str | None) -> bool:
    """One RBAC PolicyRule: group, resource (with its subresource, as "pods/log") and verb must each be
    listed or "*"; resourceNames, when set, must list the object (and then no list or create passes)."""
    def listed(values, value) -> bool:
        return "*" in (values or []) or value in (values or [])

    names = rule.get("resourceNames") or []
    return (listed(rule.get("apiGroups"), group) and listed(rule.get("resources"), resource)
            and listed(rule.get("verbs"), verb) and (not names or (name is not None and name in names)))


def _bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive, as for the real server."""
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class _Handler(BaseHTTPRequestHandler):
    api: FakeKubeApiServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle on, the body waits for the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            code, payload = self.api.handle(self.command, self.path, self.headers, body)
        except ApiError as err:
            code, payload = err.code, err.status()
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format, *args) -> None:  # keep test output quiet
        pass


# -- pytest fixtures ---------------------------------------------------------

TEST_TOKEN = "test-token-not-a-secret"


def kube_api_client(server: FakeKubeApiServer, *, token: str | None = TEST_TOKEN):
    """An official-client ApiClient pointed at the fake server."""
    from kubernetes import client

    cfg = client.Configuration(host=server.url)
    if token is not None:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


def seed_dgd(server: FakeKubeApiServer, manifest: Path, *, namespace: str, ready: bool = True) -> dict:
    """Create the DGD from a manifest; with ready=True the "operator" reports it ready."""
    obj = server.create(load_manifest(manifest), namespace=namespace)
    if ready:
        obj = server.reconcile(namespace, obj["metadata"]["name"])
    return obj


@pytest.fixture(scope="session")
def fake_k8s_api() -> FakeKubeApiServer:
    """One fake API server for the session (token TEST_TOKEN); tests use unique namespaces."""
    server = FakeKubeApiServer(token=TEST_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fake_k8s_api_tls(tmp_path_factory) -> FakeKubeApiServer:
    """A second fake API server, HTTPS only, with a self-signed certificate for 127.0.0.1 made here.

    Its certificate (which is its own CA) is `server.tls[0]`; tests set the valid tokens with accept_tokens.
    """
    server = FakeKubeApiServer(token=TEST_TOKEN, tls=make_self_signed_cert(tmp_path_factory.mktemp("k8s-tls"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def dgd_manifest(shared_data: Path) -> Path:
    """The real Dynamo manifest: vllm-disagg, services Frontend, decode, prefill (TP1 each)."""
    path = shared_data / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D" / "disagg.yaml"
    if not path.is_file():
        pytest.fail(f"DGD manifest not found at {path}")
    return path


@pytest.fixture
def k8s_namespace(fake_k8s_api: FakeKubeApiServer) -> str:
    """A namespace no other test uses; the fake server's 403 switches are reset."""
    fake_k8s_api.forbid()
    fake_k8s_api.clear_requests()
    return f"ns-{uuid.uuid4().hex[:10]}"

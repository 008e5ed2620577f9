"""One Kubernetes API server as a connector talks to it: credentials, calls, and errors that name what was asked.

Credentials: the in-cluster service account (the official loader, which
re-reads the rotated token file every minute) or a kubeconfig. A 401 makes the
session load them again and retry once, so a token revoked right after its
rotation costs one request; a second 401 is an error naming the credentials.
An `ApiException` becomes a `ConnectorError` naming the verb, the object and
the grant or setting to check; an unreachable server a `ConnectorUnavailableError`
(the task's retries apply).
"""

from __future__ import annotations

import json
import os
from typing import Callable, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.config.config_exception import ConfigException

from connectors.base import ConcurrentWriteError, ConnectorError, ConnectorUnavailableError, ResourceAccessError

T = TypeVar("T")


class KubeSession:
    """Credentials for one API server and the calls made with them.

    auth: auto (in-cluster when KUBERNETES_SERVICE_HOST is set), in_cluster or
    kubeconfig. api_client: use this client instead (tests; never reloaded).
    resource: the connector's object, named in errors without one of their own.
    not_found_hint: what a 404 should make the user check.
    """

    def __init__(self, *, auth: str, kubeconfig_path: str | None, kubeconfig_context: str | None,
                 resource: str, not_found_hint: str, api_client: k8s_client.ApiClient | None = None):
        self.kubeconfig_path = kubeconfig_path
        self.kubeconfig_context = kubeconfig_context
        self.resource = resource
        self.not_found_hint = not_found_hint
        self.in_cluster = auth == "in_cluster" or (auth == "auto" and incluster_config.SERVICE_HOST_ENV_NAME in os.environ)
        # Credentials we loaded ourselves can be loaded again (a rotated token); an injected client cannot.
        self.reloadable = api_client is None
        self.auth_source = "the given API client" if api_client is not None else self._auth_source()
        self.api_client = api_client or self._make_api_client()

    def call(self, fn: Callable[[], T], *, verb: str, doing: str, resource: str | None = None,
             default_grant: str = "") -> T:
        """fn() (which reads self.api_client), with a 401 answered by reloading the credentials once.

        verb: the RBAC verb, for a 403's hint; default_grant: the resource a 403 asks to grant
        when `resource` names none.
        """
        try:
            try:
                return fn()
            except ApiException as exc:
                if exc.status != 401 or not self.reloadable:
                    raise
                # A 401 with credentials we loaded: the token may have been rotated (and the old
                # one revoked) since we read it; read them again and retry once.
                self.api_client = self._make_api_client()
                return fn()
        except ApiException as exc:
            raise self.api_error(exc, verb=verb, doing=doing, resource=resource, default_grant=default_grant) from exc
        except urllib3.exceptions.HTTPError as exc:
            host = self.api_client.configuration.host
            reason = getattr(exc, "reason", None)
            if isinstance(exc, urllib3.exceptions.SSLError) or isinstance(reason, urllib3.exceptions.SSLError):
                ca = self.api_client.configuration.ssl_ca_cert
                raise ConnectorError(
                    f"{self.resource}: {doing}: TLS with the Kubernetes API server {host} failed "
                    f"(auth from {self.auth_source}; CA file {ca or 'none: the system CAs'}): {reason or exc}"
                ) from exc
            raise ConnectorUnavailableError(
                f"{self.resource}: {doing}: Kubernetes API server {host} unreachable ({exc})"
            ) from exc

    def api_error(self, exc: ApiException, *, verb: str, doing: str, resource: str | None = None,
                  default_grant: str = "") -> ConnectorError:
        """The ConnectorError an API answer means, in one line naming verb, object and what to check."""
        try:
            status = json.loads(exc.body or "{}")
        except ValueError:
            status = {}
        message = status.get("message") if isinstance(status, dict) else None
        message = message or exc.reason or "no message"
        what = f"{verb} {resource or self.resource}"
        if exc.status == 409:
            return ConcurrentWriteError(f"{what}: 409 Conflict: {message}")
        if exc.status == 403:
            granted = (resource or default_grant).split(" in namespace")[0].split("/")[0]
            sub = "/scale" if resource and "(scale)" in resource else ""
            return ResourceAccessError(
                f"{what}: 403 Forbidden: {message} (grant the planner's service account the "
                f"{verb!r} verb on {granted}{sub})"
            )
        if exc.status == 404:
            return ResourceAccessError(f"{what}: 404 Not Found: {message} ({self.not_found_hint})")
        if exc.status == 401:
            fix = (
                "check the service account token is mounted, current and not revoked"
                if self.in_cluster and self.reloadable else "check the credentials"
            )
            again = ", read again after a first 401" if self.reloadable else ""
            return ResourceAccessError(f"{what}: 401 Unauthorized: {message} (auth from {self.auth_source}{again}; {fix})")
        if exc.status in (429, 500, 502, 503, 504):
            return ConnectorUnavailableError(f"{what} while {doing}: HTTP {exc.status}: {message}")
        return ConnectorError(f"{what} while {doing}: HTTP {exc.status}: {message}")

    def _auth_source(self) -> str:
        """The credentials' origin, for error messages: in-cluster token file or kubeconfig (and context)."""
        if self.in_cluster:
            return (
                f"the in-cluster service account (token {incluster_config.SERVICE_TOKEN_FILENAME}, "
                f"CA {incluster_config.SERVICE_CERT_FILENAME})"
            )
        return f"kubeconfig {self.kubeconfig_path or os.environ.get('KUBECONFIG') or '~/.kube/config'}" + (
            f" context {self.kubeconfig_context!r}" if self.kubeconfig_context else ""
        )

    def _make_api_client(self) -> k8s_client.ApiClient:
        try:
            if self.in_cluster:
                configuration = k8s_client.Configuration()
                # The official loader re-reads the (kubelet-rotated) token file at most a minute
                # after it changes, through the refresh hook it sets on this configuration.
                k8s_config.load_incluster_config(client_configuration=configuration, try_refresh_token=True)
                return k8s_client.ApiClient(configuration)
            return k8s_config.new_client_from_config(config_file=self.kubeconfig_path, context=self.kubeconfig_context)
        except (ConfigException, OSError) as exc:
            raise ConnectorError(f"Kubernetes auth from {self.auth_source} failed: {exc}") from exc

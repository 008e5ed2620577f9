"""The connector factory: the backend a connector config names, built.

The connectors themselves are imported only when their kind is asked for, so a
planner on the local connector never loads the Kubernetes client.
"""

from __future__ import annotations

from connectors.base import Connector
from connectors.config import ConnectorConfig


def make_connector(config: ConnectorConfig, *, default_namespace: str = "default") -> Connector:
    """Build the connector a config describes.

    default_namespace: used when the config leaves `namespace` unset (the
    planner config's namespace).
    """
    kind = config.kind
    if kind == "kubernetes":
        from connectors.kubernetes import KubernetesConnector

        return KubernetesConnector(config, default_namespace=default_namespace)
    if kind == "llmd":
        from connectors.llmd import LlmdConnector

        return LlmdConnector(config, default_namespace=default_namespace)
    if kind == "virtual":
        from connectors.virtual import VirtualConnector

        return VirtualConnector(config, default_namespace=default_namespace)
    if kind == "local":
        from connectors.local import LocalConnector

        return LocalConnector(config)
    raise ValueError(f"connector.kind: expected kubernetes, llmd, virtual or local, got {kind!r}")

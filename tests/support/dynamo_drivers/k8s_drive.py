"""Dynamo 1.6.1's own KubernetesConnector, unmodified, through the calls its planner makes.

usage: python k8s_drive.py NAMESPACE   (KUBECONFIG and DYN_PARENT_DGD_K8S_NAME in the environment)
Validates, reads counts and inventory, scales prefill to 3 and decode to 2 (not blocking), reads the
prefill target back and the counts again (the calls, in order, of the kit's recording); prints one JSON line per call with what it returned.
"""

import asyncio
import json
import sys

from dynamo.planner.config.defaults import SubComponentType, TargetReplica
from dynamo.planner.connectors.kubernetes import KubernetesConnector


def emit(step: str, value) -> None:
    print(json.dumps({"step": step, "value": value}, default=str), flush=True)


async def main(namespace: str) -> None:
    connector = KubernetesConnector("dynamo", k8s_namespace=namespace)
    await connector.validate_deployment()
    emit("validate_deployment", None)
    emit("get_model_name", connector.get_model_name())
    emit("get_actual_worker_counts", await connector.get_actual_worker_counts("prefill", "decode"))
    emit("get_worker_inventory", await connector.get_worker_inventory("prefill", "decode"))
    await connector.set_component_replicas(
        [TargetReplica(sub_component_type=SubComponentType.PREFILL, desired_replicas=3),
         TargetReplica(sub_component_type=SubComponentType.DECODE, desired_replicas=2)], blocking=False)
    emit("set_component_replicas", None)
    emit("get_service_replica_target", connector.kube_api.get_service_replica_target(
        connector.graph_deployment_name, "prefill"))
    emit("get_actual_worker_counts", await connector.get_actual_worker_counts("prefill", "decode"))


asyncio.run(main(sys.argv[1]))

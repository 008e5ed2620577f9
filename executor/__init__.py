"""The fleet executor: carries out the planner's virtual-connector decisions on local worker processes.

For fleets without Kubernetes: it watches Dynamo's decision keys with Dynamo's
own VirtualConnectorClient, starts and drains worker processes (a command
template per role: mocker, vLLM, SGLang), waits for them to register in
Dynamo's discovery, and acknowledges. `reconcile` is the pure part; `workers`
the processes; `run` the loop (Dynamo environment only).
"""

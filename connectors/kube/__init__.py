"""Kubernetes as the connectors see it: the API session, and the objects they read and write (a DGD, an llm-d InferencePool's model servers, KEDA ScaledObjects, the decision annotations)."""

"""`sla-planner import`: another autoscaler's settings (Dynamo's planner, llm-d's WVA and KEDA objects) as our run configuration."""

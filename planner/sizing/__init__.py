"""Replicas each pool needs at the forecast load: the SLA mode and Dynamo's mode."""

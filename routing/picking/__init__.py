"""Picking endpoints for a request: SLO-aware, topology-aware choice and its outcome."""

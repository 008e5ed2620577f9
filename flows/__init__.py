"""Prefect flows: each reads top to bottom as its steps and ends with artifacts."""

"""Serving latency models: the published document, validated and compiled, stored, calibrated online, and the predictor."""

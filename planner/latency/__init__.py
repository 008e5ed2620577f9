"""Latency models: the measured profiles, the TTFT view sizing reads, queueing over a pool, correction factors."""

"""llm-d's latency-predictor API: the routes an EPP calls on its prediction and training sidecars, answered
from the routing service's own models and samples, on a listener of its own."""

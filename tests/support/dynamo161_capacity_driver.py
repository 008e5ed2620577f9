"""Run in .venv-dynamo by tests/planner/sizing/test_dynamo161_sizing.py: Dynamo 1.6.1's own capacity functions on given inputs.

Reads a JSON list of {rps, isl, osl, ttft_ms, itl_ms} on stdin; fits Dynamo 1.6.1's forward-pass regressions
(dynamo/planner/core/perf_model/prefill.py and decode.py) on the profile folder argv[1] converted to forward-pass
metrics by Dynamo's own converter (monitoring/perf_metrics.py), and prints per input the replicas its throughput
scaling sets (ceil(demand rps / engine rps), throughput_scaling.py) with the engine rates and latencies behind them.
"""

import json
import logging
import math
import sys

import numpy as np
from dynamo.planner.config.defaults import SubComponentType
from dynamo.planner.core.perf_model.decode import DecodeRegressionModel
from dynamo.planner.core.perf_model.prefill import PrefillRegressionModel
from dynamo.planner.monitoring.perf_metrics import _convert_profiling_data_to_fpms

logging.disable(logging.CRITICAL)  # its "SLA unreachable" warnings: the outputs carry the latencies

profile_dir = sys.argv[1]
max_kv = int(np.load(profile_dir + "/selected_decode_interpolation/raw_data.npz")["max_kv_tokens"][0])
prefill = PrefillRegressionModel(4096, min_observations=1)
prefill.load_benchmark_fpms(_convert_profiling_data_to_fpms(profile_dir, SubComponentType.PREFILL))
decode = DecodeRegressionModel(4096, min_observations=1)
decode.load_benchmark_fpms(_convert_profiling_data_to_fpms(profile_dir, SubComponentType.DECODE))
out = []
for x in json.load(sys.stdin):
    p_rps, p_ttft = prefill.find_best_engine_prefill_rps(x["ttft_ms"], x["isl"])
    d_rps, d_itl = decode.find_best_engine_decode_rps(x["itl_ms"], x["isl"] + x["osl"] / 2, x["osl"],
                                                      max_kv_tokens=max_kv)
    out.append(dict(prefill=max(math.ceil(x["rps"] / p_rps), 1), decode=max(math.ceil(x["rps"] / d_rps), 1),
                    prefill_engine_rps=p_rps, prefill_ttft_ms=p_ttft, decode_engine_rps=d_rps, decode_itl_ms=d_itl))
print(json.dumps(out))

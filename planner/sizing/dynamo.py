"""Dynamo 1.0.2's sizing mode (sizing.mode "dynamo-1.0.2"): its throughput formulas, verbatim.

Dynamo 1.6.1 sizes differently: a capacity search over a forward-pass time model fitted from the profile
(dynamo/planner/core/throughput_scaling.py, core/perf_model/engine_query.py); docs/sizing.md says where the two
part. This mode is the 1.0.2 planner's and is named for it ("dynamo", its old name, is a deprecated alias).

Both pools are sized for 100% of profiled throughput, and prefill ignores the
TTFT target:
    prefill = ceil(req * isl / interval * min(1, prefill_corr)
                   / prefill_thpt_per_gpu(isl) / gpus_per_prefill_engine)
    decode  = ceil(req * osl / interval
                   / best_decode_thpt_per_gpu(itl_target / decode_corr, isl + osl/2)
                   / gpus_per_decode_engine)
"""

from __future__ import annotations

from planner.latency.decode_profile import DecodeOperatingPoint
from planner.latency.queueing import ceil_replicas
from planner.types import PoolSizing, SizingLoad


def dynamo_prefill(load: SizingLoad, *, throughput_per_gpu: float, numbers: dict[str, float]) -> PoolSizing:
    """Prefill replicas for the load's prompt tokens at the profiled throughput (tokens/s/GPU) at its ISL.

    numbers: the dispatcher's figures; this mode's are added to them.
    """
    rps, isl, thpt = load.rps, load.isl_tokens, throughput_per_gpu
    load_tps = rps * isl
    used = min(1.0, load.correction)
    raw = load_tps * used / thpt / load.gpus_per_engine
    replicas = max(1, ceil_replicas(raw))
    numbers.update(correction_used=used, raw_replicas=raw, utilization_frac=raw / replicas)
    msg = (
        f"dynamo: {rps:.3g} rps x {isl:.0f} tokens x {used:.2f} = {load_tps * used:.4g} tokens/s "
        f"/ {thpt:.4g} tokens/s/GPU / {load.gpus_per_engine} GPU = {raw:.2f} -> {replicas}"
    )
    return PoolSizing("prefill", replicas, numbers, msg)


def dynamo_decode(
    load: SizingLoad, *, op: DecodeOperatingPoint, corrected_itl_ms: float, numbers: dict[str, float]
) -> PoolSizing:
    """Decode replicas for the load's output tokens at the best throughput meeting the corrected ITL target.

    op: the profile's best operating point at corrected_itl_ms (ms).
    numbers: the dispatcher's figures; this mode's are added to them.
    """
    rps, osl = load.rps, load.osl_tokens
    out_tps = rps * osl
    context = load.isl_tokens + osl / 2.0
    raw = out_tps / op.throughput_per_gpu / load.gpus_per_engine
    replicas = max(1, ceil_replicas(raw))
    numbers.update(
        throughput_per_gpu=op.throughput_per_gpu,
        op_kv_usage_frac=op.kv_usage_frac,
        op_itl_ms=op.itl_ms,
        target_reachable=float(op.meets_target),
        raw_replicas=raw,
    )
    msg = (
        f"dynamo: {rps:.3g} rps x {osl:.0f} tokens = {out_tps:.4g} tokens/s / {op.throughput_per_gpu:.4g} "
        f"tokens/s/GPU at ITL {corrected_itl_ms:.3g} ms / {load.gpus_per_engine} GPU = {raw:.2f} -> {replicas}"
    )
    if not op.meets_target:
        msg += f" (ITL target unreachable: best {op.itl_ms:.3g} ms at context {context:.0f})"
    return PoolSizing("decode", replicas, numbers, msg)

"""Training-sample store (bounded, coverage-keeping eviction, paging) and the shared feature definition."""

from __future__ import annotations

import numpy as np
import pytest

from routing.features import FEATURES, RAW_FIELDS, TPOT_FEATURES, TTFT_FEATURES, feature_matrix, features_from_samples
from routing.registry import Sample
from routing.samples import SampleStore, load_bucket


def sample(rid: str, *, kv=0.05, waiting=0, target="ttft", role="prefill", observed=100.0) -> Sample:
    feats = {f: 0.0 for f in RAW_FIELDS} | {"kv_usage_frac": kv, "waiting_requests": waiting, "input_tokens": 100.0}
    return Sample(target=target, request_id=rid, endpoint_id="e0", role=role, features=feats,
                  observed_ms=observed, predicted_ms=None, model_version=None, recorded_at_s=0.0)


@pytest.mark.parametrize("kv, waiting, expected", [
    pytest.param(0.0, 0, ("ttft", "prefill", 0, 0), id="kv 0 -> bucket 0, no queue"),
    pytest.param(0.95, 3, ("ttft", "prefill", 9, 2), id="kv 0.95 -> 9; waiting 3 in [2,4) -> 2"),
    pytest.param(1.0, 8, ("ttft", "prefill", 9, 4), id="kv 1.0 clamps to 9; waiting 8+ -> 4"),
])
def test_load_bucket(kv, waiting, expected):
    assert load_bucket(sample("r", kv=kv, waiting=waiting), kv_buckets=10) == expected


def test_full_store_evicts_oldest_of_the_largest_bucket():
    store = SampleStore(capacity=10)
    store.add(sample("rare", kv=0.95))  # the only high-load sample
    for k in range(9):
        store.add(sample(f"low{k}", kv=0.05))
    for k in range(9, 14):
        store.add(sample(f"low{k}", kv=0.05))
    kept = [s["request_id"] for s in store.page(limit=100).samples]
    assert len(kept) == 10 and "rare" in kept
    assert kept[1:] == [f"low{k}" for k in range(5, 14)]  # low0..low4 evicted, oldest first
    assert store.stats()["evicted_total"] == 5
    assert store.bucket_counts() == {("ttft", "prefill", 0, 0): 9, ("ttft", "prefill", 9, 0): 1}


def test_balanced_buckets_share_capacity():
    store = SampleStore(capacity=30, kv_buckets=10)
    rng = np.random.default_rng(0)
    for k in range(3000):
        # 90% of traffic at low load, the rest spread over high-load buckets.
        kv = 0.05 if rng.random() < 0.9 else rng.uniform(0.5, 1.0)
        store.add(sample(f"r{k}", kv=kv))
    counts = store.bucket_counts()
    assert len(store) == 30
    assert len(counts) == 6  # buckets 0, 5, 6, 7, 8, 9 all kept
    # Evict-then-add: the bucket just added to may sit one above the evicted one.
    assert max(counts.values()) - min(counts.values()) <= 2


def test_paging_with_a_cursor_across_evictions():
    store = SampleStore(capacity=5)
    for k in range(5):
        store.add(sample(f"r{k}", target="ttft" if k % 2 == 0 else "tpot", role="prefill" if k % 2 == 0 else "decode"))
    first = store.page(after_seq=0, limit=2)
    assert [s["seq"] for s in first.samples] == [1, 2] and first.next_after_seq == 2 and first.has_more
    for k in range(5, 8):
        store.add(sample(f"r{k}"))  # evicts the oldest ttft/prefill samples (largest bucket)
    rest = store.page(after_seq=first.next_after_seq, limit=100)
    assert [s["seq"] for s in rest.samples] == [4, 6, 7, 8] and not rest.has_more
    only_tpot = store.page(after_seq=0, limit=100, target="tpot")
    assert [s["seq"] for s in only_tpot.samples] == [2, 4]
    assert set(rest.samples[0]) >= {"seq", "target", "features", "observed_ms", "recorded_at_s", "role"}


def test_store_refuses_bad_samples():
    store = SampleStore(capacity=5)
    with pytest.raises(ValueError, match="observed_ms must be finite"):
        store.add(sample("r", observed=float("nan")))
    bad = sample("r")
    bad.features["kv_usage_frac"] = -1.0
    with pytest.raises(ValueError, match="feature kv_usage_frac must be finite and >= 0, got -1.0"):
        store.add(bad)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        store.page(limit=0)


def test_feature_lists_are_ordered_and_ttft_is_a_prefix_of_tpot():
    assert TTFT_FEATURES == TPOT_FEATURES[: len(TTFT_FEATURES)]
    assert TPOT_FEATURES[-1] == "tokens_generated"
    assert FEATURES["ttft"][:3] == ("input_tokens", "prefix_cache_hit_frac", "kv_usage_frac")


def test_feature_matrix_columns():
    x = feature_matrix("tpot", input_tokens=[100, 200], prefix_cache_hit_frac=0.5, kv_usage_frac=0.25,
                       waiting_requests=1, running_requests=2, prefill_tokens_in_flight=300,
                       decode_tokens_in_flight=400, role=["decode", "aggregated"], tokens_generated=[0, 7])
    np.testing.assert_array_equal(x, [[100, 0.5, 0.25, 1, 2, 300, 400, 0, 1, 0, 0],
                                      [200, 0.5, 0.25, 1, 2, 300, 400, 0, 0, 1, 7]])


@pytest.mark.parametrize("field, value, message", [
    pytest.param("kv_usage_frac", float("nan"), "feature kv_usage_frac: row 0 must be finite", id="NaN"),
    pytest.param("waiting_requests", -1.0, "feature waiting_requests: row 0 must be finite and >= 0", id="negative"),
    pytest.param("role", "router", "role must be one of", id="unknown role"),
])
def test_feature_matrix_refuses_bad_values(field, value, message):
    args = {f: 0.0 for f in RAW_FIELDS if f != "tokens_generated"} | {"role": "prefill"}
    args[field] = value
    with pytest.raises(ValueError, match=message):
        feature_matrix("ttft", **args)


def test_features_from_samples_names_a_missing_field():
    good = {f: 1.0 for f in RAW_FIELDS} | {"role": "decode"}
    assert features_from_samples("tpot", [good]).shape == (1, len(TPOT_FEATURES))
    broken = dict(good)
    del broken["waiting_requests"]
    with pytest.raises(ValueError, match=r"samples\[1\]: missing feature field 'waiting_requests'"):
        features_from_samples("tpot", [good, broken])

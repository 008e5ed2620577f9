"""Training-sample store (bounded, coverage-keeping eviction, paging) and the shared feature definition."""

from __future__ import annotations

import numpy as np
import pytest

from routing.features import (
    FEATURE_SET_VERSION,
    FEATURE_SETS,
    FEATURES,
    RAW_FIELDS,
    TPOT_FEATURES,
    TTFT_FEATURES,
    columns_of,
    feature_matrix,
    features_from_samples,
)
from routing.fleet.requests import Sample
from routing.samples.format import SCHEMA_VERSION
from routing.samples.store import SampleStore, load_bucket


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
                       decode_tokens_in_flight=400, prefill_batch_tokens=120, prefill_batch_elapsed_ms=35,
                       prefill_queued_tokens=180, role=["decode", "aggregated"], tokens_generated=[0, 7])
    np.testing.assert_array_equal(x, [[100, 0.5, 0.25, 1, 2, 300, 400, 120, 35, 180, 0, 1, 0, 0],
                                      [200, 0.5, 0.25, 1, 2, 300, 400, 120, 35, 180, 0, 0, 1, 7]])


def test_feature_matrix_names_missing_and_unknown_fields():
    args = {f: 0.0 for f in RAW_FIELDS if f not in ("tokens_generated", "prefill_batch_tokens")}
    with pytest.raises(ValueError, match=r"missing fields \['prefill_batch_tokens'\], unknown fields \['queue_age_s'\]"):
        feature_matrix("ttft", role="prefill", queue_age_s=1.0, **args)


def test_every_older_feature_set_is_served_from_current_columns():
    for version, lists in FEATURE_SETS.items():
        for target, names in lists.items():
            cols = columns_of(names, target)
            assert [FEATURES[target][c] for c in cols] == list(names), (version, target)
    assert FEATURE_SETS[FEATURE_SET_VERSION] == FEATURES


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


# -- persistence (SQLite file) -------------------------------------------------------------


def _pages(store) -> list[dict]:
    return store.page(after_seq=0, limit=10_000).samples


def test_restart_keeps_samples_cursor_and_counters(tmp_path):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=4, path=path)
    store.add(sample("rare", kv=0.95))
    for k in range(5):
        store.add(sample(f"low{k}", kv=0.05))  # 6 added into 4 slots: low0, low1 evicted
    before = _pages(store)
    store.close()
    again = SampleStore(capacity=4, path=path)
    assert _pages(again) == before  # same seqs, features, latencies, ids
    assert [s["request_id"] for s in before] == ["rare", "low2", "low3", "low4"]
    assert again.stats() == store.stats()
    assert (again.stats()["added_total"], again.stats()["evicted_total"], again.stats()["last_seq"]) == (6, 2, 6)
    # Sequence numbers continue after the restart (a reader's cursor stays valid).
    assert again.add(sample("after")) == 7
    assert [s["seq"] for s in again.page(after_seq=6).samples] == [7]
    again.close()
    # The eviction that add made (the oldest low-load sample, seq 3) reached the file too.
    third = SampleStore(capacity=4, path=path)
    assert [s["request_id"] for s in _pages(third)] == ["rare", "low3", "low4", "after"]
    third.close()


def test_smaller_capacity_at_restart_evicts_by_bucket_and_shrinks_the_file(tmp_path):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=10, path=path)
    store.add(sample("rare", kv=0.95))
    for k in range(9):
        store.add(sample(f"low{k}", kv=0.05))
    store.close()
    small = SampleStore(capacity=4, path=path)
    # 10 rows into 4 slots: the largest bucket (low load) loses its oldest 6; the rare one stays.
    assert [s["request_id"] for s in _pages(small)] == ["rare", "low6", "low7", "low8"]
    assert small.stats()["evicted_total"] == 6
    small.close()
    assert [s["request_id"] for s in _pages(SampleStore(capacity=100, path=path))] == ["rare", "low6", "low7", "low8"]


@pytest.mark.parametrize("content", [
    pytest.param(b"this is not a database\n" * 10, id="not SQLite"),
    pytest.param(b"SQLite format 3\x00" + b"\xff" * 200, id="damaged header"),
])
def test_unreadable_file_is_moved_aside_and_the_store_starts_empty(tmp_path, caplog, content):
    path = tmp_path / "samples.sqlite3"
    path.write_bytes(content)
    with caplog.at_level("WARNING", logger="routing.samples.store"):
        store = SampleStore(capacity=5, path=path)
    assert len(store) == 0 and store.add(sample("r")) == 1
    aside = list(tmp_path.glob("samples.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content  # kept, byte for byte
    assert f"sample store {path} is unreadable" in caplog.text and str(aside[0]) in caplog.text
    store.close()
    assert [s["request_id"] for s in _pages(SampleStore(capacity=5, path=path))] == ["r"]


def test_file_with_foreign_tables_is_moved_aside(tmp_path, caplog):
    import sqlite3

    path = tmp_path / "samples.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE something_else (x)")
    with caplog.at_level("WARNING", logger="routing.samples.store"):
        store = SampleStore(capacity=5, path=path)
    assert len(store) == 0 and "tables ['something_else']" in caplog.text
    store.close()


def test_file_from_a_newer_schema_is_refused_not_discarded(tmp_path):
    import sqlite3

    path = tmp_path / "samples.sqlite3"
    SampleStore(capacity=5, path=path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ValueError, match=rf"sample store {path}: schema_version 99 is newer than this router's {SCHEMA_VERSION}"):
        SampleStore(capacity=5, path=path)
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_samples_from_an_older_feature_set_are_dropped_with_a_warning(tmp_path, caplog):
    import json
    import sqlite3

    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=5, path=path)
    store.add(sample("r0"))
    store.add(sample("r1"))
    store.close()
    old_fields = [f for f in RAW_FIELDS if not f.startswith("prefill_batch")]
    with sqlite3.connect(path) as db:  # as a router before the prefill-batch fields wrote it
        db.execute("UPDATE meta SET value = ? WHERE key = 'raw_fields'", (json.dumps(old_fields),))
        db.execute("UPDATE samples SET features = ?", (np.zeros(len(old_fields)).tobytes(),))
        _as_schema_1(db)
    with caplog.at_level("WARNING", logger="routing.samples.store"):
        again = SampleStore(capacity=5, path=path)
    assert len(again) == 0 and "2 stored samples lack current feature fields" in caplog.text
    assert again.add(sample("new")) == 3  # sequence numbers still never repeat
    again.close()


def test_stored_features_are_matched_by_name(tmp_path):
    import json
    import sqlite3

    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=5, path=path)
    store.add(sample("r", kv=0.25, waiting=3))
    store.close()
    # A file whose fields are in another order (and one extra the router no longer uses).
    fields = ["extra_field"] + list(reversed(RAW_FIELDS))
    values = {f: float(i) for i, f in enumerate(RAW_FIELDS)} | {"extra_field": 123.0}
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'raw_fields'", (json.dumps(fields),))
        db.execute("UPDATE samples SET features = ?", (np.array([values[f] for f in fields]).tobytes(),))
        _as_schema_1(db)
    again = SampleStore(capacity=5, path=path)
    (got,) = _pages(again)
    assert got["features"] == {f: float(i) for i, f in enumerate(RAW_FIELDS)}
    # The file is rewritten in the current layout, so rows added now read back the same way.
    again.add(sample("next", kv=0.5))
    again.close()
    reread = _pages(SampleStore(capacity=5, path=path))
    assert reread[0]["features"] == got["features"] and reread[1]["features"]["kv_usage_frac"] == 0.5


def test_unclosed_store_reaches_the_file_within_the_flush_interval(tmp_path):
    import time

    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=5, path=path, flush_interval_s=0.05)
    store.add(sample("r0"))
    store.add(sample("r1"))
    deadline = time.monotonic() + 5.0
    while True:  # as if the process were killed now: another reader opens the file
        seen = _file_ids(path)
        if seen == ["r0", "r1"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert seen == ["r0", "r1"]
    store.close()


def _as_schema_1(db) -> None:
    """Make a file edited by hand look as a schema-1 router wrote it (no row checksums)."""
    db.execute("ALTER TABLE samples DROP COLUMN crc")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")


def _file_ids(path) -> list[str]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return [r[0] for r in db.execute("SELECT request_id FROM samples ORDER BY seq")]


def test_a_batch_is_written_at_flush_rows(tmp_path):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=10, path=path, flush_interval_s=3600, flush_rows=3)
    store.add(sample("r0"))
    store.add(sample("r1"))
    assert _file_ids(path) == []  # 2 waiting < flush_rows 3
    store.add(sample("r2"))
    assert _file_ids(path) == ["r0", "r1", "r2"]
    store.close()


def test_samples_evicted_before_their_batch_are_never_written(tmp_path):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=2, path=path, flush_interval_s=3600, flush_rows=100)
    for k in range(5):  # r0, r1, r2 evicted in memory while still waiting to be written
        store.add(sample(f"r{k}"))
    store.flush()
    assert _file_ids(path) == ["r3", "r4"] == [s["request_id"] for s in _pages(store)]
    store.add(sample("r5"))  # evicts r3, which is in the file now: a delete in the next batch
    store.close()
    assert _file_ids(path) == ["r4", "r5"]

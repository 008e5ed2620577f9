"""The share of requests that met the TTFT target, from a frontend TTFT histogram (planner.signals.slo_attainment)."""

import numpy as np
import pytest

from planner.signals.slo_attainment import DYNAMO_TTFT_BOUNDS_S, share_within, ttft_histogram_of
from planner.types import LatencyHistogram

# Bounds 0.1, 0.22, 0.47 s; 10 requests <= 0.1 s, 20 more <= 0.22 s, 10 more <= 0.47 s, 10 above.
H = LatencyHistogram((0.1, 0.22, 0.47), (10.0, 30.0, 40.0, 50.0))


@pytest.mark.parametrize(
    "hist, target_s, share, bucket, bracket",
    [
        pytest.param(H, 0.22, 30 / 50, (0.1, 0.22), (10 / 50, 30 / 50), id="on a bound: exactly its count"),
        pytest.param(H, 0.05, 10 * 0.5 / 50, (0.0, 0.1), (0.0, 10 / 50), id="below the first bound: linear from 0"),
        pytest.param(H, 0.0, 0.0, (0.0, 0.1), (0.0, 10 / 50), id="target 0"),
        pytest.param(H, 2.0, 40 / 50, (0.47, float("inf")), (40 / 50, 1.0),
                     id="past the last bound: the share below it, a lower bound"),
        pytest.param(LatencyHistogram((0.0, 0.1), (0.0, 8.0, 10.0)), 0.05, 0.4, (0.0, 0.1), (0.0, 0.8),
                     id="one positive bound: no curve, linear"),
        pytest.param(LatencyHistogram((0.1, 0.22, 0.47), (10.0, 10.0, 40.0, 50.0)), 0.2, 0.2, (0.1, 0.22), (0.2, 0.2),
                     id="an empty bucket: its bounds' share"),
    ],
)
def test_share_within_reads_the_bucket_holding_the_target(hist, target_s, share, bucket, bracket):
    got = share_within(hist, target_s)
    assert got.share == pytest.approx(share) and got.bucket_s == bucket and got.requests == hist.count
    assert (got.at_least, got.at_most) == pytest.approx(bracket)


def test_inside_a_bucket_the_share_lies_between_its_bounds_shares_and_rises_with_the_target():
    shares = [share_within(H, t).share for t in np.linspace(0.101, 0.219, 25)]
    assert all(0.2 < s < 0.6 for s in shares) and shares == sorted(shares)


def test_an_empty_histogram_has_no_share_and_a_bad_target_is_named():
    assert share_within(LatencyHistogram((0.1, 0.22), (0.0, 0.0, 0.0)), 0.2) is None
    with pytest.raises(ValueError, match="target must be >= 0 s"):
        share_within(H, -0.1)
    with pytest.raises(ValueError, match="latency histogram: need one count per bound"):
        LatencyHistogram((0.1, 0.22), (1.0, 2.0))
    with pytest.raises(ValueError, match="bounds must rise"):
        LatencyHistogram((0.22, 0.1), (1.0, 2.0, 3.0))


@pytest.mark.parametrize("shape", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("scale_s", [0.05, 0.1, 0.15, 0.4])
def test_through_dynamos_buckets_the_share_is_close_to_the_exact_one(shape, scale_s):
    """Gamma TTFTs counted into Dynamo 1.6.1's buckets: 200 ms, read within the 0.1-0.22 s bucket.

    The curve lands within 6% of that bucket's requests of the exact share; an even
    spread within the bucket (histogram_quantile's reading) is off by up to 15% of them.
    """
    ttft = np.random.default_rng(0).gamma(shape, scale_s / shape, 20_000)
    got = share_within(ttft_histogram_of(ttft), 0.2)
    exact = float(np.mean(ttft <= 0.2))
    in_bucket = float(np.mean((ttft > 0.1) & (ttft <= 0.22)))
    assert got.bucket_s == (0.1, 0.22) and got.requests == 20_000
    assert got.at_least <= exact <= got.at_most
    assert abs(got.share - exact) <= 0.06 * in_bucket + 1e-9
    assert ttft_histogram_of(ttft).upper_bounds_s == DYNAMO_TTFT_BOUNDS_S


@pytest.mark.parametrize("metric, target_s, exact_bound", [
    ("vllm:time_to_first_token_seconds", 0.2, False),
    ("vllm:inter_token_latency_seconds", 0.01, True),
])
def test_a_vllm_engines_own_histograms_read_the_same_way(metric, target_s, exact_bound):
    """Plain vLLM pools (no Dynamo frontend): the engine's histograms from a real Dynamo 1.6.1 vLLM decode worker.

    vLLM's ITL buckets have a bound at 10 ms, so that target reads exactly; 200 ms falls between its TTFT bounds.
    """
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    from planner.signals.histograms import cumulative_buckets

    scrape = Path(__file__).resolve().parents[4] / "shared" / "dynamo" / "worker-metrics-decode.txt"
    buckets = {s.labels["le"]: s.value for fam in text_string_to_metric_families(scrape.read_text())
               for s in fam.samples if s.name == f"{metric}_bucket"}
    h = LatencyHistogram(*cumulative_buckets(buckets))
    got = share_within(h, target_s)
    assert got.requests == buckets["+Inf"] > 0 and got.at_least <= got.share <= got.at_most
    if exact_bound:
        assert got.bucket_s[1] == target_s and got.share == got.at_most == buckets["0.01"] / buckets["+Inf"]
    else:
        assert got.bucket_s[0] < target_s < got.bucket_s[1]

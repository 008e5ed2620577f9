"""The live fleet's config file: the SLO's spelling, old and new."""

import pytest

from sim.live.config import load_config

BASE = "trace_path: t.csv\nprofile_dir: p\n"


@pytest.mark.parametrize("slo_yaml, ttft_ms, itl_ms", [
    pytest.param("ttft_ms: 150\nitl_ms: 7\n", 150.0, 7.0, id="current spelling"),
    pytest.param("slo_ttft_ms: 150\nslo_tpot_ms: 7\n", 150.0, 7.0, id="deprecated spelling still accepted"),
    pytest.param("", 200.0, 10.0, id="defaults: 200 ms TTFT, 10 ms ITL"),
])
def test_slo_spellings(tmp_path, slo_yaml, ttft_ms, itl_ms):
    path = tmp_path / "live.yaml"
    path.write_text(BASE + slo_yaml)
    cfg = load_config(path)
    assert (cfg.ttft_ms, cfg.itl_ms) == (ttft_ms, itl_ms)


def test_unknown_field_is_refused(tmp_path):
    path = tmp_path / "live.yaml"
    path.write_text(BASE + "tpot_ms: 7\n")
    with pytest.raises(ValueError, match="tpot_ms"):
        load_config(path)

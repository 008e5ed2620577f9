"""sim.live.loadgen's pure parts: prompts of a given length that share no prefix."""

from __future__ import annotations

import pytest

from sim.live.loadgen import WORDS, LoadGenConfig, PromptBuilder, load_config, random_words


def test_prompts_are_deterministic_and_share_no_prefix():
    a, b = random_words(400, seed=1), random_words(400, seed=2)
    assert a == random_words(400, seed=1)
    assert a.split()[:8] != b.split()[:8]  # an engine's prefix cache (blocks of 16+ tokens) finds nothing
    assert set(a.split()) <= set(WORDS)


@pytest.mark.parametrize("overhead, per_word, tokens, words", [
    (13, 1.0, 1013, 1000),
    (13, 1.25, 1013, 800),
    (13, 1.0, 5, 0),  # shorter than the chat template: the empty prompt
])
def test_prompt_length_follows_the_calibration(overhead, per_word, tokens, words):
    builder = PromptBuilder(overhead, per_word)
    assert builder.words_for(tokens) == words
    assert len(builder.prompt(tokens, seed=0).split()) == words


def test_a_tokenizer_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="calibration: a word costs 0.0 tokens"):
        PromptBuilder(13, 0.0)


def test_independent_tenants_by_default_and_bad_config_in_one_line(tmp_path):
    assert LoadGenConfig(url="http://x", model="m", out_dir="o", trace_path="t").jitter_s == 30.0
    path = tmp_path / "loadgen.yaml"
    path.write_text("url: http://x\nmodel: m\nout_dir: o\ntrace_path: t\nload_multiplier: -1\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: load_multiplier: ") and "\n" not in str(info.value)


def test_a_cross_field_check_is_one_line_without_pydantics_prefix(tmp_path):
    path = tmp_path / "loadgen.yaml"
    path.write_text("url: http://x\nmodel: m\nout_dir: o\ntrace_path: t\nload_multiplier: 2\n"
                    "shape: [{duration_s: 60, load_multiplier: 1}]\n")
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: (top level): shape replaces trace_duration_s and load_multiplier: "
                               "set one or the other")
